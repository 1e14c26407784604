"""The three layers on real SQLite files and real usearch indices (fast test embedder)."""

from __future__ import annotations

import os
from pathlib import Path

import msgpack
import pytest

from soul_runtime.clock import DAY
from soul_runtime.config import MemoryConfig
from soul_runtime.errors import EmbedderError, InvalidInput, NotFound, StorageError
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.memory.sqlite_db import open_db
from soul_runtime.records import Extraction, FactCandidate, Op, Store, TaskReport, WriteRequest
from tests.fakes import HashEmbedder

NOW = 1_780_000_000.0


def req(key: str, ex: Extraction, at: float = NOW, session: str = "s1") -> WriteRequest:
    return WriteRequest(turn_key=key, now=at, actor="maya", sources=(f"{key}/u",), extraction=ex, session=session)


def tendril(value: str, kind: str, key: str) -> FactCandidate:
    return FactCandidate("tendril", "production_database", value, kind, (f"{key}/u",), "Tendril",
                         "production database")


@pytest.fixture
def mem(tmp_path: Path) -> SoulMemory:
    m = SoulMemory(tmp_path / "soul", embedder=HashEmbedder())
    yield m
    m.close()


def ops(writes: list, store: Store) -> list[Op]:
    return [w.op for w in writes if w.store is store]


def test_tendril_correction_keeps_one_active_fact_with_history(mem: SoulMemory) -> None:
    mem.write(req("t1", Extraction(facts=(tendril("Postgres 15", "stated", "t1"),),
                                   episode="Maya said the Tendril production database is Postgres 15.", event=True)))
    w = mem.write(req("t2", Extraction(facts=(tendril("Postgres 15", "confirmed", "t2"),),
                                       episode="Maya confirmed Tendril runs Postgres 15.", event=True), NOW + 60))
    assert ops(w, Store.SEMANTIC) == [Op.ADD]
    w = mem.write(req("t3", Extraction(facts=(tendril("Postgres 16", "corrected", "t3"),),
                                       episode="Maya corrected Tendril's database to Postgres 16.", event=True),
                      NOW + DAY))
    assert ops(w, Store.SEMANTIC) == [Op.UPDATE]
    (f,) = mem.facts("Tendril")
    assert f.value == "Postgres 16" and f.sources == ("t3/u",)
    hist = mem.fact_history("tendril", "production_database")
    assert [h.value for h in hist] == ["Postgres 15", "Postgres 16"]
    assert set(hist[0].sources) == {"t1/u", "t2/u"}  # the statement and its confirmation
    items = mem.recall("which Postgres version does Tendril run in production", 10, at=NOW + 2 * DAY)
    assert items and items[0].store == "semantic" and "Postgres 16" in items[0].text
    assert not any("Postgres 15" in it.text for it in items), [it.text for it in items]


def test_the_same_fact_ten_times_is_one_record(mem: SoulMemory) -> None:
    for i in range(10):
        mem.write(req(f"t{i}", Extraction(facts=(tendril("Postgres 15", "confirmed", f"t{i}"),))))
    (f,) = mem.facts()
    assert len(f.sources) == 10 and mem.stats()["facts"] == 1 and mem.stats()["archived_facts"] == 0


def test_a_fact_seen_in_three_episodes_is_promoted_and_its_episodes_stop_decaying(tmp_path: Path) -> None:
    cfg = MemoryConfig(recall_horizon_days=30)
    m = SoulMemory(tmp_path, embedder=HashEmbedder(), config=cfg)
    writes = []
    for i in range(3):
        writes = m.write(req(f"t{i}", Extraction(facts=(tendril("Postgres 15", "stated", f"t{i}"),),
                                                 episode=f"Day {i}: Maya mentioned Tendril uses Postgres 15.",
                                                 event=True), NOW + i * DAY, session=f"s{i}"))
        assert len(m.facts()) == (1 if i == 2 else 0)
    sem = [w for w in writes if w.store is Store.SEMANTIC]
    assert sem[0].op is Op.ADD and "promoted" in sem[0].reason
    assert m.facts()[0].sources == ("t0/u", "t1/u", "t2/u")
    assert m.stats()["promoted_episodes"] == 3
    later = m.recall("Tendril Postgres", 10, at=NOW + 400 * DAY, stores=["episodic"])
    assert len(later) == 3
    m.close()


