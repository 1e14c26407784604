"""Where a soul's files are, and whether the soul exists at all: reads of a soul nobody has written (a turn, an
observe, an import) answer :class:`~soul_runtime.errors.NotFound` and create nothing — no directory, no store, no
entry in the runtime's list of souls (which is the list of these directories)."""

from __future__ import annotations

from pathlib import Path

from soul_runtime.errors import NotFound
from soul_runtime.text import check_id


def soul_dir(data_dir: str, soul_id: str) -> Path:
    return Path(data_dir) / "souls" / check_id(soul_id, what="soul id")


def known(data_dir: str, soul_id: str) -> bool:
    """The soul has files: something wrote it, and it was not erased since."""
    return soul_dir(data_dir, soul_id).is_dir()


def require_known(data_dir: str, soul_id: str) -> None:
    """NotFound for a soul that does not exist (a read must not create it)."""
    if not known(data_dir, soul_id):
        raise NotFound(f"no soul '{soul_id}'")
