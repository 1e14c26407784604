"""Model-made writes never fail the caller: the fitting rule, and long technical messages through ``observe``
and ``turn`` on every shipped model (offline; Claude through the real SDK against the local Messages API
stand-in answering with over-long tool input)."""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soul_apps.bench.messages_api import MessagesApiServer, Scripted, text_message, tool_message
from soul_runtime.config import SoulConfig, TurnConfig
from soul_runtime.errors import InvalidInput
from soul_runtime.loop.fit import clip, fit_extraction, fit_request
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.base import LanguageModel
from soul_runtime.models.claude import AnthropicModel
from soul_runtime.models.offline import OfflineModel
from soul_runtime.records import Extraction, FactCandidate, TaskReport, WriteRequest
from soul_runtime.text import WRITE_LIMITS, check_write_request
from tests.fakes import HashEmbedder

T0 = 1_780_000_000.0
MAX_CHARS = TurnConfig().max_text_chars


def _req(ex: Extraction, key_context: str = "said") -> WriteRequest:
    return WriteRequest(turn_key="obs:m1", now=T0, actor="dev", sources=("m1",), extraction=ex, session="s1",
                        key_context=key_context)


# ---- the rule ---------------------------------------------------------------------------------------------------
def test_every_limit_the_stores_enforce_is_fitted_and_said() -> None:
    long_step = "run make build with gcc 12 " * 200
    ex = Extraction(
        facts=(FactCandidate("gateway", "p95_latency", "42 ms " * 600, "stated", ("m1",)),
               FactCandidate("e" * 2_500, "version", "1.2", "stated", ("m1",)),
               FactCandidate("gateway", "owner\x07", "Ana", "stated", ("m1", "s" * 400))),
        episode="Deployed the gateway. " * 1_200, detail="x" * 25_000,
        entities=("gateway", "n" * 301, "", "fast\x00api"), extra_sources=("m0", "i" * 301),
        task=TaskReport("deploy gateway", (long_step, "restart the gateway", "  "), "success"))
    with pytest.raises(InvalidInput):
        check_write_request(_req(ex, "k" * 200_001))
    fitted, notes = fit_request(_req(ex, "k" * 200_001), "m1")
    check_write_request(fitted)  # the stores accept it now
    got = fitted.extraction
    assert len(got.episode) <= WRITE_LIMITS["episode summary"] and got.episode.startswith("Deployed the gateway.")
    assert got.episode.endswith("…") and len(got.detail) <= WRITE_LIMITS["episode detail"]
    assert [f.entity for f in got.facts] == ["gateway", "gateway"]  # the fact keyed by an over-long entity is dropped
    assert got.facts[0].value.startswith("42 ms") and len(got.facts[0].value) <= 2_000
    assert got.facts[1].attribute == "owner " and got.facts[1].sources == ("m1",)
    assert got.entities == ("gateway", "fast api") and got.extra_sources == ("m0",)
    assert got.task is not None and got.task.steps[1:] == ("restart the gateway",) and len(got.task.steps) == 2
    assert len(got.task.steps[0]) <= 2_000 and got.task.steps[0].startswith("run make build")
    assert len(fitted.key_context) <= WRITE_LIMITS["key context"]
    assert all(n.startswith("m1: ") for n in notes)
    said = "\n".join(notes)
    for phrase in ("episode summary clipped from 26400 to 20000", "episode detail clipped", "fact 1 value clipped",
                   "fact 2 entity dropped (2500 characters, limit 2000)", "fact 2 dropped with it",
                   "fact 3 attribute: control characters", "fact 3 source id 2 dropped", "entity 2 dropped",
                   "entity 3 dropped (empty)", "entity 4: control characters", "context source id 2 dropped",
                   "task step 1 clipped from 5400 to 2000", "task step 3 dropped (empty)", "key context clipped"):
        assert phrase in said, phrase


def test_an_extraction_the_stores_accept_is_left_as_it_is() -> None:
    ex = Extraction(facts=(FactCandidate("gateway", "p95_latency", "42 ms", "stated", ("m1",)),),
                    episode="Ana set the gateway p95 target to 42 ms.", entities=("gateway",),
                    task=TaskReport("deploy gateway", ("build", "ship"), "success"))
    assert fit_extraction(ex, "m1") == (ex, [])
    req = _req(ex)
    assert fit_request(req, "m1") == (req, [])


def test_values_of_the_wrong_type_from_a_users_model_are_dropped() -> None:
    ex = Extraction(facts=("not a fact", FactCandidate("a", "b", 3, "stated", ("m1",))),  # type: ignore[arg-type]
                    episode=None, entities=["ok", 5], task=TaskReport(7, ("a",)))  # type: ignore[arg-type]
    fitted, notes = fit_extraction(ex, "t/1")
    check_write_request(_req(fitted))
    assert fitted.facts == () and fitted.episode == "" and fitted.entities == ("ok",) and fitted.task is None
    assert {"t/1: fact 1 dropped (not a fact)", "t/1: episode summary dropped (a NoneType, not text)",
            "t/1: task dropped with it"} <= set(notes)


def test_clip_cuts_at_white_space_and_marks_the_cut() -> None:
    assert clip("short", 10) == "short"
    assert clip("alpha beta gamma delta", 12) == "alpha beta…"
    assert clip("x" * 30, 10) == "x" * 9 + "…"
    assert all(len(clip("word " * n, 37)) <= 37 for n in range(1, 30))


# ---- long technical messages through the public loop -------------------------------------------------------------
_WORDS = ("gateway", "latency", "p95", "fastapi", "postgres", "sprint", "deploy", "cache", "redis", "kafka", "retry",
          "budget", "ingest", "shard", "index", "migration", "rollback", "canary", "release", "benchmark")


