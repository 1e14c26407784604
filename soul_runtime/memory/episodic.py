"""The episodic layer: dated 1–2 sentence events, hybrid dense + lexical recall with recency.

Record of truth: ``episodic.sqlite`` (episodes with their vectors, an FTS5 table
for the lexical side, a change log for the index). Cache: ``episodic.usearch``.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from soul_runtime.config import MemoryConfig
from soul_runtime.embedding.base import Embedder
from soul_runtime.errors import EmbedderError, InvalidInput, NotFound
from soul_runtime.memory import fence
from soul_runtime.memory.erasure import Erased, ForgetQuery, compact, is_episode_id, unlink_files
from soul_runtime.memory.layer_db import (
    applied_writes,
    drop_applied,
    dump_tables,
    file_bytes,
    is_empty,
    load_tables,
    pack,
    record_applied,
    unpack,
)
from soul_runtime.memory.policy_episodic import (
    LEXICAL,
    LexicalLimits,
    decide_episode,
    hybrid_score,
    in_recall,
    is_near_duplicate,
    lexical_clauses,
    past_ttl,
    recency_weight,
)
from soul_runtime.memory.policy_semantic import merge_sources
from soul_runtime.memory.sqlite_db import memory_bytes, open_db, transaction
from soul_runtime.memory.vector_index import IndexParams, VectorIndex
from soul_runtime.records import Episode, MemoryWrite, Op, RecalledItem, Store, WriteRequest
from soul_runtime.text import check_write_request, terms
from soul_runtime.timeref import TimeScope, query_scope

MIGRATIONS = [
    ("0001_episodes", """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE episodes (
            rowid INTEGER PRIMARY KEY, at REAL NOT NULL, actor TEXT NOT NULL, summary TEXT NOT NULL,
            sources BLOB NOT NULL, entities BLOB NOT NULL, tags BLOB NOT NULL, session TEXT NOT NULL,
            session_index INTEGER NOT NULL, promoted INTEGER NOT NULL DEFAULT 0, turn_key TEXT NOT NULL,
            vector BLOB NOT NULL);
        CREATE INDEX episodes_at ON episodes(at);
        CREATE INDEX episodes_session ON episodes(session_index);
        CREATE INDEX episodes_turn ON episodes(turn_key);
        CREATE VIRTUAL TABLE episodes_fts USING fts5(summary, tokenize='porter unicode61');
        CREATE TABLE sessions (name TEXT PRIMARY KEY, idx INTEGER NOT NULL UNIQUE, first_at REAL NOT NULL);
        CREATE TABLE index_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL, key INTEGER NOT NULL);
        CREATE TABLE applied (turn_key TEXT PRIMARY KEY, writes BLOB NOT NULL)
    """),
    ("0002_superseded", """
        ALTER TABLE episodes ADD COLUMN superseded INTEGER NOT NULL DEFAULT 0
    """),
    ("0003_key_text", """
        ALTER TABLE episodes ADD COLUMN key_text TEXT NOT NULL DEFAULT ''
    """),
    ("0004_session_index", """
        CREATE INDEX episodes_session_name ON episodes(session, rowid)
    """),
    ("0005_term_counts", """
        CREATE VIRTUAL TABLE episodes_vocab USING fts5vocab(episodes_fts, 'row')
    """),
    ("0006_fence", fence.MIGRATION[1]),
    ("0007_recall_cover", """
        CREATE INDEX episodes_recall ON episodes(rowid, at, promoted, superseded)
    """),
]
"""0007: recall scores its candidates on date and flags read from this covering index. An episode's row holds
its vector and text, and its later columns sit on overflow pages; reading them per candidate dominated recall
in a large store."""

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


SAVE_EVERY = 2000
REWRITE_ON_CLOSE = 1000  # vectors: a smaller index is saved whole on close (cheaper than a replay later)
MERGE_WINDOW = 200  # latest episodes of a session a new one is compared with



_Hit = tuple[int, float, float, int, int, bytes]
"""A recall candidate read with its row: (row key, lexical score, at, promoted, superseded, vector)."""


@dataclass(frozen=True)
class _Row:
    rowid: int
    episode: Episode


class EpisodicStore:
    """One soul's episodes. Not thread-safe: its owner serialises calls."""

    store = Store.EPISODIC

    def __init__(self, directory: Path, embedder: Embedder, cfg: MemoryConfig,
                 index_params: IndexParams | None = None, lexical: LexicalLimits = LEXICAL) -> None:
        self.dir = Path(directory)
        self.embedder = embedder
        self.cfg = cfg
        self.index_params = index_params
        self.lexical = lexical
        self._open()

    def _open(self) -> None:
        self.db = open_db(self.dir / "episodic.sqlite", MIGRATIONS)
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

    def _last_seq(self) -> int:
        """The last change-log number ever given out. AUTOINCREMENT keeps it in ``sqlite_sequence`` after a
        flush emptied the log (``MAX(seq)`` would then be 0, and every saved index look newer than the record:
        each opening rebuilt and rewrote it)."""
        r = self.db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'index_log'").fetchone()
        return int(r[0]) if r else 0

    def _open_index(self) -> None:
        last = self._last_seq()
        if self.index.load() and self.index.applied_seq <= last:
            changes = self.db.execute("SELECT seq, op, key FROM index_log WHERE seq > ? ORDER BY seq",
                                      (self.index.applied_seq,)).fetchall()
            self.index.replay(changes, self._vector_blob)
            count = self.db.execute("SELECT COUNT(*) FROM episodes").fetchone()[0]
            if len(self.index) == count:
                return
        self.index.rebuild(self.db.execute("SELECT rowid, vector FROM episodes ORDER BY rowid"), last)
        self.flush()

    def _vector_blob(self, key: int) -> bytes | None:
        r = self.db.execute("SELECT vector FROM episodes WHERE rowid = ?", (key,)).fetchone()
        return r[0] if r else None

    def flush(self) -> None:
        """Save the index and drop the change log it now holds (not when a newer owner took the soul over:
        the index file is then theirs)."""
        if fence.current(self.db) > self.epoch:
            return
        self.index.save()
        with transaction(self.db):
            self.db.execute("DELETE FROM index_log WHERE seq <= ?", (self.index.applied_seq,))
        self._unsaved = 0

    def memory_bytes(self) -> int:
        """What this open store holds in memory: its vector index and its SQLite page cache."""
        return self.index.memory_bytes() + memory_bytes(self.db)

    def close(self) -> None:
        """Close. A large index that was saved before is not rewritten: the change log since its last save
        stays in SQLite and is replayed on the next open (eviction costs the changes, not the index)."""
        if self._unsaved and (len(self.index) <= REWRITE_ON_CLOSE or not self.index.path.exists()):
            self.flush()
        self.db.close()

    # ---- rows ------------------------------------------------------------------------
    @staticmethod
    def _episode(r: sqlite3.Row | tuple[Any, ...]) -> Episode:
        return Episode(id=f"ep-{r[0]}", at=r[1], actor=r[2], summary=r[3], sources=tuple(unpack(r[4])),
                       entities=tuple(unpack(r[5])), tags=tuple(unpack(r[6])), session=r[7],
                       session_index=r[8], promoted=bool(r[9]))

    _COLS = "rowid, at, actor, summary, sources, entities, tags, session, session_index, promoted"

    def _rows(self, where: str = "1", params: tuple[Any, ...] = ()) -> list[Episode]:
        sql = f"SELECT {self._COLS} FROM episodes WHERE {where} ORDER BY at, rowid"
        return [self._episode(r) for r in self.db.execute(sql, params)]

    def get(self, episode_id: str) -> Episode:
        key = _key(episode_id)
        rows = self._rows("rowid = ?", (key,))
        if not rows:
            raise NotFound(f"no episode {episode_id}")
        return rows[0]

    def _session_index(self, name: str, at: float) -> int:
        r = self.db.execute("SELECT idx FROM sessions WHERE name = ?", (name,)).fetchone()
        if r:
            return int(r[0])
        idx = int(self.db.execute("SELECT COALESCE(MAX(idx), 0) + 1 FROM sessions").fetchone()[0])
        self.db.execute("INSERT INTO sessions VALUES (?, ?, ?)", (name, idx, at))
        return idx

    def _log(self, op: str, key: int) -> int:
        cur = self.db.execute("INSERT INTO index_log (op, key) VALUES (?, ?)", (op, key))
        return int(cur.lastrowid or 0)

    # ---- writes ----------------------------------------------------------------------
    @staticmethod
    def writes_without_store(reqs: list[WriteRequest]) -> list[list[MemoryWrite]] | None:
        return writes_without_store(reqs)

    def apply(self, req: WriteRequest) -> list[MemoryWrite]:
        return self.apply_many([req])[0]

    def apply_many(self, reqs: list[WriteRequest], *, promote_turns: list[str] | None = None,
                   supersede_sources: list[str] | None = None) -> list[list[MemoryWrite]]:
        """Apply the episodic writes of several exchanges in one durable transaction.

        Idempotent per ``turn_key``: a turn applied before returns its recorded writes.
        ``promote_turns``: turns whose episodes fed a promoted fact (they stop decaying).
        ``supersede_sources``: message ids of fact values just replaced or retracted;
        episodes derived from them leave recall (they would contradict the new value).
        """
        for req in reqs:
            check_write_request(req)
        out: list[list[MemoryWrite] | None] = [None] * len(reqs)
        todo: list[tuple[int, WriteRequest]] = []
        for i, req in enumerate(reqs):
            prev = applied_writes(self.db, req.turn_key)
            if prev is not None:
                out[i] = prev
            else:
                todo.append((i, req))
        wanted = [(i, r, decide_episode(r.extraction)) for i, r in todo]
        texts = [r.extraction.episode.strip()[: self.cfg.max_episode_chars] for _, r, d in wanted if d.write]
        keys = [index_key_text(r) for _, r, d in wanted if d.write]
        vectors = self.embedder.embed(keys) if keys else np.zeros((0, self.embedder.dim), np.float32)
        index_ops: list[tuple[str, int, np.ndarray | None, int]] = []
        vi = 0
        with transaction(self.db):
            for req in reqs:
                fence.check(self.db, req.epoch, f"soul {self.dir.name} episodic")
                self.epoch = max(self.epoch, req.epoch)
            for i, req, decision in wanted:
                writes: list[MemoryWrite] = []
                if decision.write:
                    writes.append(self._write_one(req, texts[vi], keys[vi], vectors[vi], decision.reason, index_ops))
                    vi += 1
                else:
                    writes.append(_noop(decision.reason))
                record_applied(self.db, req.turn_key, writes)
                out[i] = writes
            self._mark(promote_turns or [], supersede_sources or [])
        if self._max_key is not None:  # committed: the new rows' keys
            self._max_key = max([self._max_key] + [key for op, key, _, _ in index_ops if op == "add"])
        for op, key, vec, seq in index_ops:  # the record is durable; now the cache
            if op == "add" and vec is not None:
                self.index.add(key, vec, seq)
            else:
                self.index.remove(key, seq)
        self._unsaved += len(index_ops)
        if self._unsaved >= SAVE_EVERY:
            self.flush()
        return [o or [] for o in out]

    def _write_one(self, req: WriteRequest, text: str, key_text: str, vec: np.ndarray, reason: str,
                   index_ops: list[tuple[str, int, np.ndarray | None, int]]) -> MemoryWrite:
        ex = req.extraction
        tags = tuple(sorted({f.kind for f in ex.facts} | ({f"task:{ex.task.outcome}"} if ex.task and ex.task.outcome
                                                          else set())))
        sources = merge_sources(tuple(ex.extra_sources), req.sources)
        dup = self._near_duplicate(vec, text, req.session)
        if dup is not None:
            merged = merge_sources(dup.episode.sources, sources)
            entities = tuple(dict.fromkeys(dup.episode.entities + ex.entities))
            self.db.execute("UPDATE episodes SET sources = ?, entities = ?, at = MAX(at, ?) WHERE rowid = ?",
                            (pack(list(merged)), pack(list(entities)), req.now, dup.rowid))
            return MemoryWrite(Store.EPISODIC, Op.UPDATE, dup.episode.id,
                               "near-duplicate episode: merged sources", {"summary": dup.episode.summary,
                                                                           "sources": list(merged)})
        sidx = self._session_index(req.session, req.now)
        cur = self.db.execute(
            "INSERT INTO episodes (at, actor, summary, sources, entities, tags, session, session_index, turn_key,"
            " vector, key_text) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (req.now, req.actor, text, pack(list(sources)), pack(list(ex.entities)), pack(list(tags)),
             req.session, sidx, req.turn_key, np.asarray(vec, np.float32).tobytes(), key_text))
        key = int(cur.lastrowid or 0)
        self.db.execute("INSERT INTO episodes_fts (rowid, summary) VALUES (?, ?)", (key, key_text))
        index_ops.append(("add", key, vec, self._log("add", key)))
        return MemoryWrite(Store.EPISODIC, Op.ADD, f"ep-{key}", reason,
                           {"summary": text, "sources": list(sources), "at": req.now})

    def _near_duplicate(self, vec: np.ndarray, text: str, session: str) -> _Row | None:
        """A stored episode of the same session that says the same thing (exact scan of the session's
        latest episodes: the cost does not grow with the store)."""
        rows = self.db.execute(f"SELECT rowid, vector FROM episodes WHERE session = ? "
                               f"ORDER BY rowid DESC LIMIT {MERGE_WINDOW}", (session,)).fetchall()
        if not rows:
            return None
        sims = np.frombuffer(b"".join([r[1] for r in rows]), np.float32).reshape(len(rows), -1) @ np.asarray(
            vec, np.float32)
        for i in np.argsort(-sims)[:3]:  # only these few are read whole, and only when similar enough
            if float(sims[i]) < self.cfg.merge_similarity:
                break  # is_near_duplicate refuses it, and every one after it is less similar
            ep = self._rows("rowid = ?", (rows[i][0],))[0]
            if is_near_duplicate(float(sims[i]), text, ep.summary, self.cfg):
                return _Row(int(rows[i][0]), ep)
        return None

    def _mark(self, promote_turns: list[str], supersede_sources: list[str]) -> None:
        for tk in promote_turns:
            self.db.execute("UPDATE episodes SET promoted = 1 WHERE turn_key = ?", (tk,))
        if supersede_sources:
            wanted = sorted(set(supersede_sources))
            # the packed sources hold each id's UTF-8 bytes: SQLite's instr() picks the candidate rows in C, the
            # unpacked list decides (an id inside a longer one is not a match)
            near = " OR ".join(["instr(sources, ?) > 0"] * len(wanted))
            rows = self.db.execute(f"SELECT rowid, sources FROM episodes WHERE superseded = 0 AND ({near})",
                                   [w.encode() for w in wanted]).fetchall()
            for key, srcs in rows:
                if set(wanted) & set(unpack(srcs)):
                    self.db.execute("UPDATE episodes SET superseded = 1 WHERE rowid = ?", (key,))

    def _delete(self, keys: list[int]) -> int:
        ops = []
        self._max_key = None
        with transaction(self.db):
            for key in keys:
                if self.db.execute("DELETE FROM episodes WHERE rowid = ?", (key,)).rowcount:
                    self.db.execute("DELETE FROM episodes_fts WHERE rowid = ?", (key,))
                    ops.append((key, self._log("remove", key)))
        for key, seq in ops:
            self.index.remove(key, seq)
        self._unsaved += len(ops)
        return len(ops)

    def erase(self) -> int:
        """Forget every episode for good: unlink the database, its WAL and the index, reopen empty.
        Returns how many episodes there were."""
        n = int(self.db.execute("SELECT COUNT(*) FROM episodes").fetchone()[0])
        epoch = fence.current(self.db)
        self.db.close()
        unlink_files(self.dir, "episodic")
        self._open()
        fence.restore(self.db, epoch)
        return n

    def fence(self, epoch: int) -> None:
        fence.fence(self.db, epoch, f"soul {self.dir.name} episodic")
        self.epoch = max(self.epoch, epoch)

    def forget_where(self, q: ForgetQuery) -> Erased:
        """Delete the episodes ``q`` names or whose text contains its phrase, with the idempotency records of
        the turns that wrote them; then leave no copy in free pages, FTS segments, the WAL or the index."""
        wanted = {int(i[3:]) for i in q.ids if is_episode_id(i)}
        rows = self.db.execute("SELECT rowid, summary, key_text, sources, turn_key FROM episodes").fetchall()
        hit = [r for r in rows if r[0] in wanted or q.matches(r[1], r[2]) or q.from_sources(unpack(r[3]))]
        if not hit:
            return Erased()
        ids = tuple(f"ep-{r[0]}" for r in hit)
        texts = tuple(r[1] for r in hit)
        sources = tuple(dict.fromkeys(s for r in hit for s in unpack(r[3])))
        turn_keys = {r[4] for r in hit}
        self._max_key = None
        with transaction(self.db):
            for r in hit:
                self.db.execute("DELETE FROM episodes WHERE rowid = ?", (r[0],))
                self.db.execute("DELETE FROM episodes_fts WHERE rowid = ?", (r[0],))
            drop_applied(self.db, turn_keys, set(ids), q.with_texts(texts))
            self.db.execute("DELETE FROM index_log")
        compact(self.db, ("episodes_fts",))
        self.index.rebuild(self.db.execute("SELECT rowid, vector FROM episodes ORDER BY rowid"), self._last_seq())
        self.flush()
        return Erased(ids, texts, sources)

    def sweep(self, now: float) -> dict[str, int]:
        """Retention: delete unpromoted episodes past ``episodic_ttl_days``."""
        rows = self.db.execute("SELECT rowid, at, promoted FROM episodes").fetchall()
        doomed = [r[0] for r in rows if past_ttl(r[1], bool(r[2]), now, self.cfg)]
        decayed = sum(1 for r in rows if not in_recall(r[1], bool(r[2]), now, self.cfg))
        return {"episodes_deleted": self._delete(doomed), "episodes_out_of_recall": decayed - len(doomed)}

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
        if timings is not None:  # each search's own time (they overlap in a large store)
            for name, ms in (("embed", (t1 - t0) * 1000), ("dense", (t2 - t1) * 1000), ("lexical", lex_ms),
                             ("score", (clock() - t3) * 1000)):
                timings[name] = timings.get(name, 0.0) + ms
        return items

    def _score(self, query: str, k: int, now: float, query_vector: np.ndarray, dense: dict[int, float],
               lexical: list[_Hit]) -> list[RecalledItem]:
        """Score the candidates on their date, flags and similarities alone; only the ``k`` kept are read
        whole. Lexical and time-scoped hits come with their date, flags and vector (read by their own query);
        the other dense hits' dates and flags come from the covering index, in one query; a hit without a dense
        similarity gets its true one from its stored vector (one matrix product for all of them)."""
        scope = self._in_scope(query_scope(query, now))
        scoped: set[int] = set()
        hits = lexical
        if scope:
            scoped = {h[0] for h in scope}
            have = {h[0] for h in lexical}
            hits = lexical + [h for h in scope if h[0] not in have]
        held = {h[0] for h in hits}
        rest = [key for key in dense if key not in held]
        rows = self.db.execute(
            "SELECT rowid, at, promoted, superseded FROM episodes INDEXED BY episodes_recall "
            f"WHERE rowid IN ({','.join('?' * len(rest))})", rest).fetchall() if rest else []
        if not hits and not rows:
            return []
        ids = [h[0] for h in hits] + [r[0] for r in rows]
        sims: list[float | None] = [dense.get(h[0]) for h in hits]
        need = [i for i, d in enumerate(sims) if d is None]
        if need:  # hits without a dense similarity: their true one, from the stored vectors
            got = np.frombuffer(b"".join([hits[i][5] for i in need]), np.float32).reshape(len(need), -1) @ query_vector
            for i, sim in zip(need, got.tolist(), strict=True):
                sims[i] = sim
        ats, promoted_, superseded_ = np.array([h[2:5] for h in hits] + [r[1:] for r in rows],
                                               np.float64).reshape(len(ids), 3).T
        lex = np.array([h[1] for h in hits] + [0.0] * len(rows))  # lexical hits score > 0, the others 0
        top_lex = float(lex.max()) or 1.0
        scores = hybrid_score(np.array(sims + [dense[r[0]] for r in rows]), lex / top_lex, self.cfg)
        scores = scores * recency_weight(ats, now, self.cfg)
        if scoped:  # the question names a time ("three sessions ago"): what happened then comes first
            scores = np.where([key in scoped for key in ids], 0.5 + 0.5 * scores, 0.5 * scores)
        live = np.logical_and(superseded_ == 0, in_recall(ats, promoted_ != 0, now, self.cfg))
        top = top_rounded(np.where(live & (scores >= self.cfg.min_score), scores, -np.inf), k)
        kept = sorted((-round(float(scores[i]), 6), f"ep-{ids[i]}", i) for i in top)[:k]
        if not kept:
            return []
        shown = {r[0]: r for r in self.db.execute(
            f"SELECT rowid, summary, sources FROM episodes WHERE rowid IN ({','.join('?' * len(kept))})",
            [ids[i] for *_, i in kept])}
        return [RecalledItem("episodic", eid, shown[ids[i]][1], -neg, tuple(unpack(shown[ids[i]][2])), float(ats[i]))
                for neg, eid, i in kept]

    def _in_scope(self, scope: TimeScope | None, limit: int = 200) -> list[_Hit]:
        """The episodes a time-scoped question points at (at most ``limit``, the latest), as hits with no
        lexical score."""
        if scope is None:
            return []
        found = self._where(since=scope.since, until=scope.until, sessions_ago=scope.sessions_ago)
        if found is None:
            return []
        where, params = found
        return [(r[0], 0.0, r[1], r[2], r[3], r[4]) for r in self.db.execute(
            f"SELECT rowid, at, promoted, superseded, vector FROM episodes WHERE {where} "
            "ORDER BY at DESC, rowid DESC LIMIT ?", (*params, limit))]

    def _size(self) -> int:
        """The store's size as lexical pruning and the parallel search read it: its highest episode key (kept
        from the last read and committed inserts; read again after any delete)."""
        if self._max_key is None:
            self._max_key = int(self.db.execute("SELECT COALESCE(MAX(rowid), 0) FROM episodes").fetchone()[0])
        return self._max_key

    def _match(self, query: str) -> str:
        """The FTS5 MATCH expression of ``query`` (see :func:`lexical_clauses`); empty when nothing to match."""
        qt = list(dict.fromkeys(terms(query)))
        if not qt:
            return ""
        size = self._size()
        docs: dict[str, int] = {}
        if size >= self.lexical.prune_at:  # a large store: a query that matches few episodes (LexicalLimits)
            docs = self._term_docs(fts_tokens(qt), size)
        quoted = [['"' + t.replace('"', "") + '"' for t in c] for c in lexical_clauses(qt, docs, size, self.lexical)]
        return " OR ".join(q[0] if len(q) == 1 else "(" + " AND ".join(q) + ")" for q in quoted)

    def _lexical_rows(self, query: str, limit: int) -> list[_Hit]:
        """The best ``limit`` BM25 matches (score > 0) with their date, flags and vector, in one query.

        The BM25 score is ordered on as a plain column (``bm25(...) AS s ... ORDER BY s``): FTS5's ``ORDER BY
        rank`` ranks the same but costs about a third more at 100,000 episodes. Ties go by row id. The rows are
        read after the LIMIT (a subquery), so only the kept matches are looked up in ``episodes``."""
        match = self._match(query)
        if not match:
            return []
        rows: list[_Hit] = self.db.execute(
            "SELECT l.rowid, -l.s, e.at, e.promoted, e.superseded, e.vector FROM (SELECT rowid, "
            "bm25(episodes_fts) AS s FROM episodes_fts WHERE episodes_fts MATCH ? ORDER BY s, rowid LIMIT ?) AS l "
            "JOIN episodes AS e ON e.rowid = l.rowid ORDER BY l.s, l.rowid", (match, limit)).fetchall()
        return [r for r in rows if r[1] > 0]

    def _lexical(self, query: str, limit: int) -> dict[int, float]:
        """Row key -> BM25 score (higher is better) of the best ``limit`` lexical matches."""
        return {h[0]: h[1] for h in self._lexical_rows(query, limit)}

    def _term_docs(self, tokens: dict[str, tuple[str, ...]], size: int) -> dict[str, int]:
        """How many episodes hold each query term, by its FTS5 tokens (``tokens``: term -> tokens): FTS5's own
        count of its rarest token, remembered until the store grows by a quarter (the tokens not remembered are
        read in one query); 0 for a term without tokens."""
        stale = sorted({tok for toks in tokens.values() for tok in toks
                        if (hit := self._doc_freq.get(tok)) is None or size > hit[1] * 1.25})
        if stale:
            got = dict(self.db.execute("SELECT term, doc FROM episodes_vocab WHERE term IN "
                                       f"({','.join('?' * len(stale))})", stale).fetchall())
            if len(self._doc_freq) + len(stale) > 4096:
                self._doc_freq.clear()
            for tok in stale:
                self._doc_freq[tok] = (int(got.get(tok, 0)), size)
        return {t: min([size] + [self._doc_freq[tok][0] for tok in toks]) if toks else 0
                for t, toks in tokens.items()}

    def episodes(self, *, since: float | None = None, until: float | None = None, session: str | None = None,
                 sessions_ago: int | None = None) -> list[Episode]:
        """The time axis: episodes in a time range, of a session, or of the session N before the latest."""
        found = self._where(since=since, until=until, session=session, sessions_ago=sessions_ago)
        return [] if found is None else self._rows(*found)

    def _where(self, *, since: float | None = None, until: float | None = None, session: str | None = None,
               sessions_ago: int | None = None) -> tuple[str, tuple[Any, ...]] | None:
        """The WHERE clause (and its parameters) of :meth:`episodes`; None when no episode can match."""
        where: list[str] = ["1"]
        params: list[Any] = []
        if since is not None:
            where.append("at >= ?")
            params.append(since)
        if until is not None:
            where.append("at < ?")
            params.append(until)
        if session is not None:
            where.append("session = ?")
            params.append(session)
        if sessions_ago is not None:
            if sessions_ago < 0:
                raise InvalidInput("sessions_ago must be >= 0")
            r = self.db.execute("SELECT idx FROM sessions ORDER BY idx DESC LIMIT 1 OFFSET ?",
                                (sessions_ago,)).fetchone()
            if r is None:
                return None
            where.append("session_index = ?")
            params.append(r[0])
        return " AND ".join(where), tuple(params)

    def stats(self) -> dict[str, int]:
        n = self.db.execute("SELECT COUNT(*) FROM episodes").fetchone()[0]
        p = self.db.execute("SELECT COUNT(*) FROM episodes WHERE promoted = 1").fetchone()[0]
        size = file_bytes(self.dir, "episodic")
        return {"episodes": int(n), "promoted_episodes": int(p), "indexed": len(self.index), "episodic_bytes": size}

    # ---- export / import -------------------------------------------------------------
    def is_empty(self) -> bool:
        return is_empty(self.db, ("episodes", "sessions", "applied"))

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
        if not is_empty(self.db, ("episodes", "sessions", "applied")):
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
            load_tables(self.db, data, ("sessions", "applied"))
        self.index.rebuild(self.db.execute("SELECT rowid, vector FROM episodes ORDER BY rowid"), self._last_seq())
        self.flush()


