"""The write-policy audit (pure, no Ray): hand-labelled expectations, fixture replay, tally and the imbalance
flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from soul_runtime.errors import InvalidInput
from soul_runtime.loop.audit import (
    AuditRow,
    audit,
    classify,
    load_transcript,
    primary_bucket,
    replay_fixture,
    save_fixture,
    tally,
)
from tests.audit_labels import CONTEXT, LABELLED, labelled_fixture

FIXTURES = Path(__file__).parent / "fixtures"
TRANSCRIPT = FIXTURES / "audit_transcript.jsonl"


def _fixture(tmp_path: Path) -> Path:
    path = tmp_path / "labelled.json"
    path.write_text(json.dumps(labelled_fixture(load_transcript(TRANSCRIPT))))
    return path


def test_the_labels_cover_a_realistic_transcript() -> None:
    ids = [m["id"] for m in load_transcript(TRANSCRIPT)]
    assert set(ids) == set(LABELLED) | CONTEXT and len(ids) == len(LABELLED) + len(CONTEXT)
    assert len(LABELLED) >= 14
    assert {primary for primary, _, _ in LABELLED.values()} == {"episodic", "semantic", "procedural", "nothing"}


def test_the_policy_agrees_with_the_hand_labels() -> None:
    rows = {r.id: r for r in classify(load_transcript(TRANSCRIPT))}
    assert set(rows) == set(LABELLED)  # the assistant's message is context, not an exchange
    got = {i: (r.primary, tuple(sorted(r.labels))) for i, r in rows.items()}
    want = {i: (primary, tuple(sorted(labels))) for i, (primary, labels, _) in LABELLED.items()}
    assert got == want


def test_replay_of_the_labelled_fixture_finds_no_difference(tmp_path: Path) -> None:
    assert replay_fixture(_fixture(tmp_path)) == []


def test_replay_reports_mismatch(tmp_path: Path) -> None:
    entries = json.loads(_fixture(tmp_path).read_text())
    chit = next(e for e in entries if e["id"] == "a1")
    chit["expected"] = "semantic"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(entries))
    got = replay_fixture(bad)
    assert [(m["id"], m["expected"], m["got"]) for m in got] == [("a1", "semantic", "nothing")]


def test_reasons_for_nothing() -> None:
    report = audit(load_transcript(TRANSCRIPT))
    reasons = {r.id: r.reason for r in report.nothing}
    assert reasons["a13"] == "instruction" and reasons["a14"] == "instruction"  # injections store nothing
    assert "a12" not in reasons  # a question that names what it asks about is kept (see audit_labels)
    assert reasons["a1"] == "chit-chat"
    rows = {r.id: r for r in report.rows}
    assert "a2r" not in rows  # the assistant's message is context, not an exchange
    assert rows["a2"].labels == ("episodic", "observation")  # stated once: an observation, not yet a fact
    assert rows["a9"].primary == "semantic" and any("corrected" in w for w in rows["a9"].writes)
    assert rows["a18"].primary == "semantic" and any("retracted" in w for w in rows["a18"].writes)


def test_tally_of_fixture() -> None:
    report = audit(load_transcript(TRANSCRIPT))
    assert report.tally == {"procedural": 3, "semantic": 4, "episodic": 7, "nothing": 5}
    assert report.labels["episodic"] == 14 and report.labels["observation"] == 3
    assert sum(report.tally.values()) == len(report.rows) == 19
    assert report.share["episodic"] == round(7 / 19, 4)
    assert report.stored_share["episodic"] == round(7 / 14, 4)
    assert not report.unbalanced and report.dominant == "episodic"
    d = report.to_dict()
    assert d["total"] == 19 and len(d["nothing"]) == 5


def _rows(*buckets: str) -> list[AuditRow]:
    return [AuditRow(f"m{i}", "Maya", "x", b, () if b == "nothing" else (b,), "") for i, b in enumerate(buckets)]


def test_imbalance_logic() -> None:
    assert tally(_rows("episodic", "episodic", "semantic", "nothing", "nothing")).unbalanced is False
    r = tally(_rows(*["episodic"] * 7, "semantic", "procedural", "nothing"))
    assert r.unbalanced and r.dominant == "episodic" and r.share["episodic"] == 0.7
    # exactly at the threshold is not over it
    assert tally(_rows(*["semantic"] * 6, *["nothing"] * 4)).unbalanced is False
    assert tally(_rows(*["semantic"] * 6, *["nothing"] * 4), threshold=0.5).unbalanced is True
    # "nothing" never flags: a chatty transcript is not a policy imbalance
    r = tally(_rows(*["nothing"] * 9, "episodic"))
    assert not r.unbalanced and r.stored_share["episodic"] == 1.0
    assert tally([]).dominant == ""
    with pytest.raises(InvalidInput):
        tally(_rows("episodic"), threshold=0)


def test_primary_bucket_is_most_specific() -> None:
    assert primary_bucket(("episodic", "semantic", "procedural")) == "procedural"
    assert primary_bucket(("episodic", "semantic")) == "semantic"
    assert primary_bucket(("episodic", "observation")) == "episodic"
    assert primary_bucket(("observation",)) == "nothing"
    assert primary_bucket(()) == "nothing"


EVENTS = [
    "We rolled back the cache deploy after the latency spike this morning.",
    "The on-call handover went out late yesterday because of the outage.",
    "I restarted the ingest workers after the disk filled up on node seven.",
    "We migrated the billing cron jobs to the new scheduler last week.",
    "The load balancer certificates were renewed during the maintenance window.",
    "Our team finished the quarterly disaster recovery drill on Tuesday.",
    "The database failover took four minutes during the drill.",
    "I confirmed the alert thresholds with the payments team after lunch.",
]


def test_event_heavy_transcript_is_unbalanced() -> None:
    transcript = [{"speaker": "Maya", "text": t, "id": f"e{i}"} for i, t in enumerate(EVENTS)]
    transcript += [{"speaker": "Maya", "text": "Thanks, bye for now!", "id": "bye"},
                   {"speaker": "Maya", "text": "The production database for Tendril is Postgres 16.", "id": "f1"},
                   {"speaker": "Maya", "text": "Correct.", "id": "f2"}]
    report = audit(transcript)
    assert report.tally["episodic"] / len(report.rows) > 0.6
    assert report.unbalanced and report.dominant == "episodic"
    assert report.tally["semantic"] == 1 and report.tally["nothing"] == 1


def test_save_fixture_writes_every_message_as_classified(tmp_path: Path) -> None:
    """A saved fixture holds the transcript's messages in order, each exchange with the class and labels it was
    given (the assistant's messages as context): here, the hand labels."""
    transcript = load_transcript(TRANSCRIPT)
    path = save_fixture(tmp_path / "f.json", classify(transcript), transcript)
    saved = json.loads(path.read_text())
    assert [(e["speaker"], e["text"]) for e in saved] == [(m["speaker"], m["text"]) for m in transcript]
    assert {e["id"]: (e["expected"], sorted(e.get("labels", ()))) for e in saved} == {
        **{i: (primary, sorted(labels)) for i, (primary, labels, _) in LABELLED.items()},
        **{i: ("context", []) for i in CONTEXT}}
    assert replay_fixture(path) == []


def test_bad_transcripts(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"speaker": "Maya", "text": "hi"}\nnot json\n')
    with pytest.raises(InvalidInput, match=":2:"):
        load_transcript(p)
    p.write_text("")
    with pytest.raises(InvalidInput, match="no messages"):
        load_transcript(p)
    with pytest.raises(InvalidInput):
        audit([{"text": "no speaker"}])
