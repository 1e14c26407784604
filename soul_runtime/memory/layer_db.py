"""What the three layer stores share: msgpack cells, per-turn idempotency, export/import of tables."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack

from soul_runtime.errors import InvalidInput
from soul_runtime.memory import fence
from soul_runtime.memory.erasure import ForgetQuery
from soul_runtime.memory.sqlite_db import transaction
from soul_runtime.records import MemoryWrite, WriteRequest
from soul_runtime.text import check_write_request


def pack(v: Any) -> bytes:
    return bytes(msgpack.packb(v, use_bin_type=True))


def unpack(b: bytes) -> Any:
    return msgpack.unpackb(b, raw=False)


def applied_writes(db: sqlite3.Connection, turn_key: str) -> list[MemoryWrite] | None:
    """The writes a turn already applied (None: not applied yet)."""
    row = db.execute("SELECT writes FROM applied WHERE turn_key = ?", (turn_key,)).fetchone()
    return None if row is None else [MemoryWrite.from_dict(w) for w in unpack(row[0])]


def record_applied(db: sqlite3.Connection, turn_key: str, writes: Sequence[MemoryWrite]) -> None:
    db.execute("INSERT INTO applied VALUES (?, ?)", (turn_key, pack([w.to_dict() for w in writes])))


def apply_idempotent(db: sqlite3.Connection, reqs: Sequence[WriteRequest],
                     one: Callable[[WriteRequest], list[MemoryWrite]], what: str) -> list[list[MemoryWrite]]:
    """Apply ``one`` to each request in one durable transaction; a turn applied before returns its
    recorded writes instead of running again."""
    for req in reqs:
        check_write_request(req)
    out: list[list[MemoryWrite]] = []
    with transaction(db):
        for req in reqs:
            fence.check(db, req.epoch, what)
        for req in reqs:
            prev = applied_writes(db, req.turn_key)
            if prev is None:
                prev = one(req)
                record_applied(db, req.turn_key, prev)
            out.append(prev)
    return out


def drop_applied(db: sqlite3.Connection, turn_keys: set[str], ids: set[str], q: ForgetQuery) -> int:
    """Forget the idempotency records of turns that wrote forgotten memories (by turn, by the ids their writes
    touched, or by the words they recorded), inside the caller's transaction: a re-observed message is new."""
    doomed = []
    for key, blob in db.execute("SELECT turn_key, writes FROM applied").fetchall():
        if key in turn_keys or q.matches(unpack(blob)) or any(w.get("key") in ids for w in unpack(blob)):
            doomed.append((key,))
    db.executemany("DELETE FROM applied WHERE turn_key = ?", doomed)
    return len(doomed)


def dump_tables(db: sqlite3.Connection, tables: Sequence[str]) -> dict[str, list[list[Any]]]:
    return {name: [list(r) for r in db.execute(f"SELECT * FROM {name}")] for name in tables}


def is_empty(db: sqlite3.Connection, tables: Sequence[str]) -> bool:
    return not any(db.execute(f"SELECT 1 FROM {name} LIMIT 1").fetchone() for name in tables)


def load_tables(db: sqlite3.Connection, data: dict[str, Any], tables: Sequence[str]) -> None:
    """Insert exported rows (inside the caller's transaction); the layer must be empty."""
    if not is_empty(db, tables):
        raise InvalidInput("import needs an empty soul: this one already has memories")
    for name in tables:
        rows = data[name]
        if rows:
            db.executemany(f"INSERT INTO {name} VALUES ({','.join('?' * len(rows[0]))})", rows)


def file_bytes(directory: Path, prefix: str) -> int:
    return sum(f.stat().st_size for f in directory.glob(f"{prefix}.*") if f.is_file())
