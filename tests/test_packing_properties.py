"""Packing what recall returns never raises, whatever was stored and whatever is asked."""

from __future__ import annotations

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soul_runtime.loop.context import line_tokens, pack_memory
from soul_runtime.loop.excerpt import excerpt, query_weights
from soul_runtime.records import RecalledItem

CODE = ("```python\ndef determine_severity(trade_loss_percentage: float, system_error_count: int) -> str:\n"
        "    for severity, (low, high) in TRADE_LOSS_THRESHOLDS.items():\n"
        "        if low <= trade_loss_percentage <= high:\n            return severity\n"
        "    for severity, threshold in SYSTEM_ERROR_THRESHOLDS.items():\n"
        "        if system_error_count >= threshold:\n            return severity\n    return 'info'\n```")

_pieces = st.one_of(
    st.text(min_size=0, max_size=60),
    st.text(alphabet=string.ascii_letters + "_.", min_size=20, max_size=300),  # identifiers longer than a window
    st.sampled_from(["\n", "\n\n", "```", "| a | b |\n|---|---|\n| 1 | 2 |", ". ", "->", "\t", "…", CODE]),
    st.from_regex(r"[a-z_]{1,40}=\d{1,12}", fullmatch=True),
)
texts = st.lists(_pieces, min_size=1, max_size=12).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(texts, min_size=1, max_size=6), texts, st.integers(min_value=0, max_value=3000))
def test_pack_memory_never_raises_and_keeps_to_the_budget(stored: list[str], question: str, budget: int) -> None:
    items = [RecalledItem("episodic", f"ep-{i}", t, 1.0 / (i + 1), (f"m{i}",), 1_700_000_000.0)
             for i, t in enumerate(stored)]
    packed = pack_memory(items, budget, 1_700_100_000.0, question)
    assert sum(line_tokens(line) for _, line in packed) <= budget
    assert all(it in items for it, _ in packed)


@settings(max_examples=150, deadline=None)
@given(texts, texts, st.integers(min_value=1, max_value=400))
def test_an_excerpt_never_raises_and_never_exceeds_its_room(text: str, question: str, limit: int) -> None:
    weights = query_weights(question, [text])
    got = excerpt(text, weights, limit)
    if got is not None:
        assert len(got) <= limit + 2 * len(" \u2026 ") + 2


def test_a_code_unit_asked_about_with_a_word_longer_than_the_window_is_packed() -> None:
    question = ("How did my discussions about microservices communication evolve throughout our conversations in "
                "order? Mention ONLY and ONLY ten items.")
    packed = pack_memory([RecalledItem("episodic", "ep-1", CODE, 0.5, ("m1",))], 1000, 0.0, question)
    assert [it.id for it, _ in packed] == ["ep-1"]
    long_word = ".".join(["trade_loss_percentage"] * 4)  # one word of 87 characters holding the asked term
    weights = query_weights("trade_loss_percentage", [long_word])
    assert weights
    got = excerpt(f"{long_word}\nx", weights, 30)
    assert got is None or len(got) <= 30
