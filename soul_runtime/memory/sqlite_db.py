"""SQLite, the record of truth: WAL mode, full sync, ordered named migrations."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from soul_runtime.errors import StorageError
from soul_runtime.owner_only import create_file, private_umask

Migration = tuple[str, str]  # (name, SQL script)
PAGE_SIZE = 1024
"""Bytes a page for new databases: a near-empty soul's schema takes a quarter of the space of 4 KiB pages."""
WAL_LIMIT = 64 * 1024
"""The WAL is truncated to this after a checkpoint instead of keeping its high-water size on disk."""


def open_db(path: Path, migrations: Sequence[Migration]) -> sqlite3.Connection:
    """Open (creating) a database and apply the migrations it has not seen, in order.

    Migration names are recorded in ``schema_migrations``; an applied migration is
    never run again, and a database that has migrations this code does not know is
    refused (it was written by a newer version).

    The file (and its directory) is created owner-only; SQLite gives the ``-wal`` and
    ``-shm`` files the database file's mode.
    """
    try:
        create_file(path)
        with private_umask():
            con = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30.0)
            con.execute(f"PRAGMA page_size={PAGE_SIZE}")  # takes effect on a new (empty) file only
            con.execute("PRAGMA journal_mode=WAL")
        con.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")
        con.execute("PRAGMA synchronous=FULL")
        con.execute("PRAGMA foreign_keys=ON")
        con.execute("CREATE TABLE IF NOT EXISTS schema_migrations (seq INTEGER PRIMARY KEY, name TEXT UNIQUE)")
        done = [r[0] for r in con.execute("SELECT name FROM schema_migrations ORDER BY seq")]
        known = [m[0] for m in migrations]
        if done != known[: len(done)]:
            raise StorageError(f"{path}: schema {done} does not match this version's migrations {known}")
        if len(done) < len(known):  # the pending migrations, in order, in one transaction (one fsync)
            con.execute("BEGIN IMMEDIATE")
            try:
                for seq, (name, sql) in enumerate(migrations):
                    if seq < len(done):
                        continue
                    for stmt in sql.split(";"):
                        if stmt.strip():
                            con.execute(stmt)
                    con.execute("INSERT INTO schema_migrations (seq, name) VALUES (?, ?)", (seq, name))
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return con
    except sqlite3.DatabaseError as e:
        raise StorageError(f"{path}: {e}") from e


@contextmanager
def transaction(con: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One atomic, durable transaction: all of it is on disk when this returns, or none of it."""
    try:
        con.execute("BEGIN IMMEDIATE")
    except sqlite3.DatabaseError as e:
        raise StorageError(str(e)) from e
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    try:
        con.execute("COMMIT")
    except sqlite3.DatabaseError as e:
        con.execute("ROLLBACK")
        raise StorageError(str(e)) from e
