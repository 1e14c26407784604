"""Consolidated memory: digests of sessions and spans written from their episodes, with provenance; refreshed
when those change; erased with them (no byte left); offered to a question that gathers what was said over time."""

from __future__ import annotations

from pathlib import Path

from soul_runtime.clock import to_timestamp
from soul_runtime.config import MemoryConfig
from soul_runtime.loop.erase import forget_where
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.digest import Said, prose, session_digest, span_digest, worded
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.offline import OfflineModel
from tests.fakes import HashEmbedder, disk_hits

SECRET = "Zephyrquill"
LATER = to_timestamp("2026-04-01")


def make(d: Path) -> tuple[Soul, SoulMemory]:
    mem = SoulMemory(d, embedder=HashEmbedder())
    return Soul("atlas", d, memory=mem, model=OfflineModel()), mem


def said(session: str, lines: list[str], start: int) -> list[dict[str, str]]:
    return [{"speaker": "user" if i % 2 == 0 else "assistant", "text": t, "id": f"{session}-{start + i}"}
            for i, t in enumerate(lines)]


S1 = ["I decided to build the ingestion service with Kafka and three partitions for the order events.",
      "Kafka with three partitions will carry the order events to the ingestion service reliably.",
      f"We agreed to call the ingestion service {SECRET} after the old codename for the order pipeline.",
      "The ingestion service now handles 1200 order events per second on the Kafka cluster."]
S2 = ["I switched the reporting dashboard from Grafana to Superset for the finance team last week.",
      "Superset reads the finance reports from the warehouse every night at 2 am for the dashboard.",
      "The finance dashboard in Superset shows 14 charts of revenue and churn for the team."]


def observed(tmp_path: Path) -> tuple[Soul, SoulMemory]:
    soul, mem = make(tmp_path)
    soul.observe(said("s1", S1, 0), at="2026-03-02T10:00", session="s1")
    soul.observe(said("s2", S2, 0), at="2026-03-09T10:00", session="s2")
    return soul, mem


def test_digests_are_written_per_session_and_span_with_provenance(tmp_path: Path) -> None:
    soul, mem = observed(tmp_path)
    assert mem.digests() == []
    done = mem.consolidate(LATER)
    assert done["digests"] == 3 and done["digests_written"] == 3
    by = {(d.kind, d.sessions): d for d in mem.digests()}
    s1, s2 = by[("session", ("s1",))], by[("session", ("s2",))]
    span = by[("span", ("s1", "s2"))]
    episodes = {e.session: set() for e in mem.episodes()}
    for e in mem.episodes():
        episodes[e.session].add(e.id)
    assert set(s1.episodes) == episodes["s1"] and set(s2.episodes) == episodes["s2"]
    assert set(span.episodes) == episodes["s1"] | episodes["s2"]
    assert s1.sources and all(src.startswith("s1-") for src in s1.sources)
    assert "kafka" in s1.text.lower() and "superset" in s2.text.lower()
    assert "kafka" in span.text.lower() and "superset" in span.text.lower()
    assert span.text.index("2 March 2026") < span.text.index("9 March 2026")  # a timeline, in order
    soul.close()
    mem.close()


def test_digests_are_rewritten_only_when_their_episodes_change(tmp_path: Path) -> None:
    soul, mem = observed(tmp_path)
    mem.consolidate(LATER)
    before = {(d.kind, d.sessions): d for d in mem.digests()}
    assert mem.consolidate(LATER)["digests_written"] == 0
    soul.observe(said("s2", ["The finance team asked for a Superset chart of refunds per region by quarter."], 9),
                 at="2026-03-09T12:00", session="s2")
    done = mem.consolidate(LATER)
    after = {(d.kind, d.sessions): d for d in mem.digests()}
    assert done["digests_written"] == 2  # the session and the span holding it
    assert after[("session", ("s1",))] == before[("session", ("s1",))]
    assert after[("session", ("s2",))].fingerprint != before[("session", ("s2",))].fingerprint
    assert len(after[("session", ("s2",))].episodes) > len(before[("session", ("s2",))].episodes)
    soul.close()
    mem.close()


