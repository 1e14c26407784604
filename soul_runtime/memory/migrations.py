"""The one migrations runner of every database the project keeps: a soul's SQLite databases and the PostgreSQL
schema. A database records the names of the steps it has run in ``schema_migrations`` (``seq``, ``name``);
a step, once released, is never edited; a database that ran steps this code does not know (a newer version
wrote it) is refused."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from soul_runtime.errors import StorageError

Migration = tuple[str, str]  # (name, SQL script of statements separated by ';')
TABLE = "CREATE TABLE IF NOT EXISTS schema_migrations (seq INTEGER PRIMARY KEY, name TEXT UNIQUE)"


def check(done: Sequence[str], migrations: Sequence[Migration], where: object) -> None:
    known = [m[0] for m in migrations]
    if list(done) != known[: len(done)]:
        raise StorageError(f"{where}: schema {list(done)} does not match this version's migrations {known}")


def run(execute: Callable[..., Any], done: Sequence[str], migrations: Sequence[Migration], where: object,
        placeholder: str = "?") -> int:
    """Run the steps after ``done`` (inside the caller's transaction), each statement through ``execute``, and
    record each; returns how many ran."""
    check(done, migrations, where)
    for seq, (name, sql) in enumerate(migrations):
        if seq < len(done):
            continue
        for stmt in sql.split(";"):
            if stmt.strip():
                execute(stmt)
        execute(f"INSERT INTO schema_migrations (seq, name) VALUES ({placeholder}, {placeholder})", (seq, name))
    return max(0, len(migrations) - len(done))
