"""The episodic store's writes: episodes from exchanges, near-duplicate merging, promotion and supersession
marks."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from soul_runtime.errors import StorageError
from soul_runtime.memory import fence
from soul_runtime.memory.episodic_table import EpisodeTable
from soul_runtime.memory.layer_db import applied_writes, pack, record_applied, unpack
from soul_runtime.memory.policy_episodic import decide_episode, near_duplicate_terms
from soul_runtime.memory.policy_semantic import merge_sources
from soul_runtime.memory.sqlite_db import transaction
from soul_runtime.records import Episode, MemoryWrite, Op, Store, WriteRequest
from soul_runtime.text import check_write_request, normalise, terms

SAVE_EVERY = 2000
MERGE_WINDOW = 200  # latest episodes of a session a new one is compared with
UNIT_KEY = "#u"
"""What a unit's turn key holds after its message's turn key (:func:`soul_runtime.loop.units.message_requests`)."""


@dataclass
class _Scan:
    """A near-duplicate scan for one vector: the candidates similar enough, and those read so far (with their
    content words)."""

    vec: np.ndarray
    similar: list[tuple[int, float]]
    read: dict[int, tuple[Episode, frozenset[str]]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Row:
    rowid: int
    episode: Episode


class EpisodeWrites(EpisodeTable):
    # ---- writes ----------------------------------------------------------------------
    @staticmethod
    def writes_without_store(reqs: list[WriteRequest]) -> list[list[MemoryWrite]] | None:
        return writes_without_store(reqs)

    def apply(self, req: WriteRequest) -> list[MemoryWrite]:
        return self.apply_many([req])[0]

    def embed_ahead(self, reqs: list[WriteRequest]) -> None:
        """``reqs`` will be applied soon: their episodes' vectors are computed now, beside the caller
        (:mod:`soul_runtime.embedding.ahead`)."""
        self.ahead.submit([vector_text(r) for r in reqs if decide_episode(r.extraction).write])

    def apply_many(self, reqs: list[WriteRequest], *, promote_turns: list[str] | None = None,
                   supersede_sources: list[str] | None = None, supersede_values: list[str] | None = None
                   ) -> list[list[MemoryWrite]]:
        """Apply the episodic writes of several exchanges in one durable transaction.

        Idempotent per ``turn_key``: a turn applied before returns its recorded writes.
        ``promote_turns``: turns whose episodes fed a promoted fact (they stop decaying).
        ``supersede_sources``: message ids of fact values just replaced or retracted;
        episodes derived from them leave recall (they would contradict the new value) — of a long message's
        units (:mod:`soul_runtime.loop.units`), only those that state one of ``supersede_values`` (the values
        replaced): the rest of the message still holds.
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
        embedded = [vector_text(r) for _, r, d in wanted if d.write]
        unique = list(dict.fromkeys(embedded))  # units of one message share its vector: one embedding
        got = self.ahead.embed(unique) if unique else np.zeros((0, self.embedder.dim), np.float32)
        row = {t: i for i, t in enumerate(unique)}
        vectors = got[[row[t] for t in embedded]] if embedded else got
        index_ops: list[tuple[str, int, np.ndarray | None, int]] = []
        scans: dict[tuple[str, str], _Scan] = {}
        vi = 0
        with transaction(self.db):
            for req in reqs:
                fence.check(self.db, req.epoch, f"soul {self.dir.name} episodic")
                self.epoch = max(self.epoch, req.epoch)
            for i, req, decision in wanted:
                writes: list[MemoryWrite] = []
                if decision.write:
                    writes.append(self._write_one(req, texts[vi], keys[vi], vectors[vi], decision.reason, index_ops,
                                                  scans))
                    vi += 1
                else:
                    writes.append(_noop(decision.reason))
                record_applied(self.db, req.turn_key, writes)
                out[i] = writes
            self._mark(promote_turns or [], supersede_sources or [], supersede_values or [])
        if self._max_key is not None:  # committed: the new rows' keys
            self._max_key = max([self._max_key] + [key for op, key, _, _ in index_ops if op == "add"])
        for op, key, vec, seq in index_ops:  # the record is durable; now the cache
            if op == "add" and vec is not None:
                self.index.add(key, vec, seq)
            else:
                self.index.remove(key, seq)
        self._unsaved += len(index_ops)
        if self._unsaved >= SAVE_EVERY:
            try:
                self.flush()
            except StorageError:  # the writes are committed; the change log keeps them until a save succeeds
                pass
        return [o or [] for o in out]

    def _write_one(self, req: WriteRequest, text: str, key_text: str, vec: np.ndarray, reason: str,
                   index_ops: list[tuple[str, int, np.ndarray | None, int]],
                   scans: dict[tuple[str, str], _Scan]) -> MemoryWrite:
        ex = req.extraction
        tags = tuple(sorted({f.kind for f in ex.facts} | ({f"task:{ex.task.outcome}"} if ex.task and ex.task.outcome
                                                          else set())))
        sources = merge_sources(tuple(ex.extra_sources), req.sources)
        dup = self._near_duplicate(vec, text, req.session, req.turn_key, scans)
        if dup is not None:
            merged = merge_sources(dup.episode.sources, sources)
            entities = tuple(dict.fromkeys(dup.episode.entities + ex.entities))
            self.db.execute("UPDATE episodes SET sources = ?, entities = ?, at = MAX(at, ?) WHERE rowid = ?",
                            (pack(list(merged)), pack(list(entities)), req.now, dup.rowid))
            for scan in scans.values():
                scan.read.pop(dup.rowid, None)  # read again when next compared: it holds more now
            return MemoryWrite(Store.EPISODIC, Op.UPDATE, dup.episode.id,
                               "near-duplicate episode: merged sources", {"summary": dup.episode.summary,
                                                                           "sources": list(merged)})
        sidx = self._session_index(req.session, req.now)
        cur = self.db.execute(
            "INSERT INTO episodes (at, actor, summary, sources, entities, tags, session, session_index, turn_key,"
            " vector, key_text, unit) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (req.now, req.actor, text, pack(list(sources)), pack(list(ex.entities)), pack(list(tags)),
             req.session, sidx, req.turn_key, np.asarray(vec, np.float32).tobytes(), key_text,
             int(shares_vector(req))))
        key = int(cur.lastrowid or 0)
        for other in [k for k in scans if k != (req.session, _siblings(req.turn_key))]:
            del scans[other]  # a new row another message's units would have to see
        self.db.execute("INSERT INTO episodes_fts (rowid, summary) VALUES (?, ?)", (key, key_text))
        if not shares_vector(req):  # a unit that shares its message's vector is not indexed again (INDEXED)
            index_ops.append(("add", key, vec, self._log("add", key)))
        return MemoryWrite(Store.EPISODIC, Op.ADD, f"ep-{key}", reason,
                           {"summary": text, "sources": list(sources), "at": req.now})

    def _near_duplicate(self, vec: np.ndarray, text: str, session: str, turn_key: str,
                        scans: dict[tuple[str, str], _Scan]) -> _Row | None:
        """A stored episode of the same session that says the same thing (exact scan of the session's
        latest episodes: the cost does not grow with the store). The other units of a unit's own message are
        not candidates: they are other parts of it, cut apart on purpose, and share its vector — so the
        message's units share one scan (``scans``, kept for one transaction): its candidates are the same rows."""
        siblings = _siblings(turn_key)
        scan = scans.get((session, siblings)) if siblings else None
        if scan is None or not np.array_equal(scan.vec, vec):
            rows = self.db.execute(f"SELECT rowid, vector FROM episodes WHERE session = ? AND NOT (? != '' AND "
                                   f"substr(turn_key, 1, length(?)) = ?) ORDER BY rowid DESC LIMIT {MERGE_WINDOW}",
                                   (session, siblings, siblings, siblings)).fetchall()
            sims = np.frombuffer(b"".join([r[1] for r in rows]), np.float32).reshape(len(rows), -1) @ np.asarray(
                vec, np.float32) if rows else np.zeros(0, np.float32)
            top = [(int(rows[i][0]), float(sims[i])) for i in np.argsort(-sims)[:3]]
            scan = _Scan(vec, [(key, sim) for key, sim in top if sim >= self.cfg.merge_similarity])
            if siblings:  # the message's other units see the same rows: what is written between them is theirs
                scans[(session, siblings)] = scan
        if not scan.similar:
            return None
        mine = frozenset(terms(text))
        for key, sim in scan.similar:  # only these few are read whole, and only when similar enough
            if key not in scan.read:
                ep = self._rows("rowid = ?", (key,))[0]
                scan.read[key] = (ep, frozenset(terms(ep.summary)))
            ep, theirs = scan.read[key]
            if near_duplicate_terms(sim, mine, theirs, self.cfg):
                return _Row(key, ep)
        return None

    def _mark(self, promote_turns: list[str], supersede_sources: list[str], supersede_values: list[str]) -> None:
        for tk in promote_turns:
            self.db.execute("UPDATE episodes SET promoted = 1 WHERE turn_key = ?", (tk,))
        if supersede_sources:
            wanted = sorted(set(supersede_sources))
            # the packed sources hold each id's UTF-8 bytes: SQLite's instr() picks the candidate rows in C, the
            # unpacked list decides (an id inside a longer one is not a match)
            near = " OR ".join(["instr(sources, ?) > 0"] * len(wanted))
            rows = self.db.execute(f"SELECT rowid, sources, turn_key, summary FROM episodes WHERE superseded = 0 "
                                   f"AND ({near})", [w.encode() for w in wanted]).fetchall()
            values = [normalise(v) for v in supersede_values if v.strip()]
            for key, srcs, turn_key, summary in rows:
                if not set(wanted) & set(unpack(srcs)):
                    continue
                if UNIT_KEY in (turn_key or "") and not any(v in normalise(summary) for v in values):
                    continue  # a unit of a long message that does not state the replaced value
                self.db.execute("UPDATE episodes SET superseded = 1 WHERE rowid = ?", (key,))


def _siblings(turn_key: str) -> str:
    """What the turn keys of a unit's message's units start with ("" for an episode that is not a unit)."""
    return turn_key.split(UNIT_KEY)[0] + UNIT_KEY if UNIT_KEY in turn_key else ""


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


def shares_vector(req: WriteRequest) -> bool:
    """Is ``req`` a unit of a long message that shares its message's vector (rather than one of its own text)?
    Recall weighs such a unit's dense side by ``unit_dense_weight``."""
    return UNIT_KEY in req.turn_key and bool(req.vector_text) and req.vector_text != req.extraction.episode


def vector_text(req: WriteRequest) -> str:
    """What an episode's vector is computed from: ``req.vector_text`` when given, else its key text."""
    return req.vector_text or index_key_text(req)