S3 = ["The ingestion service and the finance dashboard both read the order events from the warehouse.",
      "I decided the finance team gets a daily export of the order events from the ingestion service."]


def test_the_digests_are_the_same_whenever_consolidation_ran(tmp_path: Path) -> None:
    """A third session makes words common to most sessions (left out of a digest's head): the digests consolidated
    after every session are those consolidated once at the end."""
    sessions = [("s1", S1, "2026-03-02T10:00"), ("s2", S2, "2026-03-09T10:00"), ("s3", S3, "2026-03-16T10:00")]
    got = []
    for every, d in ((True, tmp_path / "every"), (False, tmp_path / "once")):
        soul, mem = make(d)
        for name, lines, at in sessions:
            soul.observe(said(name, lines, 0), at=at, session=name)
            if every:
                mem.consolidate(LATER)
        mem.consolidate(LATER)
        got.append(mem.digests())
        soul.close()
        mem.close()
    assert len(got[0]) == 4 and got[0] == got[1]


def test_a_forget_erases_the_digests_quoting_it_and_no_byte_is_left(tmp_path: Path) -> None:
    soul, mem = observed(tmp_path)
    mem.consolidate(LATER)
    assert any(SECRET in d.text for d in mem.digests())
    forget_where(soul, query=SECRET, request_id="forget-1", at=LATER)
    assert disk_hits(tmp_path, SECRET) == {}
    assert all(("s1",) != d.sessions[:1] for d in mem.digests())  # every digest naming an erased episode is gone
    mem.consolidate(LATER)  # written again from what is left
    assert {d.sessions for d in mem.digests()} == {("s1",), ("s2",), ("s1", "s2")}
    assert disk_hits(tmp_path, SECRET) == {}
    soul.close()
    mem.close()


def test_retention_runs_the_consolidation(tmp_path: Path) -> None:
    soul, mem = observed(tmp_path)
    got = mem.sweep(LATER)
    assert got["digests_written"] == 3 and len(mem.digests()) == 3
    soul.close()
    mem.close()


def test_recall_offers_digests_to_questions_over_time_below_the_line_that_answers(tmp_path: Path) -> None:
    soul, mem = observed(tmp_path)
    mem.consolidate(LATER)
    ask = "Summarize how the ingestion service and the finance dashboard changed"
    soul.close()
    mem.close()
    off = SoulMemory(tmp_path, embedder=HashEmbedder(), config=MemoryConfig(digests_recalled=0))
    assert not any(it.id.startswith("dg-") for it in off.recall(ask, 10, at=LATER))  # switched off
    off.close()
    mem = SoulMemory(tmp_path, embedder=HashEmbedder())
    soul = Soul("atlas", tmp_path, memory=mem, model=OfflineModel())
    over_time = mem.recall(ask, 10, at=LATER)
    digests = [it for it in over_time if it.id.startswith("dg-")]
    assert digests and over_time[0].id.startswith("ep-") and all(d.score < over_time[0].score for d in digests)
    precise = mem.recall("How many order events per second does the ingestion service handle?", 10, at=LATER)
    assert not any(it.id.startswith("dg-") for it in precise)
    soul.close()
    mem.close()


def test_the_offline_writer_quotes_prose_in_order_and_a_models_words_keep_the_provenance() -> None:
    eps = [Said(f"ep-{i}", 100.0 + i, t, (f"m{i}",)) for i, t in enumerate(
        ["def handler(event): return {'ok': True}", *S1])]
    d = session_digest("s1", eps)
    assert d is not None and "def handler" not in d.text and not prose("x = {'a': 1}")
    quoted = [t for t in S1 if t[:40] in d.text]
    assert quoted and [d.text.index(t[:40]) for t in quoted] == sorted(d.text.index(t[:40]) for t in quoted)
    assert span_digest([d]) is None
    own = worded("s1", eps, "  The team built the ingestion   service on Kafka.  ")
    assert own is not None and own.text == "The team built the ingestion service on Kafka."
    assert own.episodes == tuple(e.episode for e in eps) and own.fingerprint == d.fingerprint
