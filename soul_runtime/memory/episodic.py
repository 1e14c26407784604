"""The episodic layer: dated 1–2 sentence events, hybrid dense + lexical recall with recency.

Record of truth: ``episodic.sqlite`` (episodes with their vectors, an FTS5 table
for the lexical side, a change log for the index). Cache: ``episodic.usearch``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from soul_runtime.config import MemoryConfig
from soul_runtime.embedding.ahead import EmbeddingAhead
from soul_runtime.embedding.base import Embedder
from soul_runtime.errors import EmbedderError, InvalidInput
from soul_runtime.memory import fence
from soul_runtime.memory.episodic_erasure import EpisodeErasure
from soul_runtime.memory.episodic_schema import DERIVED, MIGRATIONS
from soul_runtime.memory.episodic_search import EpisodeSearch, _Hit, top_rounded
from soul_runtime.memory.episodic_table import INDEXED
from soul_runtime.memory.episodic_tokens import FTS_TOKENIZE, fts_tokens
from soul_runtime.memory.episodic_writes import (
    MERGE_WINDOW,
    SAVE_EVERY,
    UNIT_KEY,
    EpisodeWrites,
    index_key_text,
    writes_without_store,
)
from soul_runtime.memory.layer_db import dump_tables, load_tables
from soul_runtime.memory.layer_store import LayerStore
from soul_runtime.memory.policy_episodic import LEXICAL, LexicalLimits
from soul_runtime.memory.sqlite_db import memory_bytes, transaction
from soul_runtime.memory.vector_index import IndexParams, VectorIndex
from soul_runtime.records import RecalledItem, Store

__all__ = ["CANDIDATES", "FTS_TOKENIZE", "MERGE_WINDOW", "MIGRATIONS", "PARALLEL_AT", "REWRITE_ON_CLOSE",
           "SAVE_EVERY", "EpisodicStore", "fts_tokens", "index_key_text", "top_rounded", "writes_without_store"]

CANDIDATES = 60
PARALLEL_AT = 5000
"""From this many episodes on, a recall's lexical query runs on a second thread beside the dense search (SQLite
lets go of the GIL while it steps; the two searches take about as long as each other at 100,000 episodes)."""
_pool: list[ThreadPoolExecutor] = []
_pool_lock = threading.Lock()


def _searchers() -> ThreadPoolExecutor:
    """The threads that run large stores' lexical queries (one per concurrent recall, up to 8)."""
    with _pool_lock:
        if not _pool:
            _pool.append(ThreadPoolExecutor(8, thread_name_prefix="lexical"))
        return _pool[0]


REWRITE_ON_CLOSE = 1000  # vectors: a smaller index is saved whole on close (cheaper than a replay later)