def top_rounded(scores: np.ndarray, k: int, digits: int = 6) -> list[int]:
    """Indices of the finite ``scores`` that can be among the best ``k`` once rounded to ``digits`` decimals
    (ties then go by id): those within one rounding step of the k-th best. Sorting these few gives the same
    top ``k`` as sorting them all."""
    idx = np.flatnonzero(np.isfinite(scores))
    if len(idx) > k:
        kth = float(np.partition(scores[idx], len(idx) - k)[len(idx) - k])
        idx = idx[scores[idx] >= kth - 2 * 10.0 ** -digits]
    return [int(i) for i in idx]


def _noop(reason: str) -> MemoryWrite:
    return MemoryWrite(Store.EPISODIC, Op.NOOP, "", reason)


def writes_without_store(reqs: list[WriteRequest]) -> list[list[MemoryWrite]] | None:
    """What :meth:`EpisodicStore.apply_many` answers (without cross-layer marks) when none of ``reqs`` writes an
    episode, whatever is stored; None when one does."""
    decisions = [decide_episode(r.extraction) for r in reqs]
    if any(d.write for d in decisions):
        return None
    return [[_noop(d.reason)] for d in decisions]


def index_key_text(req: WriteRequest) -> str:
    """What an episode is indexed under: its summary, the model's fuller wording, and the words it was said
    in (the message and the one it replied to). Only the summary is shown in recall."""
    summary = req.extraction.episode.strip()
    detail = req.extraction.detail.strip()
    parts = [detail] if detail and summary.rstrip(".…") in detail else [summary, detail]
    parts.append(req.key_context.strip())
    return " ".join(p for p in parts if p)[:4000]


