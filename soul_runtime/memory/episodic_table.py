"""The episodic store's table: its state, rows, sessions and index change log (shared by its writes,
erasure and search)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from soul_runtime.config import MemoryConfig
from soul_runtime.embedding.ahead import EmbeddingAhead
from soul_runtime.embedding.base import Embedder
from soul_runtime.errors import NotFound
from soul_runtime.memory import fence
from soul_runtime.memory.layer_db import unpack
from soul_runtime.memory.policy_episodic import LexicalLimits
from soul_runtime.memory.sqlite_db import transaction
from soul_runtime.memory.vector_index import IndexParams, VectorIndex
from soul_runtime.records import Episode

INDEXED = "unit = 0"
"""The episodes the vector index holds: a unit that shares its message's vector is found on the dense side
through its message (the same vector, held once), so one long message cannot fill the dense candidates with
copies of one vector; its own similarity is read from its stored vector when its words make it a candidate."""


class EpisodeTable:
    """The state an open episodic store holds, and the row reads and bookkeeping its parts share."""

    dir: Path
    embedder: Embedder
    ahead: EmbeddingAhead
    cfg: MemoryConfig
    index_params: IndexParams | None
    lexical: LexicalLimits
    db: sqlite3.Connection
    epoch: int
    index: VectorIndex
    _unsaved: int
    _doc_freq: dict[str, tuple[int, int]]
    _max_key: int | None

    def _last_seq(self) -> int:
        """The last change-log number ever given out. AUTOINCREMENT keeps it in ``sqlite_sequence`` after a
        flush emptied the log (``MAX(seq)`` would then be 0, and every saved index look newer than the record:
        each opening rebuilt and rewrote it)."""
        r = self.db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'index_log'").fetchone()
        return int(r[0]) if r else 0

    def flush(self) -> None:
        """Save the index and drop the change log it now holds (not when a newer owner took the soul over:
        the index file is then theirs)."""
        if fence.current(self.db) > self.epoch:
            return
        self.index.save()
        with transaction(self.db):
            self.db.execute("DELETE FROM index_log WHERE seq <= ?", (self.index.applied_seq,))
        self._unsaved = 0

    # ---- rows ------------------------------------------------------------------------
    @staticmethod
    def _episode(r: sqlite3.Row | tuple[Any, ...]) -> Episode:
        return Episode(id=f"ep-{r[0]}", at=r[1], actor=r[2], summary=r[3], sources=tuple(unpack(r[4])),
                       entities=tuple(unpack(r[5])), tags=tuple(unpack(r[6])), session=r[7],
                       session_index=r[8], promoted=bool(r[9]))

    _COLS = "rowid, at, actor, summary, sources, entities, tags, session, session_index, promoted"

    def _rows(self, where: str = "1", params: tuple[Any, ...] = ()) -> list[Episode]:
        sql = f"SELECT {self._COLS} FROM episodes WHERE {where} ORDER BY at, rowid"
        return [self._episode(r) for r in self.db.execute(sql, params)]

    def get(self, episode_id: str) -> Episode:
        key = _key(episode_id)
        rows = self._rows("rowid = ?", (key,))
        if not rows:
            raise NotFound(f"no episode {episode_id}")
        return rows[0]

    def _session_index(self, name: str, at: float) -> int:
        r = self.db.execute("SELECT idx FROM sessions WHERE name = ?", (name,)).fetchone()
        if r:
            return int(r[0])
        idx = int(self.db.execute("SELECT COALESCE(MAX(idx), 0) + 1 FROM sessions").fetchone()[0])
        self.db.execute("INSERT INTO sessions VALUES (?, ?, ?)", (name, idx, at))
        return idx

    def _log(self, op: str, key: int) -> int:
        cur = self.db.execute("INSERT INTO index_log (op, key) VALUES (?, ?)", (op, key))
        return int(cur.lastrowid or 0)


def _key(episode_id: str) -> int:
    if not isinstance(episode_id, str) or not episode_id.startswith("ep-") or not episode_id[3:].isdigit():
        raise NotFound(f"no episode {episode_id!r}")
    return int(episode_id[3:])
