"""SQLite, the record of truth: WAL (or a rollback journal on shared storage), full sync, secure delete,
ordered named migrations."""

from __future__ import annotations

import errno
import logging
import os
import resource
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from soul_runtime.errors import StorageError
from soul_runtime.memory import migrations as migrations_runner
from soul_runtime.memory import postgres_db
from soul_runtime.memory.migrations import Migration
from soul_runtime.memory.pg_cache import CachedDb, Mirror
from soul_runtime.owner_only import create_file, private_umask, write_file
from soul_runtime.storage_modes import check_storage, journal_for  # local: WAL; shared: a rollback journal

log = logging.getLogger("soul_runtime.storage")
PAGE_SIZE = 512
"""Bytes a page for new databases: SQLite's smallest, so a near-empty soul's schema (a page a table or
index) takes an eighth of the space of 4 KiB pages."""
GROWN_PAGE_SIZE = 4096
GROW_AT = 256 * 1024
"""A database of small pages that has grown past this many bytes is rewritten with ``GROWN_PAGE_SIZE`` pages
when next opened (large tables and full-text segments read faster from larger pages)..."""
GROW_UNTIL = 2**30
"""...unless it is already larger than this (the one-off rewrite would stall its opening for long)."""
MMAP_AT = 16 * 2**20
"""A local database of at least this many bytes when opened is read through a memory map (``MMAP_SIZE``): a
recall in a large store looks up hundreds of rows and full-text pages that SQLite's own page cache (2 MiB)
does not hold, and mapped pages are read in place instead of being copied in by a system call each (about a
sixth of a recall's CPU at 100,000 episodes). Smaller databases fit the page cache and are not mapped; nor is
any database on shared storage, where an I/O error under a map is a signal rather than an error."""
MMAP_SIZE = 2**30
WAL_LIMIT = 64 * 1024
"""The WAL is truncated to this after a checkpoint instead of keeping its high-water size on disk."""

_storage = ["local"]


def use_storage(kind: str) -> None:
    """Choose the storage of every database this process opens from now on: ``local`` or ``shared`` (the
    journal of the SQLite files that are the record), or a ``postgresql://`` URL (the files are node-local caches
    of PostgreSQL rows: :mod:`soul_runtime.memory.pg_cache`)."""
    _storage[0] = check_storage(kind)


def storage() -> str:
    """The storage this process opens databases with (see :func:`use_storage`)."""
    return _storage[0]


def postgres_url() -> str | None:
    """The PostgreSQL URL of this process's storage; None for SQLite files."""
    return _storage[0] if postgres_db.is_postgres(_storage[0]) else None


def grow_pages(con: sqlite3.Connection, journal: str) -> bool:
    """Rewrite a database of small pages that has grown (see ``GROW_AT``) with larger pages; the page size can
    only change outside WAL mode, so the journal goes to DELETE for the rewrite and back. Skipped (False) when
    another connection holds the file: the next opening tries again."""
    size, pages = _pages(con)
    if size >= GROWN_PAGE_SIZE or not GROW_AT <= size * pages <= GROW_UNTIL:
        return False
    try:
        if journal == "wal" and str(con.execute("PRAGMA journal_mode=DELETE").fetchone()[0]).lower() != "delete":
            return False
        con.execute(f"PRAGMA page_size={GROWN_PAGE_SIZE}")
        con.execute("VACUUM")
    except sqlite3.OperationalError:  # busy: another connection has it open
        return False
    finally:
        if journal == "wal":
            con.execute("PRAGMA journal_mode=WAL")
    return int(con.execute("PRAGMA page_size").fetchone()[0]) == GROWN_PAGE_SIZE


_templates: dict[tuple[object, ...], bytes] = {}
_templates_lock = threading.Lock()


def _template(migrations: Sequence[Migration], page_size: int) -> bytes:
    """The bytes of a new database with every migration applied, built once per process (per schema, page
    size and journal mode) by the same code that migrates any database."""
    key = (tuple(migrations), int(page_size), _storage[0])
    with _templates_lock:
        blob = _templates.get(key)
        if blob is None:
            with tempfile.TemporaryDirectory(prefix="soul-db-template-") as d:
                path = Path(d) / "new.sqlite"
                _open(path, migrations, page_size).close()  # the last close checkpoints the WAL into the file
                blob = _templates[key] = path.read_bytes()
    return blob


def _create(path: Path, migrations: Sequence[Migration], page_size: int) -> None:
    """Create a new database as a durable copy of the template (a file write and an fsync, instead of running
    every migration and the fsyncs of its journal-mode change and commit). Atomic: of two processes creating
    one database at once, one wins and the other opens its file."""
    write_file(path, _template(migrations, page_size), replace=False)