def _key(episode_id: str) -> int:
    if not isinstance(episode_id, str) or not episode_id.startswith("ep-") or not episode_id[3:].isdigit():
        raise NotFound(f"no episode {episode_id!r}")
    return int(episode_id[3:])


FTS_TOKENIZE = "porter unicode61"
"""The tokenizer of ``episodes_fts`` (migration 0001): its vocabulary holds these tokens, not ``text.terms``."""
_tokens_lock = threading.Lock()
_tokens_db: list[sqlite3.Connection] = []
_tokens: dict[str, tuple[str, ...]] = {}


def fts_tokens(words: list[str]) -> dict[str, tuple[str, ...]]:
    """What the FTS5 tokenizer makes of each word (``"happy"`` -> ``("happi",)``): the keys of its vocabulary,
    so that a query term's document count can be read from ``episodes_vocab``. An in-memory FTS5 table with the
    same tokenizer does the work; results are cached (bounded)."""
    missing = [w for w in dict.fromkeys(words) if w not in _tokens]
    if missing:
        with _tokens_lock:
            if not _tokens_db:
                con = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
                # contentless: the words are not kept, and 'delete-all' empties it at once
                con.execute(f"CREATE VIRTUAL TABLE q USING fts5(x, tokenize='{FTS_TOKENIZE}', content='')")
                con.execute("CREATE VIRTUAL TABLE qv USING fts5vocab(q, 'instance')")
                _tokens_db.append(con)
            con = _tokens_db[0]
            got: dict[int, list[str]] = {}
            con.execute("BEGIN")  # one transaction: FTS5 writes its segment once, not once a word
            try:
                con.execute("INSERT INTO q (q) VALUES ('delete-all')")
                con.executemany("INSERT INTO q (rowid, x) VALUES (?, ?)", list(enumerate(missing)))
                for term, doc in con.execute("SELECT term, doc FROM qv ORDER BY doc, offset"):
                    got.setdefault(int(doc), []).append(str(term))
            finally:
                con.execute("COMMIT")
            if len(_tokens) > 50_000:
                _tokens.clear()
            for i, w in enumerate(missing):
                _tokens[w] = tuple(got.get(i, ()))
    return {w: _tokens.get(w, ()) for w in words}
