"""Fencing: exactly one writer per soul, even when an old owner is still alive.

Every activation of a soul takes a new epoch (a fencing token, :func:`claim`)
from the soul's own database and fences the layer databases with it
(:func:`check`): each database remembers the highest epoch it has seen and,
inside the writing transaction, refuses a writer whose epoch is lower. A zombie
owner (paused, partitioned, or an actor incarnation Ray already replaced) thus
fails with :class:`StaleOwner` instead of writing.
"""

from __future__ import annotations

import sqlite3

from soul_runtime.errors import StaleOwner
from soul_runtime.memory.sqlite_db import transaction

MIGRATION = ("fence", "CREATE TABLE fence (id INTEGER PRIMARY KEY CHECK (id = 0), epoch INTEGER NOT NULL)")


def current(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT epoch FROM fence WHERE id = 0").fetchone()
    return int(row[0]) if row else 0


def check(db: sqlite3.Connection, epoch: int, what: str) -> None:
    """Inside the caller's write transaction: refuse ``epoch`` if a newer owner has written, else record it."""
    seen = current(db)
    if epoch < seen:
        raise StaleOwner(f"{what}: a newer owner (epoch {seen}) took over from this one (epoch {epoch}); "
                         "nothing was written")
    if epoch > seen:
        db.execute("INSERT OR REPLACE INTO fence VALUES (0, ?)", (epoch,))


def fence(db: sqlite3.Connection, epoch: int, what: str) -> None:
    """Raise the fence to ``epoch`` now (a new owner does this on activation, before anything else)."""
    with transaction(db):
        check(db, epoch, what)


def restore(db: sqlite3.Connection, epoch: int) -> None:
    """After a forget recreated the file: keep the fence where it was, so a stale owner stays out."""
    if epoch:
        with transaction(db):
            db.execute("INSERT OR REPLACE INTO fence VALUES (0, ?)", (epoch,))
