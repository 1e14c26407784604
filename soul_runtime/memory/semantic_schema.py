"""The semantic store's schema: ``semantic.sqlite``'s migrations, in order (the convention of every database:
see :mod:`soul_runtime.memory.episodic_schema`)."""

from __future__ import annotations

from soul_runtime.memory import fence

MIGRATIONS = [
    ("0001_facts", """
        CREATE TABLE facts (
            entity TEXT NOT NULL, attribute TEXT NOT NULL, value TEXT NOT NULL, display_entity TEXT NOT NULL,
            display_attribute TEXT NOT NULL, confidence REAL NOT NULL, sources BLOB NOT NULL,
            valid_from REAL NOT NULL, status TEXT NOT NULL, history BLOB NOT NULL,
            PRIMARY KEY (entity, attribute));
        CREATE TABLE observations (
            entity TEXT NOT NULL, attribute TEXT NOT NULL, value_norm TEXT NOT NULL, value TEXT NOT NULL,
            turn_key TEXT NOT NULL, sources BLOB NOT NULL, at REAL NOT NULL,
            PRIMARY KEY (entity, attribute, value_norm, turn_key));
        CREATE TABLE applied (turn_key TEXT PRIMARY KEY, writes BLOB NOT NULL)
    """),
    ("0002_fence", fence.MIGRATION[1]),
]