def test_recent_episode_outranks_an_equally_similar_old_one(mem: SoulMemory) -> None:
    text = "Maya deployed the billing service to production."
    mem.write(req("old", Extraction(episode=text, event=True), NOW - 200 * DAY, session="a"))
    mem.write(req("new", Extraction(episode=text, event=True), NOW - 2 * DAY, session="b"))
    items = mem.recall("billing service deployment", 5, at=NOW, stores=["episodic"])
    assert [it.sources for it in items] == [("new/u",), ("old/u",)]
    assert items[0].score > items[1].score


def test_episode_past_its_recall_horizon_is_not_recalled(tmp_path: Path) -> None:
    m = SoulMemory(tmp_path, embedder=HashEmbedder(), config=MemoryConfig(recall_horizon_days=30))
    m.write(req("t", Extraction(episode="Maya adopted a cat named Miso.", event=True), NOW - 31 * DAY))
    assert m.recall("cat named Miso", 5, at=NOW) == []
    assert len(m.recall("cat named Miso", 5, at=NOW - 20 * DAY)) == 1
    m.close()


def test_near_duplicate_episode_is_merged_not_duplicated(mem: SoulMemory) -> None:
    mem.write(req("a", Extraction(episode="Maya moved the standup to 10am.", event=True)))
    w = mem.write(req("b", Extraction(episode="Maya moved the standup to 10am.", event=True), NOW + 60))
    assert ops(w, Store.EPISODIC) == [Op.UPDATE]
    (ep,) = mem.episodes()
    assert ep.sources == ("a/u", "b/u")


def test_writes_are_idempotent_per_turn(mem: SoulMemory) -> None:
    r = req("t1", Extraction(facts=(tendril("Postgres 15", "confirmed", "t1"),), episode="x happened", event=True))
    first = mem.write(r)
    again = mem.write(r)
    assert first == again and mem.stats()["episodes"] == 1 and len(mem.facts()) == 1


def test_procedure_after_third_success_and_versioned_rollout(mem: SoulMemory) -> None:
    steps = ("pull the timeline", "summarise impact")
    for i in range(3):
        w = mem.write(req(f"p{i}", Extraction(episode=f"Postmortem {i} shipped.", event=True,
                                              task=TaskReport("draft postmortem", steps, "success"))))
    assert [w.key for w in w if w.store is Store.PROCEDURAL and w.op is Op.ADD] == ["draft postmortem@v1"]
    steps2 = steps + ("check the on-call log",)
    for i in range(3):
        mem.write(req(f"q{i}", Extraction(episode=f"Postmortem q{i} shipped.", event=True,
                                          task=TaskReport("draft postmortem", steps2, "success"))))
        status = {p.version: p.status for p in mem.procedures("draft postmortem")}
        assert status == ({1: "active", 2: "candidate"} if i < 2 else {1: "retired", 2: "active"}), status
    items = mem.recall("please draft a postmortem for incident-9", 5, at=NOW, stores=["procedural"])
    assert items[0].id == "draft postmortem@v2" and "on-call log" in items[0].text


def test_time_axis_by_range_and_session_order(mem: SoulMemory) -> None:
    for i in range(4):
        mem.write(req(f"e{i}", Extraction(episode=f"Event number {i} about topic {i}.", event=True), NOW + i * DAY,
                      session=f"sess{i}"))
    assert [e.summary for e in mem.episodes(sessions_ago=0)] == ["Event number 3 about topic 3."]
    assert [e.summary for e in mem.episodes(sessions_ago=3)] == ["Event number 0 about topic 0."]
    assert len(mem.episodes(since=NOW + DAY, until=NOW + 3 * DAY)) == 2
    assert mem.episodes(sessions_ago=10) == []


