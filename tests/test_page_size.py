"""Databases start with SQLite's smallest page (a near-empty soul stays small on disk) and are rewritten with
larger pages once they have grown, on their next opening."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from soul_runtime.memory import sqlite_db
from soul_runtime.memory.sqlite_db import open_db, transaction

MIGRATIONS = [("0001_rows", "CREATE TABLE t (x TEXT)")]


def _page(con: sqlite3.Connection) -> int:
    return int(con.execute("PRAGMA page_size").fetchone()[0])


def test_small_pages_first_larger_once_grown(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    con = open_db(path, MIGRATIONS)
    assert _page(con) == sqlite_db.PAGE_SIZE == 512
    assert path.stat().st_size <= 3 * 512  # page 1, the migrations table and its index... a few pages
    with transaction(con):
        con.executemany("INSERT INTO t VALUES (?)", [(f"row {i} " + "y" * 300,) for i in range(1200)])
    con.close()
    small = tmp_path / "b.sqlite"
    open_db(small, MIGRATIONS).close()
    con = open_db(path, MIGRATIONS)  # grown past GROW_AT: rewritten with 4 KiB pages, nothing lost
    assert _page(con) == sqlite_db.GROWN_PAGE_SIZE
    assert str(con.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"
    assert con.execute("SELECT COUNT(*), MIN(x), MAX(x) FROM t").fetchone()[0] == 1200
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert _page(open_db(small, MIGRATIONS)) == 512  # a small one keeps its small pages


def test_a_database_another_connection_holds_is_not_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    con = open_db(path, MIGRATIONS)
    with transaction(con):
        con.executemany("INSERT INTO t VALUES (?)", [("y" * 300,)] * 1200)
    other = open_db(path, MIGRATIONS)  # con still open: the journal mode cannot change, so no rewrite
    assert _page(other) == 512 and other.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1200
    assert str(other.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"
    with transaction(con):  # both still work
        con.execute("INSERT INTO t VALUES ('one more')")
    assert other.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1201
    con.close()
    other.close()
    assert _page(open_db(path, MIGRATIONS)) == sqlite_db.GROWN_PAGE_SIZE  # alone now: rewritten