def open_db(path: Path, migrations: Sequence[Migration], *, page_size: int = PAGE_SIZE,
            derived: Sequence[str] = ()) -> sqlite3.Connection:
    """Open (creating) a database and apply the migrations it has not seen, in order.

    Migration names are recorded in ``schema_migrations``; an applied migration is
    never run again, and a database that has migrations this code does not know is
    refused (it was written by a newer version). A new database starts as a copy of
    a template migrated once per process.

    The file (and its directory) is created owner-only; SQLite gives the ``-wal`` and
    ``-shm`` files the database file's mode. ``page_size`` applies to a new file only (a power of two,
    512..65536): small pages keep a near-empty database small, larger ones suit large tables.

    With a PostgreSQL storage the file is the node's cache of the soul database's rows, checked against the
    server and rebuilt when missing or behind (``derived``: statements that fill its virtual tables from its
    rows after a rebuild).
    """
    path = Path(path)
    url = postgres_url()
    if url is not None:
        return _open_cache(path, migrations, page_size, derived, url)
    try:
        if not path.exists():
            _create(path, migrations, page_size)
        return _open(path, migrations, page_size)
    except (sqlite3.DatabaseError, OSError) as e:
        raise storage_error(e, path) from e


def _open(path: Path, migrations: Sequence[Migration], page_size: int) -> sqlite3.Connection:
    try:
        create_file(path)
        with private_umask():
            con = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30.0,
                                  factory=CachedDb)
            con.execute(f"PRAGMA page_size={int(page_size)}")  # takes effect on a new (empty) file only
            want = journal_for(_storage[0])
            got = con.execute(f"PRAGMA journal_mode={want}").fetchone()[0]
        if str(got).lower() != want:
            raise StorageError(f"{path}: journal mode {want} refused (got {got}); is another process holding it?")
        con.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")
        # a cache's durability is the server's: its file need not be synced on every commit
        con.execute("PRAGMA synchronous=NORMAL" if postgres_url() else "PRAGMA synchronous=FULL")
        con.execute("PRAGMA foreign_keys=ON")
        con.execute("PRAGMA secure_delete=ON")  # deleted and overwritten content is zeroed, not left in free space
        con.execute(migrations_runner.TABLE)
        done = [r[0] for r in con.execute("SELECT name FROM schema_migrations ORDER BY seq")]
        migrations_runner.check(done, migrations, path)
        if len(done) < len(migrations):  # the pending migrations, in order, in one transaction (one fsync)
            con.execute("BEGIN IMMEDIATE")
            try:
                # another process may have applied some since we looked (two open a new soul at once)
                done = [r[0] for r in con.execute("SELECT name FROM schema_migrations ORDER BY seq")]
                migrations_runner.run(con.execute, done, migrations, path)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        grow_pages(con, want)
        size, pages = _pages(con)
        if want == "wal" and size * pages >= MMAP_AT:
            con.execute(f"PRAGMA mmap_size={MMAP_SIZE}")
        return con
    except sqlite3.DatabaseError as e:
        raise storage_error(e, path) from e


def _pages(con: sqlite3.Connection) -> tuple[int, int]:
    """The database's page size and page count."""
    return int(con.execute("PRAGMA page_size").fetchone()[0]), int(con.execute("PRAGMA page_count").fetchone()[0])


def memory_bytes(con: sqlite3.Connection) -> int:
    """What an open database can hold in memory: its page cache, at most the whole file (for eviction by bytes).
    A mapped database's pages are the operating system's page cache, shared and reclaimable, and not counted."""
    size, pages = _pages(con)
    cache = int(con.execute("PRAGMA cache_size").fetchone()[0])  # < 0: KiB; > 0: pages
    ceiling = -cache * 1024 if cache < 0 else cache * size
    return min(pages * size, ceiling)


_CAUSES = {"SQLITE_FULL": "disk full", "SQLITE_READONLY": "read-only storage", "SQLITE_IOERR": "I/O error",
           "SQLITE_CANTOPEN": "cannot open the file", "SQLITE_CORRUPT": "corrupt database",
           "SQLITE_NOTADB": "not a database"}
_ERRNO_CAUSES = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.EFBIG: "file size limit",
                 errno.EROFS: "read-only storage", errno.EACCES: "permission denied", errno.EPERM: "permission denied",
                 errno.EIO: "I/O error"}


def storage_cause(e: BaseException) -> str:
    """What a failed read or write of the record ran into, in a few words ("disk full", "read-only storage",
    "I/O error", ...), from SQLite's error code or the system call's errno."""
    name = str(getattr(e, "sqlite_errorname", "") or "")
    for prefix, cause in _CAUSES.items():
        if name.startswith(prefix):
            return cause
    if isinstance(e, OSError) and e.errno in _ERRNO_CAUSES:
        return _ERRNO_CAUSES[e.errno]
    text = str(e).lower()
    if "disk is full" in text or "no space" in text:
        return "disk full"
    if "readonly" in text or "read-only" in text:
        return "read-only storage"
    if "disk i/o" in text:
        return "I/O error"
    return type(e).__name__


def storage_error(e: BaseException, where: object) -> StorageError:
    """``e`` as the :class:`StorageError` that names its cause and the file. When SQLite only says it could not
    open or write the file, the file system says why: mounted read-only, or out of space."""
    cause = storage_cause(e)
    if cause in ("cannot open the file", "I/O error", "OperationalError"):
        cause = _file_system_cause(Path(str(where))) or cause
    return StorageError(f"{where}: {cause} ({e})")


