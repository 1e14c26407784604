"""Idempotency keys of the HTTP service: which request body each key of a soul was first used with.

The runtime itself makes a request id idempotent (a turn sent again with the same ``request_id`` returns the
first result and is not applied twice). This ledger adds the one thing HTTP clients expect on top: the same key
sent with another body is refused instead of silently answered with the first result. It keeps, per soul,
SHA-256 digests of the key and of the body, never the key or the body (``DATA_DIR/service/idempotency.sqlite``,
owner-only). A key is recorded once its request succeeded, so a refused request can be corrected and sent again
with the same key.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from pathlib import Path

from soul_runtime.owner_only import create_file, restrict

LEDGER_FILE = Path("service") / "idempotency.sqlite"
MAX_KEY = 200


def digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


class Ledger:
    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.path = Path(data_dir) / LEDGER_FILE
        create_file(self.path)
        self._lock = threading.Lock()
        self.db = sqlite3.connect(self.path, check_same_thread=False, timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS keys (soul TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL,"
                        " PRIMARY KEY (soul, key))")
        for extra in ("-wal", "-shm"):
            p = Path(str(self.path) + extra)
            if p.exists():
                restrict(p)

    def body_for(self, soul: str, key: str) -> str | None:
        """The body digest the key was first used with on this soul, or None."""
        with self._lock:
            row = self.db.execute("SELECT body FROM keys WHERE soul = ? AND key = ?", (soul, digest(key))).fetchone()
        return None if row is None else str(row[0])

    def record(self, soul: str, key: str, body: str) -> str:
        """Record the key's body digest (the first one recorded stays); returns the one that stays."""
        with self._lock:
            self.db.execute("INSERT OR IGNORE INTO keys (soul, key, body) VALUES (?, ?, ?)", (soul, digest(key), body))
            row = self.db.execute("SELECT body FROM keys WHERE soul = ? AND key = ?", (soul, digest(key))).fetchone()
        return str(row[0])

    def forget_soul(self, soul: str) -> int:
        with self._lock:
            return int(self.db.execute("DELETE FROM keys WHERE soul = ?", (soul,)).rowcount)

    def forget_prefix(self, prefix: str) -> int:
        """Every soul whose id starts with ``prefix`` (a tenant's ``name:``)."""
        with self._lock:
            return int(self.db.execute("DELETE FROM keys WHERE substr(soul, 1, ?) = ?", (len(prefix), prefix)).rowcount)

    def close(self) -> None:
        with self._lock:
            self.db.close()
