"""The procedural store's schema: ``procedural.sqlite``'s migrations, in order (the convention of every database:
see :mod:`soul_runtime.memory.episodic_schema`)."""

from __future__ import annotations

from soul_runtime.memory import fence

MIGRATIONS = [
    ("0001_procedures", """
        CREATE TABLE procedures (
            task_class TEXT NOT NULL, version INTEGER NOT NULL, steps BLOB NOT NULL, status TEXT NOT NULL,
            sources BLOB NOT NULL, created_at REAL NOT NULL, clean_runs INTEGER NOT NULL, failures INTEGER NOT NULL,
            PRIMARY KEY (task_class, version));
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY, task_class TEXT NOT NULL, signature TEXT NOT NULL, steps BLOB NOT NULL,
            outcome TEXT NOT NULL, at REAL NOT NULL, sources BLOB NOT NULL, turn_key TEXT NOT NULL);
        CREATE INDEX runs_class ON runs(task_class);
        CREATE TABLE applied (turn_key TEXT PRIMARY KEY, writes BLOB NOT NULL)
    """),
    ("0002_fence", fence.MIGRATION[1]),
]
