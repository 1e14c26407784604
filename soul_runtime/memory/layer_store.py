"""What every per-soul layer store is: one SQLite file in the soul's directory, with its lifecycle.

A layer store opens ``DIR/<layer>.sqlite`` with its migrations, and knows how to close, erase (unlink and reopen
empty under the same fencing epoch), fence, tell whether it is empty, export and import its tables, and count
its bytes. The semantic and procedural stores are this and their policies; the episodic store adds its vector
index (:mod:`soul_runtime.memory.episodic`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from soul_runtime.config import MemoryConfig
from soul_runtime.memory import fence
from soul_runtime.memory.layer_db import dump_tables, file_bytes, is_empty, load_tables
from soul_runtime.memory.soul_records import forget_db
from soul_runtime.memory.sqlite_db import memory_bytes, open_db, transaction
from soul_runtime.records import Store


class LayerStore:
    """One soul's store of one layer. Not thread-safe: its owner serialises calls.

    A subclass sets ``store`` (its layer), ``MIGRATIONS``, ``TABLES`` (what export carries, in order) and
    ``COUNTED`` (the table whose rows :meth:`erase` reports)."""

    store: ClassVar[Store]
    MIGRATIONS: ClassVar[Sequence[tuple[str, str]]]
    TABLES: ClassVar[tuple[str, ...]]
    COUNTED: ClassVar[str]
    DERIVED: ClassVar[Sequence[str]] = ()
    """Statements that fill the database's derived (virtual) tables from its rows, after a cache is rebuilt."""

    def __init__(self, directory: Path, cfg: MemoryConfig) -> None:
        self.dir = Path(directory)
        self.cfg = cfg
        self._open()

    def _open(self) -> None:
        """Open the layer's database (a subclass opens what it keeps beside it too)."""
        self.db = open_db(self.path, self.MIGRATIONS, derived=self.DERIVED)

    @property
    def path(self) -> Path:
        return self.dir / f"{self.store.value}.sqlite"

    def close(self) -> None:
        self.db.close()

    def memory_bytes(self) -> int:
        """What this open store holds in memory: its SQLite page cache."""
        return memory_bytes(self.db)

    def file_bytes(self) -> int:
        """The layer's files on disk (database, WAL, sidecars)."""
        return file_bytes(self.dir, self.store.value)

    def _count(self) -> int:
        return int(self.db.execute(f"SELECT COUNT(*) FROM {self.COUNTED}").fetchone()[0])

    def erase(self) -> int:
        """Forget everything of this layer for good: unlink its files and reopen it empty. Returns how many
        rows of ``COUNTED`` there were."""
        n = self._count()
        epoch = fence.current(self.db)
        self.db.close()  # nothing is saved first: it all goes
        forget_db(self.path)
        self._open()
        fence.restore(self.db, epoch)  # an older owner stays refused
        return n

    def fence(self, epoch: int) -> None:
        """A newer activation took the soul over with ``epoch``: older writers are refused from now on."""
        fence.fence(self.db, epoch, f"soul {self.dir.name} {self.store.value}")

    def is_empty(self) -> bool:
        return is_empty(self.db, self.TABLES)

    def export(self) -> dict[str, Any]:
        return dump_tables(self.db, self.TABLES)

    def import_(self, data: dict[str, Any]) -> None:
        """Load an export's section of this layer (checked by ``unpack_export``) into this empty store."""
        with transaction(self.db):
            load_tables(self.db, data, self.TABLES)