def _file_system_cause(path: Path) -> str | None:
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        return f"file size limit (this process may write files of at most {limit} bytes)"
    for p in (path.parent, *path.parent.parents):
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        if st.f_flag & os.ST_RDONLY:
            return "read-only storage"
        if st.f_bavail == 0 and st.f_blocks:
            return "disk full"
        return None
    return None


def _path(con: sqlite3.Connection) -> str:
    try:
        return str(con.execute("PRAGMA database_list").fetchone()[2]) or "database"
    except sqlite3.Error:
        return "database"


def _rollback(con: sqlite3.Connection) -> None:
    """Roll back what is still open. SQLite has already rolled back a transaction that failed on a full disk
    or an I/O error; a second rollback would only hide the first error."""
    if con.in_transaction:
        try:
            con.execute("ROLLBACK")
        except sqlite3.Error:
            pass


@contextmanager
def transaction(con: sqlite3.Connection, *, deferred: bool = False) -> Iterator[sqlite3.Connection]:
    """One atomic, durable transaction: all of it is on disk when this returns, or none of it. A failure of the
    storage itself (disk full, read-only, I/O error) is raised as :class:`StorageError` naming its cause.

    ``deferred``: with a PostgreSQL storage, this transaction's rows go to the server with the database's next
    transaction instead of now (:meth:`~soul_runtime.memory.pg_cache.Mirror.defer`): for a commit whose content
    the server can rebuild from what it already holds (a turn's commit, from its write intent)."""
    try:
        con.execute("BEGIN IMMEDIATE")
    except sqlite3.DatabaseError as e:
        raise storage_error(e, _path(con)) from e
    mirror = getattr(con, "mirror", None)
    try:
        yield con
        if mirror is not None and not (deferred and mirror.defer(con)):
            mirror.push(con, mirror.code_schema)  # the rows go to the server before SQLite commits them
    except sqlite3.DatabaseError as e:
        _rollback(con)  # with a mirror, its notes of this transaction's changes go too (a temporary table, inside it)
        if isinstance(e, sqlite3.IntegrityError | sqlite3.ProgrammingError | sqlite3.InterfaceError):
            raise
        raise storage_error(e, _path(con)) from e
    except BaseException:
        _rollback(con)
        raise
    try:
        con.execute("COMMIT")
    except sqlite3.DatabaseError as e:
        _rollback(con)
        raise storage_error(e, _path(con)) from e


def _open_cache(path: Path, migrations: Sequence[Migration], page_size: int, derived: Sequence[str],
                url: str) -> sqlite3.Connection:
    """Open a soul database's node-local cache (see :mod:`soul_runtime.memory.pg_cache`): kept when it holds
    the server's version, else rebuilt from the server's rows under the schema they were written with, then
    migrated by the same runner as any database (a migration's changes go to the server whole)."""
    from soul_runtime.memory.erasure import unlink_files

    mirror = Mirror(url, path, derived)
    state = mirror.state()
    local = _cache_mark(path) if path.exists() else None
    if path.exists() and local is None:
        raise StorageError(f"{path}: a SQLite record, not a cache of {postgres_db.redacted(url)}: move the data "
                           "dir's records into PostgreSQL with `soul storage migrate` first")
    try:
        rebuilt = False
        if local is not None and (state is None or local[0] != state[0]):
            unlink_files(path.parent, path.stem)  # behind the server (or forgotten there): derive it anew
        if state is not None and not path.exists():
            started = time.monotonic()
            rows, size = mirror.rows()
            log.info("rebuilding %s from %d rows (%d bytes) of the server", path, sum(map(len, rows.values())), size)
            if size >= GROW_AT:  # as large as a database that would grow its pages: large pages from the start
                page_size = max(page_size, GROWN_PAGE_SIZE)
            _create(path, migrations[: state[1]], page_size)
            con = _open(path, migrations[: state[1]], page_size)
            mirror.attach_mark(con)
            with transaction(con):
                mirror.load(con, *state, rows)
            con.close()
            rebuilt = True
            log.info("rebuilt %s from the server in %.1f s", path, time.monotonic() - started)
        if not path.exists():
            _create(path, migrations, page_size)
        con = _open(path, migrations, page_size)
        have = int(con.execute("SELECT COUNT(*) FROM schema_migrations").fetchone()[0])
        mirror.attach(con)
        mirror.code_schema = have
        con.mirror = mirror  # type: ignore[attr-defined]
        if state is not None and mirror.schema < have:  # migrated here: the server gets the rows as they are now
            with transaction(con):
                mirror.push(con, have, everything=True)
        mirror.rebuilt = rebuilt
        return con
    except (sqlite3.DatabaseError, OSError) as e:
        raise storage_error(e, path) from e


def _cache_mark(path: Path) -> tuple[int, int] | None:
    """The (version, schema) a cache file says it holds; None if the file is not a cache (or unreadable)."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
    except sqlite3.Error:
        return None
    try:
        r = con.execute("SELECT version, schema FROM pg_mark WHERE id = 0").fetchone()
        return (int(r[0]), int(r[1])) if r else (0, 0)
    except sqlite3.Error:
        return None
    finally:
        con.close()
