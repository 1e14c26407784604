"""Forget means gone: after a forget no byte of the forgotten text is anywhere under the data dir.

In process (no Ray): the loop, the three stores and the soul's own state on real files. Every check
scans the raw bytes of every file (databases, -wal, -shm, index, sidecars) for the forgotten words.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from soul_runtime.errors import InvalidInput
from soul_runtime.loop.erase import forget_soul, forget_where
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.memory.sqlite_db import use_storage
from soul_runtime.models.offline import OfflineModel
from soul_runtime.records import Op
from tests.fakes import HashEmbedder, disk_hits

SECRET = "Zephyrquill"
STEM = "zephyrqu"  # what the FTS5 porter stemmer could keep of it
T0 = "2026-03-02T09:00"


@pytest.fixture(autouse=True, params=["local", "shared"])
def storage(request: pytest.FixtureRequest) -> Iterator[str]:
    """Both journals: WAL (frames in -wal) and the rollback journal of shared storage (pages in -journal)."""
    use_storage(request.param)
    yield request.param
    use_storage("local")


def make(d: Path) -> tuple[Soul, SoulMemory]:
    mem = SoulMemory(d, embedder=HashEmbedder())
    return Soul("atlas", d, memory=mem, model=OfflineModel()), mem


def filler(n: int, start: int = 0) -> list[dict[str, str]]:
    return [{"speaker": "Caroline", "text": f"I walked {i} kilometres along the river path near the old mill.",
             "id": f"f{i}"} for i in range(start, start + n)]


def tell_secret(soul: Soul) -> None:
    """The secret in two turns (a confirmed fact and an episode) and in an observed message written in the
    same transaction as many others (so its FTS terms share a segment with terms that stay)."""
    soul.turn(f"The backup bucket for Tendril is {SECRET.lower()}-7.", user="maya", at=T0)
    soul.turn("Yes, that's right.", user="maya", at=T0)
    msgs = filler(30)
    msgs.insert(15, {"speaker": "Caroline", "text": f"My new beagle is called {SECRET}, he loves the park.",
                     "id": "m1"})
    soul.observe(msgs, at="2026-03-03T10:00", session="s1")
    soul.observe(filler(5, 100), at="2026-03-03T11:00", session="s1")


def test_forget_leaves_no_byte_of_the_soul_and_the_soul_is_new(tmp_path: Path, storage: str) -> None:
    soul, mem = make(tmp_path)
    tell_secret(soul)
    assert any(f.name.endswith("-wal") for f in tmp_path.iterdir()) == (storage == "local")
    assert mem.facts() and disk_hits(tmp_path, STEM)  # the scan sees the secret before the forget
    out = forget_soul(soul)
    assert out["episodic"] >= 30 and out["semantic"] == 1 and out["traces"] == 4
    assert disk_hits(tmp_path, STEM, "river path", "beagle") == {}
    assert mem.is_empty() and mem.recall("beagle Caroline", at=1.8e9) == [] and soul.traces(10) == []
    assert soul.state.buffer.turns == []
    # a fresh soul: the same message id is new again, the sequence goes on, an import is accepted
    res = soul.observe([{"speaker": "Caroline", "text": "I bought a red kayak for the lake.", "id": "m1"}],
                       at="2026-04-01", session="s2")
    assert res.seq == 5 and [w.op for w in res.writes if w.store.value == "episodic"] == [Op.ADD]
    other, other_mem = make(tmp_path / "other")
    other.observe(filler(3), at="2026-03-03", session="s1")
    forget_soul(soul)
    mem.import_(other_mem.export())
    assert mem.stats()["episodes"] == 3


def test_forget_of_some_layers_erases_them_with_the_traces(tmp_path: Path) -> None:
    soul, mem = make(tmp_path)
    tell_secret(soul)
    out = forget_soul(soul, stores=["semantic"])
    assert set(out) == {"semantic", "traces"} and mem.facts() == []
    assert not any(name.startswith(("semantic.", "soul.")) for name in disk_hits(tmp_path, STEM))
    assert any(name.startswith("episodic.") for name in disk_hits(tmp_path, STEM))
    with pytest.raises(InvalidInput):
        forget_soul(soul, stores=["short-term"])


def test_forget_where_a_phrase_removes_every_copy_and_keeps_the_rest(tmp_path: Path) -> None:
    soul, mem = make(tmp_path)
    tell_secret(soul)
    before = {e.id for e in mem.episodes()}
    told = {e.id for e in mem.episodes() if SECRET.lower() in e.summary.lower()}
    res = forget_where(soul, query=SECRET.upper(), request_id="forget-1", at=1.8e9)
    assert disk_hits(tmp_path, STEM) == {}
    deleted = {w.key for w in res.writes}
    assert {"tendril:backup_bucket"} <= deleted and all(w.op is Op.DELETE for w in res.writes)
    assert told <= deleted and mem.facts() == []
    # besides those, only episodes indexed under the secret's words go (a reply quotes the message it answers)
    assert {e.id for e in mem.episodes()} == before - deleted and len(before & deleted) <= len(told) + 2
    assert mem.recall("walked kilometres river path", at=1.8e9)  # the rest is still recalled
    # recorded in the trace, by id only; a retried request is not applied twice
    trace = soul.traces(1)[0]
    assert trace.kind == "forget" and trace.seq == 5 and {w.key for w in trace.writes} == deleted
    assert forget_where(soul, query=SECRET, request_id="forget-1").seq == 5
    # the message is new again
    again = soul.observe([{"speaker": "Caroline", "text": "My new beagle is called Biscuit, he loves the park.",
                           "id": "m1"}], at="2026-03-04", session="s1")
    assert [w.op for w in again.writes if w.store.value == "episodic"] == [Op.ADD]


def test_forget_where_by_id_removes_one_fact_and_its_words(tmp_path: Path) -> None:
    soul, mem = make(tmp_path)
    soul.turn("The backup bucket for Tendril is archive-7.", user="maya", at=T0)
    soul.turn("Yes, that's right.", user="maya", at=T0)
    soul.turn("The production database for Tendril is Postgres 15.", user="maya", at=T0)
    soul.turn("Yes, that's right.", user="maya", at=T0)
    assert {f.key for f in mem.facts()} == {"tendril:backup_bucket", "tendril:production_database"}
    forget_where(soul, ids=["tendril:backup_bucket"])
    assert {f.key for f in mem.facts()} == {"tendril:production_database"}
    assert disk_hits(tmp_path, "archive-7") == {} and disk_hits(tmp_path, "Postgres 15")


def test_forget_where_needs_ids_or_a_phrase(tmp_path: Path) -> None:
    soul, _ = make(tmp_path)
    for bad in [{}, {"query": "  "}, {"ids": [3]}, {"query": "x" * 1001}]:
        with pytest.raises(InvalidInput):
            forget_where(soul, **bad)  # type: ignore[arg-type]
    assert soul.last_seq == 0
