"""Which SQLite journal a data dir's databases use: its ``storage`` setting, as the data dir records it.

``local``: WAL (readers never block the writer; its index lives in shared memory, so every process that opens a
database must be on one machine). ``shared``: a rollback journal (``delete``), valid on network file systems
(no shared memory; POSIX byte-range locks on the file), for a data dir on shared storage that processes on
several nodes open in turn. Every database the project opens follows it: the souls' layer and state databases
(``memory.sqlite_db``, whose ``JOURNAL`` is this mapping) and the HTTP service's idempotency ledger.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from soul_runtime.errors import ConfigError

JOURNAL = {"local": "wal", "shared": "delete"}
LAYOUT_FILE = "runtime.json"
"""Where a data dir records its layout, ``storage`` among it (written by ``actors.settings.claim_data_dir``)."""


POSTGRES = ("postgresql://", "postgres://")
"""A storage given as a PostgreSQL URL keeps the souls' records in that server; each node's data dir holds
caches of them (:mod:`soul_runtime.memory.pg_cache`)."""


def check_storage(kind: object) -> str:
    if isinstance(kind, str) and kind.startswith(POSTGRES):
        return kind
    if kind not in JOURNAL:
        raise ConfigError(f"storage must be one of {', '.join(JOURNAL)} or a postgresql:// URL, got {kind!r}")
    return str(kind)


def journal_for(kind: str) -> str:
    """The SQLite journal of a storage's files: a PostgreSQL storage's node-local caches use WAL."""
    return "wal" if kind.startswith(POSTGRES) else JOURNAL[kind]


def recorded_storage(data_dir: str | os.PathLike[str]) -> str:
    """The ``storage`` the data dir is served with (its ``runtime.json``); ``local`` before it was first served."""
    path = Path(data_dir) / LAYOUT_FILE
    try:
        with open(path) as f:
            kind = json.load(f).get("storage", "local")
    except FileNotFoundError:
        return "local"
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"{path} is unreadable ({e})") from None
    try:
        return check_storage(kind)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def journal_of(path: str | os.PathLike[str]) -> str | None:
    """The journal a SQLite database file is in, read from its header without opening it: ``wal`` (file format
    versions 2) or ``rollback`` (1: ``delete``, ``truncate``, ``persist`` ... are not recorded in the file);
    None if the file is not a SQLite database (or is empty: a database not yet written)."""
    with open(path, "rb") as f:
        head = f.read(20)
    if len(head) < 20 or not head.startswith(b"SQLite format 3\x00"):
        return None
    return {(2, 2): "wal", (1, 1): "rollback"}.get((head[18], head[19]), f"unknown ({head[18]}, {head[19]})")
