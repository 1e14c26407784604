"""A soul's own durable state: buffer checkpoint, sequence number, traces (``soul.sqlite``)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack

from soul_runtime.errors import NotFound, SoulError, StaleOwner
from soul_runtime.loop.buffer import ShortTermBuffer
from soul_runtime.loop.soul_state_schema import MIGRATIONS
from soul_runtime.loop.trace import TurnTrace, add_usage
from soul_runtime.memory.erasure import ForgetQuery, compact
from soul_runtime.memory.soul_records import forget_db
from soul_runtime.memory.sqlite_db import memory_bytes, open_db, transaction

log = logging.getLogger("soul_runtime.storage")

PUT = "INSERT INTO state VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
"""A state entry set in place (its row kept: a cache's push sends one changed row, not a delete and an insert)."""


class SoulState:
    def __init__(self, directory: Path, buffer_tokens: int) -> None:
        self.dir = Path(directory)
        self.db = open_db(self.dir / "soul.sqlite", MIGRATIONS)
        rows = dict(self.db.execute("SELECT key, value FROM state").fetchall())
        self.buffer = ShortTermBuffer.from_bytes(rows["buffer"]) if "buffer" in rows else ShortTermBuffer()
        self.buffer.max_tokens = buffer_tokens
        self.last_seq = int(rows.get("last_seq", 0))
        self.last_at = float(msgpack.unpackb(rows["last_at"])) if "last_at" in rows else 0.0
        self.usage: dict[str, Any] = msgpack.unpackb(rows["usage"], raw=False) if "usage" in rows else {}
        """The model cost of every committed turn and observe, summed (see :func:`add_usage`)."""
        self.epoch = 0
        self.intent_seq = 0
        """The turn whose write intent, with its decided writes, this state saved or found last: the server can
        rebuild that turn's commit from it alone, so the commit goes with the next push."""

    def claim(self) -> int:
        """Become the soul's owner: take the next fencing epoch. An older owner's next commit fails."""
        with transaction(self.db):
            self.epoch = self._epoch() + 1
            self.db.execute(PUT, ("epoch", self.epoch))
            # what the previous owner committed is the truth now (it may have run after we opened)
            rows = dict(self.db.execute("SELECT key, value FROM state").fetchall())
        tokens = self.buffer.max_tokens
        self.buffer = ShortTermBuffer.from_bytes(rows["buffer"]) if "buffer" in rows else ShortTermBuffer()
        self.buffer.max_tokens = tokens
        self.last_seq = int(rows.get("last_seq", 0))
        self.last_at = float(msgpack.unpackb(rows["last_at"])) if "last_at" in rows else 0.0
        self.usage = msgpack.unpackb(rows["usage"], raw=False) if "usage" in rows else {}
        return self.epoch

    def _epoch(self) -> int:
        r = self.db.execute("SELECT value FROM state WHERE key = 'epoch'").fetchone()
        return int(r[0]) if r else 0

    def _fenced(self) -> None:
        """Inside a write transaction: refuse to write when a newer owner has claimed the soul."""
        if self.epoch and self._epoch() != self.epoch:
            raise StaleOwner(f"{self.dir.name}: a newer owner (epoch {self._epoch()}) took this soul over from "
                             f"this one (epoch {self.epoch}); nothing was written")

    def close(self) -> None:
        """Close the soul's state; with a PostgreSQL storage, its deferred commit goes to the server first (if
        the server is away, the commit is finished from its intent when the soul is next opened)."""
        mirror = getattr(self.db, "mirror", None)
        if mirror is not None and mirror.deferred:
            try:
                with transaction(self.db):
                    pass
            except SoulError as e:
                log.warning("soul %s: its last commit stays with its write intent on the server (%s)", self.dir.name, e)
        self.db.close()

    def memory_bytes(self) -> int:
        """What this open soul state holds in memory: the session buffer and the SQLite page cache."""
        return len(self.buffer.to_bytes()) + memory_bytes(self.db)

    def save_intent(self, intent: dict[str, Any]) -> None:
        """Record a turn's writes before they go to the stores (redo log of one entry)."""
        with transaction(self.db):
            self._fenced()
            self.db.execute(PUT, ("intent", msgpack.packb(intent, use_bin_type=True)))
        self.intent_seq = int(intent["trace"]["seq"]) if intent.get("requests") is not None else 0

    def pending_intent(self) -> dict[str, Any] | None:
        r = self.db.execute("SELECT value FROM state WHERE key = 'intent'").fetchone()
        if r is None:
            return None
        intent: dict[str, Any] = msgpack.unpackb(r[0], raw=False)
        if int(intent["trace"]["seq"]) <= self.last_seq:
            return None
        self.intent_seq = int(intent["trace"]["seq"]) if intent.get("requests") is not None else 0
        return intent

    def commit(self, trace: TurnTrace, keep: int) -> None:
        """Checkpoint the buffer and record the trace: the turn's acknowledgement point."""
        usage = add_usage(self.usage, trace.usage)
        with transaction(self.db, deferred=self.intent_seq == trace.seq):
            self._fenced()
            self.db.execute("DELETE FROM state WHERE key = 'intent'")
            self.db.execute("INSERT INTO traces VALUES (?, ?, ?, ?, ?)",
                            (trace.seq, trace.turn_id, trace.request_id, trace.at,
                             msgpack.packb(trace.to_dict(), use_bin_type=True)))
            self.db.executemany(PUT, [
                ("buffer", self.buffer.to_bytes()), ("last_seq", trace.seq),
                ("last_at", msgpack.packb(max(self.last_at, trace.at))),
                ("usage", msgpack.packb(usage, use_bin_type=True))])
            if keep and trace.seq > keep:
                self.db.execute("DELETE FROM traces WHERE seq <= ?", (trace.seq - keep,))
        self.last_seq = trace.seq
        self.last_at = max(self.last_at, trace.at)
        self.usage = usage

    def trace(self, turn_id: str) -> TurnTrace:
        if not isinstance(turn_id, str) or len(turn_id) > 400:
            raise NotFound(f"no turn {turn_id!r}")
        r = self.db.execute("SELECT trace FROM traces WHERE turn_id = ?", (turn_id,)).fetchone()
        if r is None:
            raise NotFound(f"no turn {turn_id!r}")
        return TurnTrace.from_dict(msgpack.unpackb(r[0], raw=False))

    def by_request(self, request_id: str) -> TurnTrace | None:
        if not request_id:
            return None
        r = self.db.execute("SELECT trace FROM traces WHERE request_id = ?", (request_id,)).fetchone()
        return TurnTrace.from_dict(msgpack.unpackb(r[0], raw=False)) if r else None

    def last(self, n: int) -> list[TurnTrace]:
        rows = self.db.execute("SELECT trace FROM traces ORDER BY seq DESC LIMIT ?", (n,)).fetchall()
        return [TurnTrace.from_dict(msgpack.unpackb(r[0], raw=False)) for r in rows][::-1]

    def count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM traces").fetchone()[0])

    def erase(self) -> int:
        """Forget traces, buffer checkpoint and write intent for good (unlink ``soul.sqlite`` and its WAL, start
        again empty); only the sequence number is kept. Returns how many traces there were."""
        with transaction(self.db):
            self._fenced()
        n = self.count()
        epoch = self._epoch()
        self.db.close()
        forget_db(self.dir / "soul.sqlite")
        self.db = open_db(self.dir / "soul.sqlite", MIGRATIONS)
        with transaction(self.db):
            self.db.executemany("INSERT INTO state VALUES (?, ?)", [("last_seq", self.last_seq), ("epoch", epoch)])
        self.buffer = ShortTermBuffer(max_tokens=self.buffer.max_tokens)
        self.last_at = 0.0
        self.usage = {}
        return n

    def redact(self, q: ForgetQuery, *, ids: set[str], sources: set[str]) -> int:
        """Redact every trace, and drop every buffer turn, that held forgotten words, touched a forgotten
        memory or came from one of its source messages; then compact the file. Returns how many."""
        n = 0
        with transaction(self.db):
            self._fenced()
            for seq, blob in self.db.execute("SELECT seq, trace FROM traces").fetchall():
                t = TurnTrace.from_dict(msgpack.unpackb(blob, raw=False))
                if touches(t, q, ids, sources):
                    self.db.execute("UPDATE traces SET trace = ? WHERE seq = ?",
                                    (msgpack.packb(redacted(t).to_dict(), use_bin_type=True), seq))
                    n += 1
            keep = [t for t in self.buffer.turns if t.id not in sources and not q.matches(t.text)]
            n += len(self.buffer.turns) - len(keep)
            self.buffer.turns[:] = keep
            self.db.execute(PUT, ("buffer", self.buffer.to_bytes()))
        compact(self.db)
        return n


def touches(t: TurnTrace, q: ForgetQuery, ids: set[str], sources: set[str]) -> bool:
    """Did this turn hold a forgotten memory: written or recalled it, said one of its source messages, or
    recorded its words?"""
    if any(w.key in ids or sources & set(w.payload.get("sources", ())) for w in t.writes):
        return True
    if any(r.id in ids or sources & set(r.sources) for r in t.recalled):
        return True
    if f"{t.turn_id}/user" in sources or f"{t.turn_id}/soul" in sources:
        return True
    return q.matches(t.query, t.reply, t.persist_reason, [w.to_dict() for w in t.writes],
                     [r.text for r in t.recalled])


def redacted(t: TurnTrace) -> TurnTrace:
    """The trace with every word of content removed; its ids, order, timings and usage stay."""
    gone = "[forgotten]"
    return replace(t, query=gone, reply=gone if t.reply else "", recalled=(), writes=(), persist_reason=gone,
                   categories=())
