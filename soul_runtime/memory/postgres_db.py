"""PostgreSQL, the record of truth of a ``postgresql://`` storage: one bounded pool per process, the schema's
ordered named migrations, and what a failure of the server means to a caller.

The HTTP service keeps its idempotency ledger (``service_keys``: digests only) and its tenants (``service_docs``,
one versioned JSON document) there too. Every durable row of a soul lives in two tables (see :mod:`soul_runtime.memory.pg_cache` for how a node's
SQLite caches are derived from them):

- ``soul_dbs``: one row per soul database (``soul``, ``db`` = ``episodic`` | ``semantic`` | ``procedural`` |
  ``soul``) with its ``version`` (bumped by every commit: the fencing compare-and-set), the number of its schema
  migrations the rows were written under, and the id of the transaction that wrote it last.
- ``soul_rows``: each row of each table of those databases, its cells msgpack-encoded by column name.

A server that is down, restarting or out of connections is waited for with bounded retries
(``SOUL_PG_RETRY_S``, 20 s by default), then :class:`RuntimeUnavailable`; a write the server refuses (disk full,
a constraint, a read-only replica) is a :class:`StorageError` naming the cause.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from soul_runtime.errors import ConfigError, RuntimeUnavailable, StaleOwner, StorageError
from soul_runtime.memory import migrations
from soul_runtime.storage_modes import POSTGRES

T = TypeVar("T")

SCHEMES = POSTGRES
POOL_SIZE = int(os.environ.get("SOUL_PG_POOL", "8") or 8)
"""Connections a process keeps at most (each store shard and soul host is a process)."""
RETRY_S = float(os.environ.get("SOUL_PG_RETRY_S", "20") or 20)
"""How long a call waits for an unreachable server before :class:`RuntimeUnavailable`."""

MIGRATIONS = [
    ("0001_souls", """
        CREATE TABLE soul_dbs (
            soul TEXT NOT NULL, db TEXT NOT NULL, version BIGINT NOT NULL, schema INTEGER NOT NULL,
            txn TEXT NOT NULL DEFAULT '', PRIMARY KEY (soul, db));
        CREATE TABLE soul_rows (
            soul TEXT NOT NULL, db TEXT NOT NULL, tbl TEXT NOT NULL, rid BIGINT NOT NULL, cells BYTEA NOT NULL,
            PRIMARY KEY (soul, db, tbl, rid))
    """),
    ("0002_service", """
        CREATE TABLE service_keys (soul TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (soul, key));
        CREATE TABLE service_docs (name TEXT PRIMARY KEY, version BIGINT NOT NULL, body TEXT NOT NULL)
    """),
]
"""The schema's steps, in order: named ``NNNN_what``, recorded in ``schema_migrations``, never edited once
released (the convention of every database of the project: see :mod:`soul_runtime.memory.episodic_schema`)."""


def is_postgres(storage: object) -> bool:
    return isinstance(storage, str) and storage.startswith(SCHEMES)


def redacted(url: str) -> str:
    """The URL without its password (for messages and logs)."""
    head, sep, tail = url.partition("://")
    creds, at, rest = tail.rpartition("@")
    if not at or ":" not in creds:
        return url
    return f"{head}{sep}{creds.split(':', 1)[0]}:***@{rest}"


_pools: dict[str, Any] = {}
_pools_lock = threading.Lock()


def pool(url: str) -> Any:
    """This process's pool for ``url`` (opened on first use, at most ``POOL_SIZE`` connections), its schema
    migrated."""
    with _pools_lock:
        p = _pools.get(url)
        if p is None:
            try:
                from psycopg_pool import ConnectionPool
            except ImportError as e:  # pragma: no cover - an install without the extra
                raise ConfigError("a postgresql:// storage needs psycopg: pip install 'soul-runtime[postgres]'"
                                  ) from e
            p = ConnectionPool(url, min_size=1, max_size=POOL_SIZE, open=False, timeout=RETRY_S,
                               kwargs={"autocommit": True}, name="soul-runtime")
            p.open(wait=False)
            _pools[url] = p
            try:
                retrying(lambda: _migrate(p), url)
            except BaseException:
                _pools.pop(url, None)
                p.close()
                raise
        return p


def opened_pool(url: str) -> Any:
    """This process's pool for ``url`` if it is open (None after :func:`close_pools`)."""
    with _pools_lock:
        return _pools.get(url)


def close_pools() -> None:
    with _pools_lock:
        for p in _pools.values():
            p.close()
        _pools.clear()


def _migrate(p: Any) -> None:
    """Apply the migrations the database has not seen, in order, in one transaction; processes starting
    together take turns on an advisory lock."""
    with p.connection() as con, con.transaction():
        con.execute("SELECT pg_advisory_xact_lock(7461636)")
        con.execute(migrations.TABLE)
        done = [r[0] for r in con.execute("SELECT name FROM schema_migrations ORDER BY seq")]
        migrations.run(con.execute, done, MIGRATIONS, "PostgreSQL", placeholder="%s")


def unreachable(e: BaseException) -> bool:
    """Is ``e`` the server being away (down, restarting, out of connections) rather than refusing a write?"""
    import psycopg
    from psycopg_pool import PoolTimeout

    if isinstance(e, PoolTimeout):
        return True
    if isinstance(e, psycopg.errors.DiskFull | psycopg.errors.IntegrityError | psycopg.errors.ReadOnlySqlTransaction):
        return False
    sqlstate = getattr(e, "sqlstate", None) or ""
    # 08: connection exceptions; 57P0x: admin / crash shutdown, cannot connect now; 53300: too many connections
    return isinstance(e, psycopg.OperationalError) and (
        not sqlstate or sqlstate.startswith(("08", "57P")) or sqlstate == "53300")


def cause(e: BaseException) -> str:
    import psycopg

    if isinstance(e, psycopg.errors.DiskFull):
        return "disk full"
    if isinstance(e, psycopg.errors.ReadOnlySqlTransaction):
        return "read-only server"
    if isinstance(e, psycopg.errors.IntegrityError):
        return "constraint refused"
    if isinstance(e, psycopg.errors.InsufficientPrivilege):
        return "permission denied"
    return type(e).__name__


def retrying(fn: Callable[[], T], url: str, *, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, tried again while the server is unreachable for up to ``RETRY_S``; then
    :class:`RuntimeUnavailable`. A refusal of the server is a :class:`StorageError` naming its cause;
    :class:`StaleOwner` passes through."""
    import psycopg

    start = clock()
    pause = 0.05
    while True:
        try:
            return fn()
        except StaleOwner:
            raise
        except (psycopg.Error, OSError) as e:
            try:
                from psycopg_pool import PoolTimeout
            except ImportError:  # pragma: no cover
                PoolTimeout = ()  # type: ignore[assignment,misc]  # noqa: N806
            if not (unreachable(e) or isinstance(e, PoolTimeout | OSError)):
                raise StorageError(f"PostgreSQL {redacted(url)}: {cause(e)} ({e})") from e
            if clock() - start >= RETRY_S:
                raise RuntimeUnavailable(f"PostgreSQL {redacted(url)} unreachable for {RETRY_S:.0f} s: {e}") from e
            sleep(pause)
            pause = min(1.0, pause * 2)


@contextmanager
def connection(url: str) -> Iterator[Any]:
    """A pooled connection inside one transaction (committed when the block ends without an error)."""
    with pool(url).connection() as con, con.transaction():
        yield con


@contextmanager
def statement(url: str) -> Iterator[Any]:
    """A pooled connection for one statement, its own transaction (one round trip: for reads of one query)."""
    with pool(url).connection() as con:
        yield con
