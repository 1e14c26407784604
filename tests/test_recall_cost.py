"""What a recall in a large store costs: its candidates read in few statements, scored on arrays, large local
databases memory-mapped; and none of it changes what is recalled."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from soul_runtime.clock import DAY
from soul_runtime.memory import sqlite_db
from soul_runtime.memory.episodic import MIGRATIONS, top_rounded
from soul_runtime.memory.policy_episodic import LexicalLimits, fused_score, later_figures_first, recency_weight
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.records import Extraction, WriteRequest
from tests.fakes import HashEmbedder

NOW = 1_780_000_000.0
WORDS = ("harbour lantern violet piano marathon sourdough Lisbon kayak chess tulip comet ferry quartz willow "
         "orchard saxophone glacier ember canyon meadow").split()


class _Spy:
    def __init__(self, db, seen: list) -> None:
        self._db, self._seen = db, seen

    def execute(self, sql: str, params=()):
        self._seen.append(sql)
        return self._db.execute(sql, params)

    def __getattr__(self, name: str):
        return getattr(self._db, name)


def test_top_rounded_keeps_what_a_full_sort_keeps() -> None:
    """Sorting only the candidates top_rounded returns gives the same top k, ties broken by id after rounding to
    6 decimals, as sorting every candidate (scores drawn with many near-ties at the cut)."""
    rng = random.Random(5)
    for trial in range(300):
        n, k = rng.randint(1, 80), rng.randint(1, 20)
        base = [round(rng.random(), 3) for _ in range(n)]
        scores = np.array([b + rng.choice((0.0, 4e-7, -4e-7, 6e-7, 1e-6, 3e-6)) for b in base])
        scores[rng.sample(range(n), n // 5)] = -np.inf  # candidates left out (decayed, superseded, below min)
        ids = [f"ep-{rng.randint(1, 10_000)}" for _ in range(n)]

        def top(idx: list[int], ids: list[str] = ids, scores: np.ndarray = scores, k: int = k) -> list[tuple]:
            return sorted((-round(float(scores[i]), 6), ids[i], i) for i in idx)[:k]

        every = [i for i in range(n) if np.isfinite(scores[i])]
        assert top(top_rounded(scores, k)) == top(every), trial
        assert len(top_rounded(scores, k)) <= len(every)


def _filled(path: Path, n: int, *, seed: int, limits: LexicalLimits | None = None) -> tuple[SoulMemory, float]:
    """A soul's memory with ``n`` episodes of four random words each, a day before the returned time."""
    m = SoulMemory(path, embedder=HashEmbedder())
    if limits is not None:
        m.episodic.lexical = limits
    rng = random.Random(seed)
    for i in range(n):
        text = f"Ana {' '.join(rng.sample(WORDS, 4))} note {i}."
        m.write(WriteRequest(turn_key=f"t{i}", now=NOW + i * 600, actor="ana", sources=(f"m{i}",),
                             extraction=Extraction(episode=text, event=True), session=f"s{i // 20}"))
    return m, NOW + n * 600 + DAY


def test_lexical_and_dense_hits_are_scored_on_their_true_similarities(tmp_path: Path) -> None:
    """In a store larger than the candidate lists, a lexical-only hit gets its exact dense similarity (from its
    stored vector) and its BM25 score normalised by the best one; the candidates' rows are read in a handful of
    statements, not one per candidate."""
    m, now = _filled(tmp_path, 240, seed=3, limits=LexicalLimits(prune_at=50, postings_budget=40))
    store = m.episodic
    query = "violet comet over the glacier"
    qv = store.embedder.embed([query])[0]
    seen: list = []
    store.db = _Spy(store.db, seen)  # type: ignore[assignment]
    items = store.recall(query, 8, now, query_vector=qv)
    store.db = store.db._db
    assert len(items) == 8 and len(seen) <= 8, seen  # match terms, lexical hits with rows, dense rows, kept rows
    lexical = store._lexical_rows(query, 60)
    dense = dict(store.index.search(qv, 60))
    as_lexical_only = store._score(query, 8, now, qv, {}, lexical)  # no dense hit at all

    def exact(key: int) -> tuple[float, float]:
        blob, at = store.db.execute("SELECT vector, at FROM episodes WHERE rowid = ?", (key,)).fetchone()
        return float(np.frombuffer(blob, np.float32) @ qv), float(at)

    for got, dense_hits in ((items, dense), (as_lexical_only, {})):
        assert got
        # the candidates as the store ranks them: the lexical hits (BM25 order), then the other dense hits
        keys = [h[0] for h in lexical] + sorted(k for k in dense_hits if k not in {h[0] for h in lexical})
        sims = [dense_hits.get(k, exact(k)[0]) for k in keys]
        lex = [h[1] for h in lexical] + [0.0] * (len(keys) - len(lexical))
        fused = dict(zip(keys, fused_score(np.array(sims), np.array(lex), store.cfg).tolist(), strict=True))
        wants, ats = [], []
        for it in got:
            sim, at = exact(int(it.id[3:]))
            wants.append(fused[int(it.id[3:])] * recency_weight(at, now, store.cfg))
            ats.append(at)
            assert it.at == at
        # then a later figure ranks above an earlier one it restates ("note 12" … "note 57" here)
        wants = later_figures_first(query, [it.text for it in got], ats, wants)
        for it, want in zip(got, wants, strict=True):
            if not dense_hits:  # similarities from the stored vectors: only rounding differs
                assert it.score == pytest.approx(want, abs=2e-6)
            else:
                assert it.score == pytest.approx(want, abs=2e-2)  # the index's f16 similarity may swap near ranks
    m.close()