@st.composite
def blocks(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["prose", "code", "table", "numbered", "bullets", "run-on"]))
    n = draw(st.integers(1, 400))
    w = [_WORDS[(i * 7 + n) % len(_WORDS)] for i in range(60)]
    if kind == "prose":
        return " ".join(f"The {w[i % 60]} {w[(i + 3) % 60]} went from {i * 3} ms to {i * 2} ms on 2026-0{i % 9 + 1}-1"
                        f"{i % 9}." for i in range(n))
    if kind == "code":
        body = "\n".join(f"    {w[i % 60]}_{i} = client.get('/v{i % 3}/{w[(i + 1) % 60]}', timeout={i % 30})"
                         for i in range(n))
        return f"```python\ndef run():\n{body}\n```"
    if kind == "table":
        return "| lib | version | p95 |\n|---|---|---|\n" + "\n".join(
            f"| {w[i % 60]} | {i % 5}.{i % 11}.{i % 7} | {i * 4} ms |" for i in range(n))
    if kind == "numbered":
        return "Here is how I deployed the gateway: " + " ".join(
            f"{i + 1}. run {' '.join(w[(i + j) % 60] for j in range(n % 90 + 2))} with timeout {i} s"
            for i in range(min(n, 40))) + " That worked."
    if kind == "bullets":
        return "\n".join(f"- {w[i % 60]}: bump to {i % 4}.{i % 10} and retest the {w[(i + 5) % 60]}" for i in range(n))
    return "First I " + ", then I ".join(f"ran the {w[i % 60]} {w[(i + 2) % 60]} job" * (n % 40 + 1)
                                         for i in range(3)) + ", finally I checked the dashboards. It worked."


@st.composite
def messages(draw: st.DrawFn) -> str:
    parts = draw(st.lists(blocks(), min_size=1, max_size=8))
    text = "\n\n".join(parts)
    if draw(st.booleans()):  # stretch it towards the limit
        text = (text + "\n\n") * (MAX_CHARS // (len(text) + 2))
    return text[:MAX_CHARS].strip() or "The gateway p95 is 40 ms."


def _long_tool_input(message_ids: list[str]) -> dict[str, Any]:
    """What a model might answer for long technical text: every field past the stores' limits."""
    item = {"persist": True, "categories": ["fact", "event", "task"], "reason": "long technical detail",
            "episode": "The team tuned the gateway; " * 1_000 + "\x01",
            "entities": ["gateway", "e" * 400, "fast\x02api"],
            "facts": [{"entity": "gateway", "attribute": "p95 latency", "value": "42 ms " * 800, "kind": "stated"},
                      {"entity": "x" * 3_000, "attribute": "version", "value": "1.2", "kind": "stated"}],
            "task": {"task_class": "deploy gateway", "steps": ["run the build " * 300, "restart"],
                     "outcome": "success", "save_requested": True}}
    if not message_ids:
        return item
    return {"items": [{**item, "message_id": mid, "context_ids": ["c" * 400]} for mid in message_ids]}


def _responder(body: dict[str, Any]) -> Scripted:
    tools = body.get("tools") or []
    if not tools:
        return text_message("Noted: the gateway numbers are in.")
    name = tools[0]["name"]
    prompt = json.dumps(body.get("messages"))
    ids = re.findall(r"\[([A-Za-z0-9_.:@-]+)\]", prompt) if name == "record_memories" else []
    return tool_message(name, _long_tool_input(list(dict.fromkeys(ids))))


@pytest.fixture(scope="module")
def api() -> Iterator[MessagesApiServer]:
    with MessagesApiServer(responder=_responder) as server:
        yield server


def _models(api: MessagesApiServer) -> list[LanguageModel]:
    return [OfflineModel(), AnthropicModel(model_id="claude-test-20250101", api_key="k", base_url=api.base_url,
                                           timeout_s=10, max_retries=0, memory_max_tokens=64_000)]


def _consistent(mem: SoulMemory, ids: set[str]) -> None:
    st_ = mem.stats()
    # the index holds every episode but the units that share their message's vector (held once, by the message)
    (own,) = mem.episodic.db.execute("SELECT COUNT(*) FROM episodes WHERE unit = 0").fetchone()
    assert st_["indexed"] == own <= st_["episodes"]
    for ep in mem.episodes():
        assert ep.summary.strip() and set(ep.sources) <= ids, ep
    for f in mem.facts():
        assert set(f.sources) <= ids
    mem.procedures()
    assert isinstance(mem.recall("gateway p95 latency", 10, at=T0 + 10_000), list)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                  HealthCheck.function_scoped_fixture])
@given(texts=st.lists(messages(), min_size=1, max_size=4))
def test_long_messages_never_fail_observe_or_turn(api: MessagesApiServer, texts: list[str]) -> None:
    cfg = SoulConfig(turn=TurnConfig(context_tokens=MAX_CHARS // 4 + 8_000))
    for model in _models(api):
        with tempfile.TemporaryDirectory() as d:
            mem = SoulMemory(Path(d), embedder=HashEmbedder())
            soul = Soul("dev", d, memory=mem, model=model, config=cfg)
            msgs = [{"speaker": "dev" if i % 2 else "assistant", "text": t, "id": f"m{i}", "at": T0 + i}
                    for i, t in enumerate(texts)]
            r = soul.observe(msgs)
            tr = soul.trace(r.turn_id)
            if isinstance(model, AnthropicModel):  # every message came with over-long tool input: all mended
                assert {m["id"] for m in msgs} <= {n.split(":")[0] for n in tr.mended}
            turn = soul.turn(texts[-1], user="dev", at=T0 + 100)
            _consistent(mem, {m["id"] for m in msgs} | {f"{turn.turn_id}/user"})
            soul.close()
            mem.close()