def test_export_import_round_trip_is_exact(mem: SoulMemory, tmp_path: Path) -> None:
    mem.write(req("t1", Extraction(facts=(tendril("Postgres 15", "confirmed", "t1"),), episode="A thing.", event=True)))
    mem.write(req("t2", Extraction(facts=(tendril("Postgres 16", "corrected", "t2"),), episode="B thing.", event=True)))
    blob = mem.export()
    other = SoulMemory(tmp_path / "other", embedder=HashEmbedder())
    other.import_(blob)
    assert other.export() == blob
    assert other.recall("thing Postgres", 10, at=NOW) == mem.recall("thing Postgres", 10, at=NOW)
    with pytest.raises(InvalidInput):
        other.import_(blob)  # not empty any more
    other.close()


@pytest.mark.parametrize("blob", [b"", b"\xc1\xc1garbage", msgpack.packb({"format": "other"}),
                                  msgpack.packb([1, 2, 3]), msgpack.packb({"format": "soul-runtime/memory@1"})])
def test_malformed_import_is_refused_and_stores_nothing(mem: SoulMemory, blob: bytes) -> None:
    with pytest.raises(InvalidInput):
        mem.import_(blob)
    assert mem.stats()["episodes"] == 0 and mem.facts() == []


def test_index_is_rebuilt_when_deleted_truncated_or_corrupt(tmp_path: Path) -> None:
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    for i in range(20):
        m.write(req(f"t{i}", Extraction(episode=f"Maya finished task {i} on project {i % 3}.", event=True)))
    expect = m.recall("project 1", 5, at=NOW)
    m.close()
    idx = tmp_path / "episodic.usearch"
    for damage in ("delete", "truncate", "garbage"):
        if damage == "delete":
            idx.unlink()
        elif damage == "truncate":
            data = idx.read_bytes()
            idx.write_bytes(data[: len(data) // 2])
        else:
            idx.write_bytes(os.urandom(idx.stat().st_size))
        m = SoulMemory(tmp_path, embedder=HashEmbedder())
        assert m.episodic.index.rebuilt, damage
        assert m.recall("project 1", 5, at=NOW) == expect
        assert m.stats()["indexed"] == 20
        m.close()


def test_a_small_index_finds_the_exact_nearest_every_time(tmp_path: Path) -> None:
    """Up to EXACT_UP_TO vectors the index searches exhaustively: the top 10 are numpy's exact top 10 in every
    build (a graph over 50 random points of 8 dimensions missed one of them in about one build in seven)."""
    import numpy as np

    from soul_runtime.memory.vector_index import EXACT_UP_TO, VectorIndex

    rng = np.random.default_rng(7)
    vecs = rng.normal(size=(EXACT_UP_TO + 1, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    for build in range(40):
        vi = VectorIndex(tmp_path / f"i{build}.usearch", dim=8, embedder_id="t")
        vi.rebuild(((i, vecs[i].tobytes()) for i in range(50)), 0)
        for q in vecs[[3, 11, 25, 40]]:
            sims = vecs[:50] @ q
            top = sorted(range(50), key=lambda i: -float(sims[i]))[:10]
            gap = float(sims[top[9]] - np.sort(sims)[-11])
            got = [k for k, _ in vi.search(q, 10)]
            assert set(got) == set(top) or gap < 1e-3, (build, got, top)
    big = VectorIndex(tmp_path / "big.usearch", dim=8, embedder_id="t")
    big.rebuild(((i, vecs[i].tobytes()) for i in range(len(vecs))), 0)
    assert len(big.search(vecs[0], 10)) == 10 and big.search(vecs[0], 1)[0][0] == 0  # past the limit: the graph


def test_index_catches_up_with_writes_it_missed(tmp_path: Path) -> None:
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    m.write(req("a", Extraction(episode="first episode here", event=True)))
    m.episodic.flush()
    m.write(req("b", Extraction(episode="second episode there", event=True)))
    m.db_close = m.episodic.db.close()  # simulate a stop without saving the index
    m2 = SoulMemory(tmp_path, embedder=HashEmbedder())
    assert not m2.episodic.index.rebuilt and m2.stats()["indexed"] == 2
    m2.close()


def test_reopening_a_store_loads_its_saved_index(tmp_path: Path) -> None:
    """A closed store's index is loaded as saved when the store reopens (no rebuild, no rewrite), also after
    the save emptied the change log; writes after the reopening are saved and loaded in turn."""
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    m.write(req("a", Extraction(episode="first episode here", event=True)))
    m.close()  # saves the index and empties the change log
    idx = tmp_path / "episodic.usearch"
    saved = (idx.stat().st_ino, idx.stat().st_mtime_ns, idx.read_bytes())
    m2 = SoulMemory(tmp_path, embedder=HashEmbedder())
    assert not m2.episodic.index.rebuilt and m2.stats()["indexed"] == 1
    assert (idx.stat().st_ino, idx.stat().st_mtime_ns, idx.read_bytes()) == saved  # not rewritten
    assert m2.recall("first episode", 1, at=NOW + 60)[0].text == "first episode here"
    m2.write(req("b", Extraction(episode="second episode there", event=True)))
    m2.close()
    m3 = SoulMemory(tmp_path, embedder=HashEmbedder())
    assert not m3.episodic.index.rebuilt and m3.stats()["indexed"] == 2
    m3.close()


def test_an_index_ahead_of_its_record_is_rebuilt(tmp_path: Path, backend: str) -> None:
    """An index that holds changes its record does not (the database restored from an older copy) is not
    trusted: it is rebuilt from the record. With PostgreSQL the file is a cache that is behind the record: it
    is rebuilt from the server's rows, both episodes."""
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    m.write(req("a", Extraction(episode="first episode here", event=True)))
    m.close()
    older = (tmp_path / "episodic.sqlite").read_bytes()
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    m.write(req("b", Extraction(episode="second episode there", event=True)))
    m.close()
    (tmp_path / "episodic.sqlite").write_bytes(older)
    m2 = SoulMemory(tmp_path, embedder=HashEmbedder())
    want = 1 if backend == "local" else 2
    assert m2.episodic.index.rebuilt and m2.stats()["indexed"] == m2.stats()["episodes"] == want
    m2.close()


def test_switching_embedders_is_refused(tmp_path: Path) -> None:
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    m.close()

    class Other(HashEmbedder):
        embedder_id = "other"

    with pytest.raises(EmbedderError):
        SoulMemory(tmp_path, embedder=Other())


def test_migrations_are_ordered_and_named(tmp_path: Path) -> None:
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    m.close()
    import sqlite3
    names = [r[0] for r in sqlite3.connect(tmp_path / "episodic.sqlite").execute(
        "SELECT name FROM schema_migrations ORDER BY seq")]
    assert names == ["0001_episodes", "0002_superseded", "0003_key_text", "0004_session_index", "0005_term_counts",
                     "0006_fence", "0007_recall_cover", "0008_unit", "0009_digests"]
    with pytest.raises(StorageError):
        open_db(tmp_path / "episodic.sqlite", [("0001_other", "SELECT 1")])


def test_bad_input_raises_clear_errors_and_changes_nothing(mem: SoulMemory) -> None:
    mem.write(req("t1", Extraction(facts=(tendril("Postgres 15", "confirmed", "t1"),), episode="x happened",
                                   event=True)))
    before = mem.export()
    with pytest.raises(InvalidInput):
        mem.recall("x", 0, at=NOW)
    with pytest.raises(InvalidInput):
        mem.recall("x", 5, at=float("nan"))
    with pytest.raises(InvalidInput):
        mem.recall("x", 5, at=NOW, stores=["nonsense"])
    with pytest.raises(InvalidInput):
        mem.write(req("t2", Extraction(episode="bad \udc80 text", event=True)))
    with pytest.raises(NotFound):
        mem.fact_history("nobody", "nothing")
    with pytest.raises(NotFound):
        mem.episodic.get("ep-999")
    assert mem.export() == before


@pytest.mark.parametrize("ex", [
    Extraction(),  # chit-chat: nothing for any layer
    Extraction(episode="Maya shipped the release.", event=True),
    Extraction(facts=(tendril("Postgres 15", "stated", "t1"),)),
    Extraction(task=TaskReport("deploy", ("build", "ship"), "success", False)),
    Extraction(task=TaskReport("deploy", ("build",), "", False)),  # a plan, no run
])
def test_a_soul_without_a_store_answers_as_a_fresh_store_would(tmp_path: Path, ex: Extraction) -> None:
    """A layer's store is created only when a write needs it; the answer without it is the fresh store's."""
    from soul_runtime.memory.episodic import EpisodicStore
    from soul_runtime.memory.procedural import ProceduralStore
    from soul_runtime.memory.semantic import SemanticStore
    reqs = [req("turn-1", ex)]
    cfg = MemoryConfig()
    for cls, make in ((EpisodicStore, lambda d: EpisodicStore(d, HashEmbedder(), cfg)),
                      (SemanticStore, lambda d: SemanticStore(d, cfg)), (ProceduralStore, lambda d: ProceduralStore(d, cfg))):
        without = cls.writes_without_store(reqs)
        store = make(tmp_path / cls.__name__)
        try:
            fresh = store.apply_many(reqs)
            kept = _holds_content(store.db)  # observations, runs or episodes: the store was needed
        finally:
            store.close()
        if without is not None:
            assert without == fresh and not kept
        else:
            assert kept


def _holds_content(db) -> bool:
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
              if r[0] not in ("applied", "schema_migrations", "meta", "sqlite_sequence", "pg_mark")
              and "fts" not in r[0]]
    return any(db.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone() for t in tables)


def test_a_large_store_searches_the_rare_terms_of_a_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``prune_at`` episodes, terms most episodes share leave the lexical query (their postings would pass
    the budget); the rare ones find their episode still."""
    from soul_runtime.memory.policy_episodic import LexicalLimits
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    store = m.episodic
    store.lexical = LexicalLimits(prune_at=10, postings_budget=5)
    for i in range(40):
        extra = " about the zeppelin hangar" if i == 17 else ""
        m.write(req(f"t{i}", Extraction(episode=f"Maya reviewed the weekly budget numbers {i}{extra}.", event=True),
                    at=NOW + i * 60))
    seen: list[str] = []
    monkeypatch.setattr(store, "db", _Spy(store.db, seen))
    items = store.recall("maya weekly budget zeppelin hangar", 3, NOW + 3000)
    assert items and "zeppelin" in items[0].text
    match = next(p[0] for q, p in seen if "MATCH" in q and p)
    assert "zeppelin" in match and "maya" not in match and "budget" not in match


class _Spy:
    def __init__(self, db, seen: list) -> None:
        self._db, self._seen = db, seen

    def execute(self, sql: str, params=()):
        self._seen.append((sql, params))
        return self._db.execute(sql, params)

    def __getattr__(self, name: str):
        return getattr(self._db, name)


def test_closing_a_large_index_leaves_it_and_replays_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eviction does not rewrite a large index: its file stays as saved, the next open replays the change log."""
    from soul_runtime.memory import episodic
    monkeypatch.setattr(episodic, "REWRITE_ON_CLOSE", 2)
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    for i in range(4):
        m.write(req(f"a{i}", Extraction(episode=f"episode number {i} of the first batch", event=True)))
    m.episodic.flush()
    saved = (tmp_path / "episodic.usearch").read_bytes()
    m.write(req("b", Extraction(episode="an episode after the save", event=True)))
    m.close()
    assert (tmp_path / "episodic.usearch").read_bytes() == saved  # not rewritten on close
    m2 = SoulMemory(tmp_path, embedder=HashEmbedder())
    assert not m2.episodic.index.rebuilt and m2.stats()["indexed"] == 5
    assert m2.recall("after the save", 1, at=NOW + 60)[0].text == "an episode after the save"
    m2.close()


def test_a_query_term_is_counted_under_its_fts_token(tmp_path: Path) -> None:
    """Document counts are read under the FTS5 tokenizer's form of a term ("happy" is stored as "happi"): a
    common word is not mistaken for an absent, rare one and searched at full cost."""
    from soul_runtime.memory.episodic import fts_tokens
    from soul_runtime.memory.policy_episodic import LexicalLimits
    assert fts_tokens(["happy", "hangar", "can't", ""]) == {"happy": ("happi",), "hangar": ("hangar",),
                                                            "can't": ("can", "t"), "": ()}
    # each call tokenizes only the words not seen before, on a table emptied first (rows are numbered from 0)
    assert fts_tokens(["running", "happy"]) == {"running": ("run",), "happy": ("happi",)}
    assert fts_tokens(["jumped"]) == {"jumped": ("jump",)}
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    store = m.episodic
    store.lexical = LexicalLimits(prune_at=10, postings_budget=5)
    for i in range(30):
        extra = " near the zeppelin" if i == 11 else ""
        m.write(req(f"t{i}", Extraction(episode=f"Ana was happy with run {i}{extra}.", event=True), at=NOW + i * 60))
    seen: list = []
    store.db = _Spy(store.db, seen)  # type: ignore[assignment]
    items = store.recall("happy zeppelin", 3, NOW + 3000)
    assert items and "zeppelin" in items[0].text
    match = next(p[0] for q, p in seen if "MATCH" in q and p)
    assert match == '"zeppelin"'


def test_recall_scores_candidates_from_the_covering_index(tmp_path: Path) -> None:
    """Migration 0007 adds the index recall reads dates and flags from; the candidate query uses it alone."""
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    m.write(req("t1", Extraction(episode="Ana booked the flight to Osaka.", event=True), at=NOW))
    db = m.episodic.db
    assert "0007_recall_cover" in [r[0] for r in db.execute("SELECT name FROM schema_migrations")]
    plan = " ".join(str(r) for r in db.execute(
        "EXPLAIN QUERY PLAN SELECT rowid, at, promoted, superseded FROM episodes INDEXED BY episodes_recall "
        "WHERE rowid IN (1, 2)"))
    assert "COVERING INDEX episodes_recall" in plan
    assert [it.text for it in m.recall("flight to Osaka", 3, at=NOW + 60)] == ["Ana booked the flight to Osaka."]


def test_a_time_scoped_hit_that_is_also_a_lexical_hit_keeps_its_lexical_score(tmp_path: Path) -> None:
    """A question naming a time ("two sessions ago") whose words also match an episode of that session: the
    episode is one candidate, scored with its BM25 share and its similarity, then lifted as a scoped hit; a
    scoped episode the words do not match is scored on its similarity alone (read from its stored vector)."""

    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    texts = ["Ana repaired the violet lantern.", "Ana cooked a lemon tart.", "Ana walked to the pier.",
             "Ana painted the fence blue."]
    for i, text in enumerate(texts):  # one episode a session; the third, "two sessions ago" from the last
        m.write(req(f"t{i}", Extraction(episode=text, event=True), at=NOW + i * DAY, session=f"s{i}"))
    m.write(req("t9", Extraction(episode="Ana saw another violet lantern.", event=True), at=NOW + 4 * DAY,
                session="s1"))
    store, now = m.episodic, NOW + 5 * DAY
    query = "What about the violet lantern two sessions ago?"
    items = store.recall(query, 10, now)
    lex = store._lexical(query, 100)
    assert set(lex) == {1, 5}  # the words match the episodes of sessions s0 and s1
    key_of = {text: k for k, text in store.db.execute("SELECT rowid, summary FROM episodes")}
    scoped = {key_of["Ana cooked a lemon tart."], 5}  # session s1, two before the newest (s3)
    by_key = {int(it.id[3:]): it.score for it in items}
    # the scoped episodes first, lifted to [0.5, 1]; the one the words also match above the one they do not
    assert {int(it.id[3:]) for it in items[:2]} == scoped
    assert by_key[5] > by_key[key_of["Ana cooked a lemon tart."]] >= 0.5
    # the other lexical hit (session s0) keeps its lexical rank: above every unscoped episode the words miss
    assert 0.5 > by_key[1] > max(v for k, v in by_key.items() if k not in scoped | {1})
    m.close()


def test_the_lexical_search_finds_every_word_of_the_question_as_the_text_was_stemmed(tmp_path: Path) -> None:
    """The words of a question reach FTS5 as written, so its stemmer reads them as it read the stored text:
    a word the engine's own light stemmer and FTS5's Porter stemmer would both cut ("microservices" →
    "microservic" → "microserv") still finds the episodes that hold it, in a small store and in a pruned one."""
    from soul_runtime.memory.policy_episodic import LexicalLimits
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    texts = ["We split the billing monolith into microservices.", "Ana's databases moved to Postgres 16.",
             "Running the nightly job took 40 minutes.", "Caroline's sister lives in Lund."]
    for i, text in enumerate(texts):
        m.write(req(f"t{i}", Extraction(episode=text, event=True), at=NOW + i))
    store = m.episodic
    for pruned in (False, True):
        if pruned:
            store.lexical = LexicalLimits(prune_at=2, postings_budget=10)
        for query, key in (("How many microservices are there?", 1), ("Which databases did Ana move?", 2),
                           ("How long was the running of the job?", 3), ("Where does Caroline's sister live?", 4)):
            assert key in store._lexical(query, 10), (pruned, query, store._match(query))
    m.close()


def test_the_size_lexical_pruning_reads_follows_inserts_and_deletes(tmp_path: Path) -> None:
    """The store size the lexical query is pruned by is remembered between recalls: it follows inserts, and a
    forget that removes the newest episodes brings a store back under ``prune_at`` (every term searched)."""
    from soul_runtime.memory.policy_episodic import LexicalLimits
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    store = m.episodic
    store.lexical = LexicalLimits(prune_at=12, postings_budget=4)
    query = "violet lantern pier"
    for i in range(14):
        word = ["violet", "lantern", "pier"][i % 3]
        m.write(req(f"t{i}", Extraction(episode=f"Ana noted item {i} near the {word}.", event=True), at=NOW + i))
        m.recall(query, 3, at=NOW + 60)
        assert store._max_key == store.db.execute("SELECT MAX(rowid) FROM episodes").fetchone()[0] == i + 1
    assert store._match(query) != '"violet" OR "lantern" OR "pier"'  # 14 episodes: pruned
    m.forget_where(ids=("ep-13", "ep-14", "ep-12"))
    assert store._match(query) == '"violet" OR "lantern" OR "pier"'  # 11: every term
    assert store._max_key == 11
    m.close()


def test_common_words_are_searched_as_a_pair_in_a_large_store(tmp_path: Path) -> None:
    """Two words each too common to search alone are searched together: the episode holding both is found, at
    the cost of the episodes holding both rather than either."""
    from soul_runtime.memory.policy_episodic import LexicalLimits
    m = SoulMemory(tmp_path, embedder=HashEmbedder())
    store = m.episodic
    store.lexical = LexicalLimits(prune_at=10, postings_budget=10)
    for i in range(30):
        word = "violet" if i % 2 else "lantern"
        text = "Ana saw the violet lantern by the pier." if i == 13 else f"Ana noted item {i} near the {word}."
        m.write(req(f"t{i}", Extraction(episode=text, event=True), at=NOW + i * 60))
    seen: list = []
    store.db = _Spy(store.db, seen)  # type: ignore[assignment]
    lex = store._lexical("violet lantern", 5)
    match = next(p[0] for q, p in seen if "MATCH" in q and p)
    assert " AND " in match and match.startswith("(")
    assert max(lex, key=lambda k: lex[k]) == 14 and set(lex) == {14}  # only the episode holding both matched


def test_semantic_recall_names_the_entity_whole_and_ranks_subject_only_hits_last(mem: SoulMemory) -> None:
    """A multi-word entity is hit only when the query names all of it; a fact that shares nothing with the
    query but its subject's name is background: it scores subject_only_score, below a fact that matches
    what is asked and below an episode that does."""
    facts = (FactCandidate("home office", "desk", "a walnut standing desk", "confirmed", ("f1/u",), "home office", "desk"),
             FactCandidate("rui", "favourite_tea", "sencha", "confirmed", ("f2/u",), "Rui", "favourite tea"),
             FactCandidate("rui", "bike", "a red gravel bike", "confirmed", ("f3/u",), "Rui", "bike"))
    mem.write(req("f1", Extraction(facts=facts, episode="Rui described the home office, the tea and the bike.", event=True)))
    mem.write(req("e1", Extraction(episode="Rui rode the gravel bike to the coast on Sunday.", event=True), NOW + 60))
    sem = mem.semantic.recall("which office chair did you order", 10)
    assert sem == []  # "office" alone does not name "home office"
    assert [it.id for it in mem.semantic.recall("what is in the home office", 10)] == ["home office:desk"]
    got = {it.id: it.score for it in mem.semantic.recall("where did Rui ride the bike", 10)}
    assert got["rui:favourite_tea"] == MemoryConfig().subject_only_score  # Rui named, nothing about tea asked
    assert got["rui:bike"] > 0.8  # Rui named and the bike asked about
    order = [it.id for it in mem.recall("where did Rui ride the bike", 10, at=NOW + DAY)]
    assert order.index("rui:bike") < order.index("rui:favourite_tea")
    assert order.index("ep-2") < order.index("rui:favourite_tea")  # the episode that matches what is asked first


def test_a_replaced_fact_supersedes_exactly_the_episodes_of_its_messages(tmp_path: Path) -> None:
    """Superseding by source id picks rows in SQL (the id's bytes in the packed sources) and confirms on the
    unpacked list: an id that only appears inside a longer one is left alone."""
    from soul_runtime.memory.episodic import EpisodicStore
    st = EpisodicStore(tmp_path / "s", HashEmbedder(), MemoryConfig())
    try:
        texts = {"t1": "Maya moved the billing service to Postgres.", "xt1": "Maya renamed the staging cluster.",
                 "t2": "Maya booked the venue for June.", "t3": "Maya fixed the flaky deploy job."}
        for key, text in texts.items():
            st.apply_many([req(key, Extraction(episode=text, event=True))])
        # a later write carries the marks: the messages of t1 and t3 stated values that were just replaced
        st.apply_many([req("t4", Extraction(episode="Maya adopted a beagle named Biscuit.", event=True))],
                      supersede_sources=["t1/u", "t3/u"])
        marked = {unpack_sources(src): bool(sup) for src, sup in
                  st.db.execute("SELECT sources, superseded FROM episodes").fetchall()}
        assert marked == {"t1/u": True, "xt1/u": False, "t2/u": False, "t3/u": True, "t4/u": False}
    finally:
        st.close()


def unpack_sources(blob: bytes) -> str:
    return ",".join(msgpack.unpackb(blob))
