"""`soul bench beam`: how a BEAM chat is read and what a system is credited with (no BEAM data needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from soul_apps.bench.beam import evidence_recall, key_phrase_recall
from soul_apps.bench.beam_data import load, load_chat
from soul_runtime.errors import InvalidInput


def _chat(d: Path) -> Path:
    (d / "probing_questions").mkdir(parents=True)
    batches = [
        {"batch_number": 1, "turns": [[
            {"role": "user", "id": 0, "time_anchor": "March-01-2024", "content": "We use Flask 2.3.2 here. ->-> 1,3"},
            {"role": "assistant", "id": 1, "content": "Noted: Flask 2.3.2."}]]},
        {"batch_number": 2, "turns": [[
            {"role": "user", "id": 2, "time_anchor": "March-16-2024", "content": "Tests now pass at 97%."},
            {"role": "assistant", "id": 3, "content": "Good."}]]},
    ]
    probes = {
        "abstention": [{"question": "What did the reviewer say?", "rubric": ["Based on the provided chat, none"]}],
        "knowledge_update": [{"question": "What is the test pass rate?", "rubric": ["LLM response should state: 97%"],
                              "source_chat_ids": {"original_info": [0], "updated_info": [2]}}],
        "preference_following": [{"question": "How should I cache?", "source_chat_ids": [1],
                                  "rubric": ["LLM response should contain: mentions Redis"]}],
        "event_ordering": [{"question": "In order?", "source_chat_ids": [[0, 2], [3]],
                            "rubric": ["LLM response should mention: Flask setup first"]}],
    }
    (d / "chat.json").write_text(json.dumps(batches))
    (d / "probing_questions" / "probing_questions.json").write_text(json.dumps(probes))
    return d


def test_a_chat_is_read_as_dated_sessions_with_questions_and_evidence(tmp_path: Path) -> None:
    chat = load_chat(_chat(tmp_path / "3"))
    assert [name for name, _ in chat.sessions] == ["batch-1", "batch-2"]
    first, second = chat.sessions[0][1], chat.sessions[1][1]
    assert first[0]["text"] == "We use Flask 2.3.2 here." and first[0]["id"] == "m0"  # plan marks stripped
    assert first[1]["at"] - first[0]["at"] == 60 and second[0]["at"] == 1710547200.0  # 16 March 2024, 00:00 UTC
    kinds = {q.kind: q for q in chat.questions}
    assert "abstention" not in kinds
    assert kinds["knowledge_update"].evidence == ("m2",)  # the current value only
    assert kinds["knowledge_update"].key_words == ("97",)
    assert kinds["preference_following"].key_words == ()  # a rubric of how to answer, not of what was said
    assert kinds["event_ordering"].evidence == ("m0", "m2", "m3")
    assert kinds["event_ordering"].key_words == ("flask", "setup", "first")
    assert [c.chat_id for c in load(tmp_path)] == ["3"]


def test_credit_is_for_the_sources_and_words_shown() -> None:
    from soul_apps.bench.beam_data import Question
    q = Question("In order?", "event_ordering", ("m0", "m2"), ("flask", "setup"))
    assert evidence_recall(q, [("[episodic ep-1] Flask setup done", ("m0",))]) == 0.5
    assert key_phrase_recall(q, [("[episodic ep-1] the Flask app", ("m9",))]) == 0.5
    assert key_phrase_recall(q, [("flasks and setups", ())]) == 0.0  # words, not substrings
    assert evidence_recall(Question("q", "summarization", (), ("x",)), []) is None


def test_a_folder_without_chats_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput):
        load(tmp_path)


def test_a_chat_observed_into_kept_stores_is_scored_again_without_observing_it(tmp_path: Path) -> None:
    from soul_apps.bench.beam import run
    data, stores = _chat(tmp_path / "data" / "3").parent, tmp_path / "stores"
    first = run(data, (1000,), stores=stores, ablation=True)
    assert (stores / "3.chunks.npz").is_file()  # the dense baseline's vectors, kept for the next run
    again = run(data, (1000,), stores=stores, ablation=True)
    was, now = first["details"]["per_chat"][0], again["details"]["per_chat"][0]
    assert not was["observed_by_an_earlier_run"] and now["observed_by_an_earlier_run"]
    assert now["episodes"] == was["episodes"] > 0  # not observed twice
    assert now["ingest_s"] == was["ingest_s"]  # the earlier run's figure, marked so
    assert again["systems"] == first["systems"]  # the same souls and baselines, scored the same way (ablations too)
    (stores / "3.observed.json").write_text(json.dumps({"ingest_s": 1.0, "messages": 99}))  # not this chat's
    lexical = run(data, (1000,), stores=stores, dense=False)
    assert not lexical["details"]["per_chat"][0]["observed_by_an_earlier_run"]
    assert "dense_chunks" not in lexical["systems"] and lexical["systems"]["bm25_chunks"] == first["systems"]["bm25_chunks"]
