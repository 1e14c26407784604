"""Databases start with SQLite's smallest page (a near-empty soul stays small on disk) and are rewritten with
larger pages once they have grown, on their next opening; a new one is a copy of a template migrated once."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from soul_runtime.memory import episodic, sqlite_db
from soul_runtime.memory.sqlite_db import open_db, transaction

MIGRATIONS = [("0001_rows", "CREATE TABLE t (x TEXT)")]


def _page(con: sqlite3.Connection) -> int:
    return int(con.execute("PRAGMA page_size").fetchone()[0])


def test_small_pages_first_larger_once_grown(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    con = open_db(path, MIGRATIONS)
    assert _page(con) == sqlite_db.PAGE_SIZE == 512
    assert path.stat().st_size <= 4 * 512  # page 1, the migrations table and its index, the table: a page each
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


def _schema(con: sqlite3.Connection) -> list[tuple[str, str, str]]:
    return sorted(con.execute("SELECT type, name, COALESCE(sql, '') FROM sqlite_master").fetchall())


def test_a_new_database_from_the_template_is_the_migrated_schema(tmp_path: Path) -> None:
    stepwise = sqlite3.connect(tmp_path / "stepwise.sqlite")  # the migrations run one by one, by hand
    stepwise.execute("CREATE TABLE schema_migrations (seq INTEGER PRIMARY KEY, name TEXT UNIQUE)")
    for seq, (name, sql) in enumerate(episodic.MIGRATIONS):
        for stmt in sql.split(";"):
            if stmt.strip():
                stepwise.execute(stmt)
        stepwise.execute("INSERT INTO schema_migrations VALUES (?, ?)", (seq, name))
    stepwise.commit()
    made = open_db(tmp_path / "souls" / "x" / "episodic.sqlite", episodic.MIGRATIONS)
    assert _schema(made) == _schema(stepwise)
    assert [r[0] for r in made.execute("SELECT name FROM schema_migrations ORDER BY seq")] == \
        [m[0] for m in episodic.MIGRATIONS]
    assert made.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert str(made.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"
    assert (tmp_path / "souls" / "x" / "episodic.sqlite").stat().st_mode & 0o777 == 0o600
    assert not [p for p in (tmp_path / "souls" / "x").iterdir() if p.name.endswith(".new")]
    with transaction(made):
        made.execute("INSERT INTO meta VALUES ('k', 'v')")
    made.close()
    assert open_db(tmp_path / "souls" / "x" / "episodic.sqlite", episodic.MIGRATIONS).execute(
        "SELECT value FROM meta WHERE key = 'k'").fetchone()[0] == "v"


def test_two_creators_of_one_database_share_one_file(tmp_path: Path) -> None:
    path = tmp_path / "s" / "a.sqlite"
    cons: list[sqlite3.Connection] = []
    start = threading.Barrier(4)

    def create() -> None:
        start.wait()
        cons.append(open_db(path, MIGRATIONS))
    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cons) == 4
    for i, con in enumerate(cons):
        with transaction(con):
            con.execute("INSERT INTO t VALUES (?)", (f"from {i}",))
    assert cons[0].execute("SELECT COUNT(*) FROM t").fetchone()[0] == 4
