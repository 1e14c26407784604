"""A soul's own state's schema: ``soul.sqlite``'s migrations, in order (the convention of every database:
see :mod:`soul_runtime.memory.episodic_schema`)."""

from __future__ import annotations

MIGRATIONS = [
    ("0001_state", """
        CREATE TABLE state (key TEXT PRIMARY KEY, value BLOB NOT NULL);
        CREATE TABLE traces (seq INTEGER PRIMARY KEY, turn_id TEXT UNIQUE NOT NULL, request_id TEXT NOT NULL,
                             at REAL NOT NULL, trace BLOB NOT NULL);
        CREATE INDEX traces_request ON traces(request_id)
    """),
]