def test_a_large_local_database_is_memory_mapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MMAP_AT a local database is opened with a memory map; a small one, or one on shared storage, is not."""
    def mapped(path: Path) -> int:
        con = sqlite_db.open_db(path, MIGRATIONS)
        try:
            return int(con.execute("PRAGMA mmap_size").fetchone()[0])
        finally:
            con.close()

    path = tmp_path / "episodic.sqlite"
    con = sqlite_db.open_db(path, MIGRATIONS)
    with sqlite_db.transaction(con):
        con.execute("CREATE TABLE filler (x BLOB)")
        con.executemany("INSERT INTO filler VALUES (?)", [(bytes(2000),) for _ in range(200)])
    con.close()
    assert mapped(path) == 0  # ≈ 400 KB: below the default threshold
    monkeypatch.setattr(sqlite_db, "MMAP_AT", 100_000)
    assert mapped(path) == sqlite_db.MMAP_SIZE
    monkeypatch.setattr(sqlite_db, "_storage", ["shared"])
    assert mapped(tmp_path / "other.sqlite") == 0
    con = sqlite_db.open_db(tmp_path / "other.sqlite", MIGRATIONS)
    with sqlite_db.transaction(con):
        con.execute("CREATE TABLE filler (x BLOB)")
        con.executemany("INSERT INTO filler VALUES (?)", [(bytes(2000),) for _ in range(200)])
    con.close()
    assert mapped(tmp_path / "other.sqlite") == 0


def test_a_large_store_searches_lexically_beside_the_dense_search_and_recalls_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From ``PARALLEL_AT`` episodes on, the lexical query runs on a second thread while the dense search runs;
    what is recalled is exactly what the one-thread path recalls, and an error of either search still reaches
    the caller."""
    import threading

    from soul_runtime.memory import episodic
    m, now = _filled(tmp_path, 120, seed=5)
    store = m.episodic
    queries = ["violet comet over the glacier", "the ferry to Lisbon", "chess by the willow", "nothing here at all"]
    threads: list[str] = []
    real = store._lexical_rows

    def spied(query: str, limit: int):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        return real(query, limit)
    monkeypatch.setattr(store, "_lexical_rows", spied)
    store.recall(queries[0], 8, now)  # learns the store's size
    monkeypatch.setattr(episodic, "PARALLEL_AT", 10**9)
    threads.clear()
    alone = [store.recall(q, 8, now) for q in queries]
    assert threads == ["MainThread"] * len(queries)
    monkeypatch.setattr(episodic, "PARALLEL_AT", 100)
    threads.clear()
    timings: dict[str, float] = {}
    beside = [store.recall(q, 8, now, timings=timings) for q in queries]
    assert all(name.startswith("lexical") for name in threads) and len(threads) == len(queries)
    assert beside == alone and any(alone)
    assert timings["lexical"] > 0 and timings["dense"] > 0

    def broken(query: str, limit: int):  # type: ignore[no-untyped-def]
        raise sqlite_db.StorageError("disk went away")
    monkeypatch.setattr(store, "_lexical_rows", broken)
    with pytest.raises(sqlite_db.StorageError, match="disk went away"):
        store.recall(queries[1], 8, now)
    m.close()
