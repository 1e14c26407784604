"""Idempotency keys of the HTTP service: which request body each key of a soul was first used with.

The runtime itself makes a request id idempotent (a turn sent again with the same ``request_id`` returns the
first result and is not applied twice). This ledger adds the one thing HTTP clients expect on top: the same key
sent with another body is refused instead of silently answered with the first result. It keeps, per soul,
SHA-256 digests of the key and of the body, never the key or the body (``DATA_DIR/service/idempotency.sqlite``,
owner-only). A key is recorded once its request succeeded, so a refused request can be corrected and sent again
with the same key.

The ledger follows the data dir's ``storage``, as the souls' databases do (:mod:`soul_runtime.storage_modes`):
WAL on ``local``, a rollback journal on ``shared`` (Serve replicas on several nodes open it through the network
file system, where WAL's shared-memory index would not be shared). It is opened at its first use, by when the
runtime has recorded the data dir's layout. With a PostgreSQL storage the ledger is a table on the server
(:class:`~soul_runtime.memory.pg_records.PgLedger`), shared by every replica on every node.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from pathlib import Path

from soul_runtime.errors import StorageError
from soul_runtime.memory.pg_records import PgLedger
from soul_runtime.memory.postgres_db import is_postgres
from soul_runtime.owner_only import create_file, private_umask, restrict
from soul_runtime.storage_modes import check_storage, journal_for, recorded_storage

LEDGER_FILE = Path("service") / "idempotency.sqlite"
MAX_KEY = 200
BUSY_TIMEOUT_S = 30.0


def digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


class Ledger:
    """``storage``: ``local`` or ``shared``; None: the data dir's (:func:`recorded_storage`, read at first use)."""

    def __init__(self, data_dir: str | os.PathLike[str], storage: str | None = None) -> None:
        if storage is not None:
            check_storage(storage)
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LEDGER_FILE
        self.storage = storage
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._pg = PgLedger(storage) if storage is not None and is_postgres(storage) else None

    @property
    def db(self) -> sqlite3.Connection:
        """The open ledger (opened, and created, at first use; callers hold ``_lock``)."""
        if self._db is None:
            self._db = self._open()
        return self._db

    def _open(self) -> sqlite3.Connection:
        if self.storage is None:
            self.storage = recorded_storage(self.data_dir)
        want = journal_for(self.storage)
        create_file(self.path)
        try:
            with private_umask():
                db = sqlite3.connect(self.path, check_same_thread=False, timeout=BUSY_TIMEOUT_S, isolation_level=None)
                got = str(db.execute(f"PRAGMA journal_mode={want}").fetchone()[0]).lower()
            if got != want:
                db.close()
                raise StorageError(f"{self.path}: journal mode {want} refused (got {got}); is another process "
                                   "holding it?")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("CREATE TABLE IF NOT EXISTS keys (soul TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL,"
                       " PRIMARY KEY (soul, key))")
        except sqlite3.DatabaseError as e:
            raise StorageError(f"{self.path}: {e}") from e
        for extra in ("-wal", "-shm"):
            p = Path(str(self.path) + extra)
            if p.exists():
                restrict(p)
        return db

    def body_for(self, soul: str, key: str) -> str | None:
        """The body digest the key was first used with on this soul, or None."""
        if self._pg is not None:
            return self._pg.body_for(soul, digest(key))
        with self._lock:
            row = self.db.execute("SELECT body FROM keys WHERE soul = ? AND key = ?", (soul, digest(key))).fetchone()
        return None if row is None else str(row[0])

    def record(self, soul: str, key: str, body: str) -> str:
        """Record the key's body digest (the first one recorded stays); returns the one that stays."""
        if self._pg is not None:
            return self._pg.record(soul, digest(key), body)
        with self._lock:
            self.db.execute("INSERT OR IGNORE INTO keys (soul, key, body) VALUES (?, ?, ?)", (soul, digest(key), body))
            row = self.db.execute("SELECT body FROM keys WHERE soul = ? AND key = ?", (soul, digest(key))).fetchone()
        return str(row[0])

    def forget_soul(self, soul: str) -> int:
        if self._pg is not None:
            return self._pg.forget("soul = %s", soul)
        with self._lock:
            return int(self.db.execute("DELETE FROM keys WHERE soul = ?", (soul,)).rowcount)

    def forget_prefix(self, prefix: str) -> int:
        """Every soul whose id starts with ``prefix`` (a tenant's ``name:``)."""
        if self._pg is not None:
            return self._pg.forget("starts_with(soul, %s)", prefix)
        with self._lock:
            return int(self.db.execute("DELETE FROM keys WHERE substr(soul, 1, ?) = ?", (len(prefix), prefix)).rowcount)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
