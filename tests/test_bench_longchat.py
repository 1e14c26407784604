"""`soul bench longchat`: the generated chats and their questions, the chunk baseline, one small run."""

from __future__ import annotations

import json
from pathlib import Path

from soul_runtime.bench import longchat
from soul_runtime.bench.longchat_data import DEV, HELD_OUT, generate, load, write
from tests.fakes import HashEmbedder


def test_chats_are_seeded_varied_and_their_questions_have_their_evidence() -> None:
    a, b = generate(3, 20_000), generate(3, 20_000)
    assert a.to_json() == b.to_json() and generate(4, 20_000).to_json() != a.to_json()
    assert not set(DEV) & set(HELD_OUT)
    assert 60_000 <= a.chars <= 110_000 and all(2_000 <= len(m["text"]) <= 11_000 for m in a.messages)
    assert {m["speaker"] for m in a.messages} == {a.user, "assistant"}
    texts = {m["id"]: m["text"] for m in a.messages}
    kinds = set()
    for q in a.questions:
        kinds.add(q.kind)
        assert all(e in texts for e in q.evidence)
        first = texts[q.evidence[0]].lower()
        assert all(k.lower() in first for k in q.key_phrases), q
    assert kinds == {"version", "figure", "updated", "date", "code", "proposal"}
    forms = "".join(texts.values())
    assert "```python" in forms and "|---|" in forms and "\n- " in forms


def test_chunks_split_at_sentence_ends_and_stay_near_400_characters() -> None:
    text = generate(5, 20_000).messages[2]["text"]
    parts = longchat.chunks(text)
    assert all(len(p) <= longchat.CHUNK_CHARS for p in parts)
    assert set(" ".join(parts).split()) == set(text.split())


def test_a_small_run_reports_every_system_budget_and_kind(tmp_path: Path) -> None:
    write(tmp_path / "chats", [7], [12_000])
    res = longchat.run(tmp_path / "chats", (500, 1000), embedder=HashEmbedder(), workdir=str(tmp_path / "w"))
    assert res["details"]["refused"] == [] and res["details"]["chats"] == 1
    assert res["details"]["questions"] == len(load(tmp_path / "chats")[0].questions)
    for s in longchat.SYSTEMS:
        for b in ("500", "1000"):
            got = res["systems"][s][b]
            assert 0 <= got["evidence_recall"] <= 1 and 0 <= got["key_phrase_recall"] <= 1
            assert got["tokens_mean"] <= int(b)
    assert res["details"]["ingest_messages_per_s"] > 0 and res["details"]["rss_peak_mib"] > 0
    json.dumps(res)
    longchat.plot(res, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
