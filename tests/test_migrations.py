"""One migrations module per database, in one convention: numbered (name, SQL) steps applied in order and
recorded in the database's ``schema_migrations`` table."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from types import ModuleType

import pytest

from soul_runtime.loop import soul_state, soul_state_schema
from soul_runtime.memory import (
    episodic,
    episodic_schema,
    procedural,
    procedural_schema,
    semantic,
    semantic_schema,
)
from soul_runtime.memory.sqlite_db import open_db

SCHEMAS = {"episodic.sqlite": episodic_schema, "semantic.sqlite": semantic_schema,
           "procedural.sqlite": procedural_schema, "soul.sqlite": soul_state_schema}


@pytest.mark.parametrize("db", sorted(SCHEMAS))
def test_each_database_has_numbered_migrations_in_order(db: str) -> None:
    names = [name for name, _ in SCHEMAS[db].MIGRATIONS]
    assert all(re.fullmatch(r"\d{4}_[a-z_]+", n) for n in names), names
    assert [int(n[:4]) for n in names] == list(range(1, len(names) + 1))
    assert all(isinstance(sql, str) and sql.strip() for _, sql in SCHEMAS[db].MIGRATIONS)


def test_the_stores_open_their_database_with_its_module() -> None:
    uses: dict[ModuleType, object] = {episodic_schema: episodic.EpisodicStore.MIGRATIONS,
                                      semantic_schema: semantic.SemanticStore.MIGRATIONS,
                                      procedural_schema: procedural.ProceduralStore.MIGRATIONS,
                                      soul_state_schema: soul_state.MIGRATIONS}
    for module, used in uses.items():
        assert used is module.MIGRATIONS, module.__name__


@pytest.mark.parametrize("db", sorted(SCHEMAS))
def test_a_new_database_records_every_migration_in_order(tmp_path: Path, db: str) -> None:
    open_db(tmp_path / db, SCHEMAS[db].MIGRATIONS).close()
    con = sqlite3.connect(tmp_path / db)
    try:
        recorded = [r[0] for r in con.execute("SELECT name FROM schema_migrations ORDER BY seq")]
    finally:
        con.close()
    assert recorded == [name for name, _ in SCHEMAS[db].MIGRATIONS]
