"""Moving a data dir's SQLite records into PostgreSQL (``soul storage migrate``): each soul database's rows go to
the server in one transaction, and its file stays where it was as that node's cache of them (marked with the
version the server now holds), so the souls open without a rebuild. The data dir's recorded storage becomes the
server's URL (without its password)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgpack

from soul_runtime.errors import InvalidInput, StorageError
from soul_runtime.memory import postgres_db
from soul_runtime.memory.pg_cache import Mirror, mirrored_tables
from soul_runtime.storage_modes import LAYOUT_FILE

DATABASES = ("soul", "episodic", "semantic", "procedural")


@dataclass
class Moved:
    souls: int = 0
    databases: int = 0
    rows: int = 0
    skipped: int = 0  # soul databases the server already had (moved before)


def move(data_dir: str | Path, url: str, *, progress: Callable[[str], None] = lambda line: None,
         every_s: float = 5.0) -> Moved:
    """Move every soul database of ``data_dir`` into the server at ``url``. A soul database the server already
    holds is left as it is there (a move interrupted and run again goes on where it stopped). ``progress`` is
    told a line at the start, at most every ``every_s`` seconds, and at the end."""
    root = Path(data_dir) / "souls"
    if not root.is_dir():
        raise InvalidInput(f"{data_dir} holds no souls (no {root})")
    souls = sorted(p for p in root.iterdir() if p.is_dir())
    out = Moved()
    start = last = time.monotonic()
    progress(f"moving {len(souls)} souls from {data_dir} to {postgres_db.redacted(url)}")
    postgres_db.pool(url)  # the server's schema first
    for i, d in enumerate(souls):
        for db in DATABASES:
            path = d / f"{db}.sqlite"
            if path.exists():
                n = _move_db(path, url)
                if n is None:
                    out.skipped += 1
                else:
                    out.databases += 1
                    out.rows += n
        out.souls += 1
        now = time.monotonic()
        if now - last >= every_s:
            last = now
            progress(f"{i + 1}/{len(souls)} souls, {out.rows} rows ({now - start:.0f} s)")
    _record_storage(Path(data_dir), url)
    progress(f"moved {out.souls} souls: {out.databases} databases, {out.rows} rows, {out.skipped} already there "
             f"({time.monotonic() - start:.0f} s)")
    return out


def _move_db(path: Path, url: str) -> int | None:
    con = sqlite3.connect(str(path), isolation_level=None, timeout=30.0)
    try:
        con.execute("BEGIN IMMEDIATE")  # nobody writes the file while it moves
        try:
            mirror = Mirror(url, path)
            if mirror.state() is not None:
                con.execute("ROLLBACK")
                return None
            schema = int(con.execute("SELECT COUNT(*) FROM schema_migrations").fetchone()[0])
            rows = []
            for tbl in mirrored_tables(con):
                cols = [str(r[1]) for r in con.execute(f"PRAGMA main.table_info({tbl})")]
                for r in con.execute(f"SELECT rowid, {','.join(cols)} FROM main.{tbl}"):
                    rows.append((tbl, int(r[0]), msgpack.packb(dict(zip(cols, r[1:], strict=True)),
                                                                use_bin_type=True)))

            def send() -> None:
                with postgres_db.connection(url) as pg:
                    pg.execute("INSERT INTO soul_dbs (soul, db, version, schema, txn) VALUES (%s, %s, 1, %s, 'move')",
                               (mirror.soul, mirror.db, schema))
                    with pg.cursor() as cur:
                        cur.executemany("INSERT INTO soul_rows (soul, db, tbl, rid, cells) VALUES (%s, %s, %s, %s, %s)",
                                        [(mirror.soul, mirror.db, t, r, c) for t, r, c in rows])
            postgres_db.retrying(send, url)
            mirror.attach_mark(con)
            con.execute("INSERT OR REPLACE INTO pg_mark VALUES (0, 1, ?)", (schema,))
            con.execute("COMMIT")
            return len(rows)
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
    except sqlite3.DatabaseError as e:
        raise StorageError(f"{path}: {e}") from e
    finally:
        con.close()


def _record_storage(data_dir: Path, url: str) -> None:
    path = data_dir / LAYOUT_FILE
    if not path.exists():
        return
    layout = json.loads(path.read_text())
    layout["storage"] = postgres_db.redacted(url)
    from soul_runtime.owner_only import write_file
    write_file(path, json.dumps(layout, indent=1) + "\n", replace=True)
