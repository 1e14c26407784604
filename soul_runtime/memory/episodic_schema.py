"""The episodic store's schema: ``episodic.sqlite``'s migrations, in order.

Every database has one such module (``episodic_schema``, ``semantic_schema``, ``procedural_schema``,
:mod:`soul_runtime.loop.soul_state_schema`) holding ``MIGRATIONS``: numbered ``(name, SQL script)`` steps,
``NNNN_what``. :func:`soul_runtime.memory.sqlite_db.open_db` applies the ones a database has not seen, in order
and in one transaction, and records each name in the database's ``schema_migrations`` table; a step, once
released, is never edited: a change is a new step at the end.
"""

from __future__ import annotations

from soul_runtime.memory import fence

MIGRATIONS = [
    ("0001_episodes", """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE episodes (
            rowid INTEGER PRIMARY KEY, at REAL NOT NULL, actor TEXT NOT NULL, summary TEXT NOT NULL,
            sources BLOB NOT NULL, entities BLOB NOT NULL, tags BLOB NOT NULL, session TEXT NOT NULL,
            session_index INTEGER NOT NULL, promoted INTEGER NOT NULL DEFAULT 0, turn_key TEXT NOT NULL,
            vector BLOB NOT NULL);
        CREATE INDEX episodes_at ON episodes(at);
        CREATE INDEX episodes_session ON episodes(session_index);
        CREATE INDEX episodes_turn ON episodes(turn_key);
        CREATE VIRTUAL TABLE episodes_fts USING fts5(summary, tokenize='porter unicode61');
        CREATE TABLE sessions (name TEXT PRIMARY KEY, idx INTEGER NOT NULL UNIQUE, first_at REAL NOT NULL);
        CREATE TABLE index_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL, key INTEGER NOT NULL);
        CREATE TABLE applied (turn_key TEXT PRIMARY KEY, writes BLOB NOT NULL)
    """),
    ("0002_superseded", """
        ALTER TABLE episodes ADD COLUMN superseded INTEGER NOT NULL DEFAULT 0
    """),
    ("0003_key_text", """
        ALTER TABLE episodes ADD COLUMN key_text TEXT NOT NULL DEFAULT ''
    """),
    ("0004_session_index", """
        CREATE INDEX episodes_session_name ON episodes(session, rowid)
    """),
    ("0005_term_counts", """
        CREATE VIRTUAL TABLE episodes_vocab USING fts5vocab(episodes_fts, 'row')
    """),
    ("0006_fence", fence.MIGRATION[1]),
    ("0007_recall_cover", """
        CREATE INDEX episodes_recall ON episodes(rowid, at, promoted, superseded)
    """),
    ("0008_unit", """
        ALTER TABLE episodes ADD COLUMN unit INTEGER NOT NULL DEFAULT 0;
        UPDATE episodes SET unit = 1 WHERE instr(turn_key, '#u') > 0;
        DROP INDEX episodes_recall;
        CREATE INDEX episodes_recall ON episodes(rowid, at, promoted, superseded, unit)
    """),
    ("0009_digests", """
        CREATE TABLE digests (
            key TEXT PRIMARY KEY, kind TEXT NOT NULL, sessions BLOB NOT NULL, text TEXT NOT NULL,
            episodes BLOB NOT NULL, sources BLOB NOT NULL, first_at REAL NOT NULL, last_at REAL NOT NULL,
            fingerprint TEXT NOT NULL, written_at REAL NOT NULL)
    """),
]
"""0007: recall scores its candidates on date and flags read from this covering index. An episode's row holds
its vector and text, and its later columns sit on overflow pages; reading them per candidate dominated recall
in a large store. 0008: whether an episode is a unit of a long message (:mod:`soul_runtime.loop.units`), which
shares its message's vector: recall weighs its dense side by ``unit_dense_weight``. 0009: consolidated memory
(:mod:`soul_runtime.memory.episodic_digests`): a digest of each session and of each span of sessions, derived
from the episodes it names (rewritten when they change, deleted with them)."""

DERIVED = (
    "INSERT INTO episodes_fts (rowid, summary) SELECT rowid, CASE WHEN key_text <> '' THEN key_text ELSE summary END"
    " FROM episodes ORDER BY rowid",
)
"""The full-text index derived from the rows (what a write and an import put in it: the text an episode is
indexed under, its summary for rows written before it had one), for a cache rebuilt from a PostgreSQL storage."""
