"""Whether a soul exists at all: reads of a soul nobody has written (a turn, an observe, an import) answer
:class:`~soul_runtime.errors.NotFound` and create nothing — no directory, no store, no row, no entry in the
runtime's list of souls. What a soul's records are (its files, or its rows in a PostgreSQL storage) is
:mod:`soul_runtime.memory.soul_records`'."""

from __future__ import annotations

from soul_runtime.errors import NotFound
from soul_runtime.memory.soul_records import known, soul_dir

__all__ = ["known", "require_known", "soul_dir"]


def require_known(data_dir: str, soul_id: str) -> None:
    """NotFound for a soul that does not exist (a read must not create it)."""
    if not known(data_dir, soul_id):
        raise NotFound(f"no soul '{soul_id}'")