class EpisodicStore(EpisodeWrites, EpisodeErasure, EpisodeSearch, LayerStore):
    """One soul's episodes: the layer's database and, beside it, its vector index. Not thread-safe: its owner
    serialises calls."""

    store = Store.EPISODIC
    MIGRATIONS = MIGRATIONS
    TABLES = ("episodes", "sessions", "applied")
    COUNTED = "episodes"
    DERIVED = DERIVED

    def __init__(self, directory: Path, embedder: Embedder, cfg: MemoryConfig,
                 index_params: IndexParams | None = None, lexical: LexicalLimits = LEXICAL) -> None:
        self.embedder = embedder
        self.ahead = EmbeddingAhead(embedder)
        self.index_params = index_params
        self.lexical = lexical
        super().__init__(directory, cfg)

    def _open(self) -> None:
        super()._open()
        self.epoch = fence.current(self.db)
        """The newest fencing epoch this instance has seen: its index is not saved once a newer owner wrote."""
        self._check_embedder()
        self.index = VectorIndex(self.dir / "episodic.usearch", dim=self.embedder.dim,
                                 embedder_id=self.embedder.embedder_id, params=self.index_params)
        self._unsaved = 0
        self._doc_freq: dict[str, tuple[int, int]] = {}  # term -> (episodes holding it, store size then)
        self._max_key: int | None = None
        """The largest episode row key (the store's size to lexical pruning), once read; kept by this instance's
        inserts, forgotten on a delete (the soul's one owner writes its store)."""
        self._open_index()

    # ---- opening ---------------------------------------------------------------------
    def _check_embedder(self) -> None:
        want = {"embedder_id": self.embedder.embedder_id, "dim": str(self.embedder.dim)}
        with transaction(self.db):  # the first opener records its embedder (two may open a new soul at once)
            self.db.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)", list(want.items()))
        row = dict(self.db.execute("SELECT key, value FROM meta").fetchall())
        if row.get("embedder_id") != want["embedder_id"] or row.get("dim") != want["dim"]:
            raise EmbedderError(f"{self.dir}: episodes were embedded with {row.get('embedder_id')} "
                                f"({row.get('dim')}-d), not {want['embedder_id']} ({want['dim']}-d); "
                                "re-embed (export/import) to switch embedders")

    def _open_index(self) -> None:
        last = self._last_seq()
        if self.index.load() and self.index.applied_seq <= last:
            changes = self.db.execute("SELECT seq, op, key FROM index_log WHERE seq > ? ORDER BY seq",
                                      (self.index.applied_seq,)).fetchall()
            self.index.replay(changes, self._vector_blob)
            count = self.db.execute(f"SELECT COUNT(*) FROM episodes WHERE {INDEXED}").fetchone()[0]
            if len(self.index) == count:
                return
        self.index.rebuild(self.db.execute(f"SELECT rowid, vector FROM episodes WHERE {INDEXED} ORDER BY rowid"), last)
        if last or len(self.index):  # a store that never indexed an episode has nothing to save (a new soul's)
            self.flush()

    def fence(self, epoch: int) -> None:
        super().fence(epoch)
        self.epoch = max(self.epoch, epoch)

    def _vector_blob(self, key: int) -> bytes | None:
        r = self.db.execute("SELECT vector FROM episodes WHERE rowid = ?", (key,)).fetchone()
        return r[0] if r else None

    def memory_bytes(self) -> int:
        """What this open store holds in memory: its vector index and its SQLite page cache."""
        return self.index.memory_bytes() + memory_bytes(self.db)

    def close(self) -> None:
        """Close. A large index that was saved before is not rewritten: the change log since its last save
        stays in SQLite and is replayed on the next open (eviction costs the changes, not the index)."""
        if self._unsaved and (len(self.index) <= REWRITE_ON_CLOSE or not self.index.path.exists()):
            self.flush()
        self.db.close()

    # ---- reads -----------------------------------------------------------------------
    def recall(self, query: str, k: int, now: float, query_vector: np.ndarray | None = None,
               timings: dict[str, float] | None = None) -> list[RecalledItem]:
        """Hybrid dense + lexical candidates, scored, weighted by recency, decayed ones left out. A question
        that names a time ("three sessions ago", "yesterday", "last week") recalls what happened then first.
        ``timings``: if given, milliseconds of each stage are added to it (embed, dense, lexical, score)."""
        if k <= 0:
            raise InvalidInput("k must be >= 1")
        clock = time.perf_counter
        t0 = clock()
        if query_vector is None:
            query_vector = self.embedder.embed([query])[0]
        t1 = clock()
        n = max(CANDIDATES, 3 * k)
        if self._size() >= PARALLEL_AT:  # beside the dense search, on a second thread
            lex_s = [0.0]

            def lexical_rows() -> list[_Hit]:
                a = clock()
                try:
                    return self._lexical_rows(query, n)
                finally:
                    lex_s[0] = clock() - a
            pending = _searchers().submit(lexical_rows)
            try:
                dense = dict(self.index.search(query_vector, n))
            finally:
                t2 = clock()
                lexical = pending.result()  # not left running on the store's connection, whatever happened
            t3 = clock()
            lex_ms = lex_s[0] * 1000
        else:
            dense = dict(self.index.search(query_vector, n))
            t2 = clock()
            lexical = self._lexical_rows(query, n)
            t3 = clock()
            lex_ms = (t3 - t2) * 1000
        items = self._score(query, k, now, query_vector, dense, lexical)
        if items:  # a question that gathers what was said over time: the digests that hold most of it
            items = sorted(items + self._digest_items(query, items[0].score), key=lambda it: (-it.score, it.id))[:k]
        if timings is not None:  # each search's own time (they overlap in a large store)
            for name, ms in (("embed", (t1 - t0) * 1000), ("dense", (t2 - t1) * 1000), ("lexical", lex_ms),
                             ("score", (clock() - t3) * 1000)):
                timings[name] = timings.get(name, 0.0) + ms
        return items

    def stats(self) -> dict[str, int]:
        n = self.db.execute("SELECT COUNT(*) FROM episodes").fetchone()[0]
        p = self.db.execute("SELECT COUNT(*) FROM episodes WHERE promoted = 1").fetchone()[0]
        size = self.file_bytes()
        return {"episodes": int(n), "promoted_episodes": int(p), "indexed": len(self.index), "episodic_bytes": size}

    # ---- export / import -------------------------------------------------------------
    def export(self) -> dict[str, Any]:
        eps = self.db.execute("SELECT rowid, at, actor, summary, sources, entities, tags, session, session_index, "
                              "promoted, turn_key, vector, superseded, key_text FROM episodes ORDER BY rowid").fetchall()
        return {"embedder_id": self.embedder.embedder_id, "dim": self.embedder.dim,
                "episodes": [list(r) for r in eps],
                **dump_tables(self.db, ("sessions", "applied"))}

    def import_(self, data: dict[str, Any]) -> None:
        if data.get("embedder_id") != self.embedder.embedder_id or data.get("dim") != self.embedder.dim:
            raise EmbedderError(f"export was embedded with {data.get('embedder_id')}, this store uses "
                                f"{self.embedder.embedder_id}")
        if not self.is_empty():
            raise InvalidInput("import needs an empty soul: this one already has episodes")
        self._max_key = None
        with transaction(self.db):
            for r in data["episodes"]:
                if len(r[11]) != 4 * self.embedder.dim:
                    raise InvalidInput(f"episode {r[0]}: vector has the wrong size")
                self.db.execute("INSERT INTO episodes (rowid, at, actor, summary, sources, entities, tags, session,"
                                " session_index, promoted, turn_key, vector, superseded, key_text)"
                                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", r)
                self.db.execute("INSERT INTO episodes_fts (rowid, summary) VALUES (?, ?)", (r[0], r[13] or r[3]))
                self._log("add", r[0])
            # a unit that shares its message's vector (the same vector as another row of its message)
            heads: dict[tuple[str, bytes], int] = {}
            for turn_key, vec in self.db.execute("SELECT turn_key, vector FROM episodes"):
                heads[(str(turn_key or "").split(UNIT_KEY)[0], vec)] = heads.get(
                    (str(turn_key or "").split(UNIT_KEY)[0], vec), 0) + 1
            self.db.executemany("UPDATE episodes SET unit = 1 WHERE rowid = ?", [
                (r[0],) for r in self.db.execute("SELECT rowid, turn_key, vector FROM episodes WHERE "
                                                 "instr(turn_key, ?) > 0", (UNIT_KEY,))
                if heads[(str(r[1]).split(UNIT_KEY)[0], r[2])] > 1])
            load_tables(self.db, data, ("sessions", "applied"))
        self.index.rebuild(self.db.execute(f"SELECT rowid, vector FROM episodes WHERE {INDEXED} ORDER BY rowid"),
                           self._last_seq())
        self.flush()
