"""A soul database as a node-local SQLite cache of its PostgreSQL rows (a ``postgresql://`` storage).

The layers run on SQLite either way: with a PostgreSQL storage, each soul database
(``DATA_DIR/souls/SOUL/<db>.sqlite``, DATA_DIR on the node's own disk) is a cache derived from the soul's rows
in PostgreSQL (:mod:`soul_runtime.memory.postgres_db`), so recall ranks from the local full-text and vector
indices and never queries the server, and the layers' code does not know which storage it runs on.

- **Writes**: temporary triggers note each changed row of the database's tables; when a transaction commits
  (:func:`soul_runtime.memory.sqlite_db.transaction`), the changed rows go to PostgreSQL in one transaction
  that first compares the database's ``version`` with the one this cache was derived from and bumps it (a
  compare-and-set), and only then does SQLite commit. A writer whose cache is behind — an old owner on another
  node, after a new owner fenced the soul — is refused with :class:`StaleOwner`: one writer per soul across
  nodes, with no file lock and no lease to wait out. The pushes of a process's threads go to the server
  together (:mod:`soul_runtime.memory.pg_commits`).
- **A deferred commit**: a transaction whose content the server can already rebuild (a turn's commit: the write
  intent before it holds the turn's reply, trace and buffer) commits in the cache only, and its rows go with
  the database's next push (the next turn's intent, or closing it). Until then the cache is marked ahead of the
  server (a negative mark): found so when opened — the process died — it is rebuilt from the server's rows, and
  the turn is finished from its intent as after any crash.
- **The mark**: the cache records the version it holds (``pg_mark``). Opening a database whose cache is
  missing or behind rebuilds it from the rows (and its derived tables: the full-text index; the vector index is
  rebuilt from the rows' vectors as after any loss of its file).
- **Not mirrored**: virtual tables and their shadow tables (derived), the vector index's change log (local to
  its index file), ``schema_migrations`` (code) and the mark itself.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack

from soul_runtime.errors import StaleOwner
from soul_runtime.memory import pg_commits, postgres_db

LOCAL_ONLY = frozenset({"schema_migrations", "index_log", "pg_mark", "sqlite_sequence", "sqlite_stat1"})
"""Tables of a soul database that are not rows of the soul (see the module's docstring)."""


_PROCESS = uuid.uuid4().hex[:16]
_pushes = itertools.count()
"""A push's transaction id: a random prefix, the process and a count (unique without a random draw each)."""


class CachedDb(sqlite3.Connection):
    """A SQLite connection; with a PostgreSQL storage, the cache of one soul database (``mirror`` set)."""

    mirror: Mirror | None = None


def key_of(path: Path) -> tuple[str, str]:
    """(soul id, database) of a soul database's file: ``.../souls/SOUL/episodic.sqlite``."""
    return path.parent.name, path.stem


class Mirror:
    """What ties one open cache to its rows: the server, the soul database's key, the version the cache holds."""

    def __init__(self, url: str, path: Path, derived: Sequence[str] = ()) -> None:
        self.url = url
        self.soul, self.db = key_of(path)
        self.derived = tuple(derived)
        self.version = 0
        self.schema = 0
        self.tables: list[str] = []
        self.columns: dict[str, tuple[list[str], bool]] = {}
        self.code_schema = 0
        """How many migrations this code's schema has (what a push records the rows as written under)."""
        self.rebuilt = False
        """Whether opening rebuilt the cache from the server's rows."""
        self.deferred = False
        """Whether the cache holds a commit not yet on the server (:meth:`defer`)."""

    # ---- the server's side ------------------------------------------------------------
    def state(self) -> tuple[int, int] | None:
        """(version, schema) of the soul database on the server; None if it has no rows."""
        def read() -> tuple[int, int] | None:
            with postgres_db.statement(self.url) as con:
                r = con.execute("SELECT version, schema FROM soul_dbs WHERE soul = %s AND db = %s",
                                (self.soul, self.db)).fetchone()
            return None if r is None else (int(r[0]), int(r[1]))
        got = postgres_db.retrying(read, self.url)
        _present(self.url, self.soul, self.db, got is not None)
        return got

    def rows(self) -> tuple[dict[str, list[tuple[int, dict[str, Any]]]], int]:
        """The soul database's rows on the server, by table in row order, and their size in bytes."""
        def read() -> list[tuple[str, int, bytes]]:
            with postgres_db.statement(self.url) as con:
                return list(con.execute("SELECT tbl, rid, cells FROM soul_rows WHERE soul = %s AND db = %s "
                                        "ORDER BY tbl, rid", (self.soul, self.db)).fetchall())
        out: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
        size = 0
        for tbl, rid, cells in postgres_db.retrying(read, self.url):
            size += len(cells)
            out[tbl].append((int(rid), msgpack.unpackb(cells, raw=False)))
        return out, size

    # ---- the cache's side -------------------------------------------------------------
    @staticmethod
    def attach_mark(con: sqlite3.Connection) -> None:
        con.execute("CREATE TABLE IF NOT EXISTS pg_mark (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER "
                    "NOT NULL, schema INTEGER NOT NULL)")

    def attach(self, con: sqlite3.Connection) -> None:
        """Note the cache's tables and start noting their changes (temporary triggers: not in the file)."""
        self.attach_mark(con)
        con.execute("CREATE TEMP TABLE IF NOT EXISTS pg_changes (tbl TEXT NOT NULL, rid INTEGER NOT NULL)")
        defined = _mirrored(con)
        self.tables = sorted(defined)
        self.columns = {t: _columns(con, t, defined[t]) for t in self.tables}
        for t in self.tables:
            note = "INSERT INTO pg_changes VALUES ('{t}', {which}.rowid)"
            con.execute(f"CREATE TEMP TRIGGER IF NOT EXISTS pg_{t}_i AFTER INSERT ON main.{t} BEGIN "
                        f"{note.format(t=t, which='new')}; END")
            con.execute(f"CREATE TEMP TRIGGER IF NOT EXISTS pg_{t}_u AFTER UPDATE ON main.{t} BEGIN "
                        f"{note.format(t=t, which='old')}; {note.format(t=t, which='new')}; END")
            con.execute(f"CREATE TEMP TRIGGER IF NOT EXISTS pg_{t}_d AFTER DELETE ON main.{t} BEGIN "
                        f"{note.format(t=t, which='old')}; END")
        con.execute("PRAGMA recursive_triggers = ON")  # a REPLACE's implicit delete is noted too
        r = con.execute("SELECT version, schema FROM pg_mark WHERE id = 0").fetchone()
        self.version, self.schema = (int(r[0]), int(r[1])) if r else (0, 0)

    def load(self, con: sqlite3.Connection, version: int, schema: int,
             rows: dict[str, list[tuple[int, dict[str, Any]]]]) -> int:
        """Fill an empty cache (at the rows' schema) with the server's ``rows`` (:meth:`rows`), derive its virtual
        tables and mark it; inside the caller's transaction. Returns how many rows."""
        n = 0
        for tbl, table in rows.items():
            cols, has_alias = _columns(con, tbl)
            if not table:
                continue
            names = [c for c in cols if c in table[0][1]]
            head = names if has_alias else ["rowid", *names]
            sql = f"INSERT INTO main.{tbl} ({','.join(head)}) VALUES ({','.join('?' * len(head))})"
            con.executemany(sql, [[cells.get(c) for c in names] if has_alias else [rid, *(cells.get(c) for c in names)]
                                  for rid, cells in table])
            n += len(table)
        for stmt in self.derived:
            con.execute(stmt)
        con.execute("INSERT OR REPLACE INTO pg_mark VALUES (0, ?, ?)", (version, schema))
        self.version, self.schema = version, schema
        return n

    def push(self, con: sqlite3.Connection, schema: int, *, everything: bool = False) -> None:
        """Inside the caller's SQLite transaction, before it commits: send the rows it changed (or, with
        ``everything``, all rows, replacing the server's) to PostgreSQL in one transaction that takes the
        database's next version if the server's is the one this cache holds; then mark the cache with it."""
        puts: list[tuple[str, int, bytes]] = []
        dels: list[tuple[str, int]] = []
        changed: dict[str, set[int]] = {}
        if everything:
            tables = self.tables
        else:
            for tbl, rid in con.execute("SELECT tbl, rid FROM temp.pg_changes"):
                changed.setdefault(tbl, set()).add(rid)
            if not changed:
                return
            tables = list(changed)
        pack = msgpack.packb
        for tbl in tables:  # each table's changed rows in one query: those still there are written, the rest deleted
            cols, _ = self.columns.get(tbl) or _columns(con, tbl)
            which = "" if everything else " WHERE rowid IN (SELECT rid FROM temp.pg_changes WHERE tbl = ?)"
            found = con.execute(f"SELECT rowid, {','.join(cols)} FROM main.{tbl}{which}",
                                () if everything else (tbl,)).fetchall()
            for row in found:
                puts.append((tbl, row[0], pack(dict(zip(cols, row[1:], strict=True)), use_bin_type=True)))
            if not everything:
                gone = changed[tbl].difference(row[0] for row in found)
                dels += [(tbl, r) for r in sorted(gone)]
        con.execute("DELETE FROM temp.pg_changes")
        txn = f"{_PROCESS}{os.getpid():x}-{next(_pushes):x}"
        expected = self.version

        def send() -> None:
            if not everything and pg_commits.group(self.url).commit(
                    pg_commits.Change(self.soul, self.db, expected, schema, txn, puts, dels)):
                return  # the usual commit, in one statement with the other pushes of this process waiting
            with postgres_db.connection(self.url) as pg:
                r = pg.execute("SELECT version, txn FROM soul_dbs WHERE soul = %s AND db = %s FOR UPDATE",
                               (self.soul, self.db)).fetchone()
                if r is not None and int(r[0]) == expected + 1 and r[1] == txn:
                    return  # an earlier try committed and its answer was lost
                if (0 if r is None else int(r[0])) != expected:
                    raise StaleOwner(f"soul {self.soul} {self.db}: another owner wrote it (version "
                                     f"{0 if r is None else r[0]}, this one holds {expected}); nothing was written")
                if r is None:
                    pg.execute("INSERT INTO soul_dbs (soul, db, version, schema, txn) VALUES (%s, %s, %s, %s, %s)",
                               (self.soul, self.db, expected + 1, schema, txn))
                else:
                    pg.execute("UPDATE soul_dbs SET version = %s, schema = %s, txn = %s WHERE soul = %s AND db = %s",
                               (expected + 1, schema, txn, self.soul, self.db))
                if everything:
                    pg.execute("DELETE FROM soul_rows WHERE soul = %s AND db = %s", (self.soul, self.db))
                elif dels:
                    with pg.cursor() as cur:
                        cur.executemany("DELETE FROM soul_rows WHERE soul = %s AND db = %s AND tbl = %s AND rid = %s",
                                        [(self.soul, self.db, t, r) for t, r in dels])
                if puts:
                    with pg.cursor() as cur:
                        cur.executemany(
                            "INSERT INTO soul_rows (soul, db, tbl, rid, cells) VALUES (%s, %s, %s, %s, %s) "
                            "ON CONFLICT (soul, db, tbl, rid) DO UPDATE SET cells = EXCLUDED.cells",
                            [(self.soul, self.db, t, r, c) for t, r, c in puts])

        postgres_db.retrying(send, self.url)
        self.version, self.schema, self.deferred = expected + 1, schema, False
        con.execute("INSERT OR REPLACE INTO pg_mark VALUES (0, ?, ?)", (self.version, schema))
        _present(self.url, self.soul, self.db, True)

    def defer(self, con: sqlite3.Connection) -> bool:
        """Inside the caller's SQLite transaction, instead of :meth:`push`: keep its changes noted for the next
        push of this database and mark the cache as ahead of the server (a cache found so when it is opened is
        rebuilt from the server's rows). False when there is nothing on the server to be ahead of yet (the
        caller pushes)."""
        if self.version <= 0:
            return False
        con.execute("INSERT OR REPLACE INTO pg_mark VALUES (0, ?, ?)", (-self.version, self.schema))
        self.deferred = True
        return True


def mirrored_tables(con: sqlite3.Connection) -> list[str]:
    return sorted(_mirrored(con))


def _mirrored(con: sqlite3.Connection) -> dict[str, str]:
    """The mirrored tables of a soul database, each with its definition (its ``CREATE`` statement)."""
    rows = con.execute("SELECT name, sql FROM main.sqlite_master WHERE type = 'table'").fetchall()
    virtual = tuple(str(n) for n, sql in rows if str(sql or "").upper().startswith("CREATE VIRTUAL"))
    shadow = tuple(v + "_" for v in virtual)  # a virtual table's shadow tables: its name, an underscore, a suffix
    return {n: str(sql) for n, sql in ((str(r[0]), r[1]) for r in rows)
            if n not in LOCAL_ONLY and n not in virtual and not n.startswith(("sqlite_", *shadow))}


def _columns(con: sqlite3.Connection, table: str, sql: str | None = None) -> tuple[list[str], bool]:
    """A table's columns, and whether one of them is its rowid (an INTEGER PRIMARY KEY). Kept per table
    definition ``sql`` when given (every soul database of a kind shares them)."""
    got = _by_definition.get(sql) if sql is not None else None
    if got is None:
        info = con.execute(f"PRAGMA main.table_info({table})").fetchall()
        pks = [r for r in info if r[5]]
        alias = len(pks) == 1 and str(pks[0][2]).upper() == "INTEGER"
        got = ([str(r[1]) for r in info], alias)
        if sql is not None:
            _by_definition[sql] = got
    return got


_by_definition: dict[str, tuple[list[str], bool]] = {}


# ---- which souls have rows: asked of the server once per process and database, then kept ----------------
_known: dict[tuple[str, str, str], bool] = {}
_known_lock = threading.Lock()


def _present(url: str, soul: str, db: str, present: bool) -> None:
    with _known_lock:
        _known[(url, soul, db)] = present


def stored(url: str, path: Path, *, keep_absent: bool = True) -> bool:
    """Has this soul database rows on the server? A yes is kept (rows leave only by a drop, which this process
    is told of); a no only with ``keep_absent``, for the database's one writer (its store shard), which would
    know of a first write."""
    soul, db = key_of(path)
    with _known_lock:
        got = _known.get((url, soul, db))
    if got or (got is not None and keep_absent):
        return got

    def read() -> bool:
        with postgres_db.statement(url) as con:
            return con.execute("SELECT 1 FROM soul_dbs WHERE soul = %s AND db = %s", (soul, db)).fetchone() is not None
    got = postgres_db.retrying(read, url)
    _present(url, soul, db, got)
    return got


def drop(url: str, soul: str, db: str | None = None) -> int:
    """Delete a soul database's rows (every database of the soul when ``db`` is None) from the server; how many."""
    def run() -> int:
        with postgres_db.connection(url) as con:
            if db is None:
                n = con.execute("DELETE FROM soul_rows WHERE soul = %s", (soul,)).rowcount
                con.execute("DELETE FROM soul_dbs WHERE soul = %s", (soul,))
            else:
                n = con.execute("DELETE FROM soul_rows WHERE soul = %s AND db = %s", (soul, db)).rowcount
                con.execute("DELETE FROM soul_dbs WHERE soul = %s AND db = %s", (soul, db))
            return int(n)
    n = postgres_db.retrying(run, url)
    with _known_lock:
        for key in [k for k in _known if k[0] == url and k[1] == soul and (db is None or k[2] == db)]:
            _known[key] = False
    return n


def soul_ids(url: str, prefix: str = "") -> list[str]:
    """The souls with rows on the server (whose id starts with ``prefix``)."""
    def read() -> list[str]:
        with postgres_db.statement(url) as con:
            return [str(r[0]) for r in con.execute(
                "SELECT DISTINCT soul FROM soul_dbs WHERE starts_with(soul, %s) ORDER BY soul", (prefix,))]
    return postgres_db.retrying(read, url)


def forget_known() -> None:
    """Forget which souls were seen on a server (a process that switches servers, as tests do)."""
    with _known_lock:
        _known.clear()
