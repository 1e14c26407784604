"""A soul's own durable state: buffer checkpoint, sequence number, traces (``soul.sqlite``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack

from soul_runtime.errors import NotFound
from soul_runtime.loop.buffer import ShortTermBuffer
from soul_runtime.loop.trace import TurnTrace, add_usage
from soul_runtime.memory.sqlite_db import open_db, transaction

MIGRATIONS = [
    ("0001_state", """
        CREATE TABLE state (key TEXT PRIMARY KEY, value BLOB NOT NULL);
        CREATE TABLE traces (seq INTEGER PRIMARY KEY, turn_id TEXT UNIQUE NOT NULL, request_id TEXT NOT NULL,
                             at REAL NOT NULL, trace BLOB NOT NULL);
        CREATE INDEX traces_request ON traces(request_id)
    """),
]


class SoulState:
    def __init__(self, directory: Path, buffer_tokens: int) -> None:
        self.db = open_db(Path(directory) / "soul.sqlite", MIGRATIONS)
        rows = dict(self.db.execute("SELECT key, value FROM state").fetchall())
        self.buffer = ShortTermBuffer.from_bytes(rows["buffer"]) if "buffer" in rows else ShortTermBuffer()
        self.buffer.max_tokens = buffer_tokens
        self.last_seq = int(rows.get("last_seq", 0))
        self.last_at = float(msgpack.unpackb(rows["last_at"])) if "last_at" in rows else 0.0
        self.usage: dict[str, Any] = msgpack.unpackb(rows["usage"], raw=False) if "usage" in rows else {}
        """The model cost of every committed turn and observe, summed (see :func:`add_usage`)."""

    def close(self) -> None:
        self.db.close()

    def save_intent(self, intent: dict[str, Any]) -> None:
        """Record a turn's writes before they go to the stores (redo log of one entry)."""
        with transaction(self.db):
            self.db.execute("INSERT OR REPLACE INTO state VALUES ('intent', ?)",
                            (msgpack.packb(intent, use_bin_type=True),))

    def pending_intent(self) -> dict[str, Any] | None:
        r = self.db.execute("SELECT value FROM state WHERE key = 'intent'").fetchone()
        if r is None:
            return None
        intent: dict[str, Any] = msgpack.unpackb(r[0], raw=False)
        return intent if int(intent["trace"]["seq"]) > self.last_seq else None

    def commit(self, trace: TurnTrace, keep: int) -> None:
        """Checkpoint the buffer and record the trace: the turn's acknowledgement point."""
        usage = add_usage(self.usage, trace.usage)
        with transaction(self.db):
            self.db.execute("DELETE FROM state WHERE key = 'intent'")
            self.db.execute("INSERT INTO traces VALUES (?, ?, ?, ?, ?)",
                            (trace.seq, trace.turn_id, trace.request_id, trace.at,
                             msgpack.packb(trace.to_dict(), use_bin_type=True)))
            self.db.executemany("INSERT OR REPLACE INTO state VALUES (?, ?)", [
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

    def wipe(self) -> None:
        with transaction(self.db):
            self.db.execute("DELETE FROM traces")
            self.db.execute("DELETE FROM state WHERE key IN ('buffer', 'usage')")
        self.buffer.turns.clear()
        self.usage = {}
