"""Which souls have records, and removing them: the data dir's files, or with a PostgreSQL storage the rows on
the server that the node's files are caches of (:mod:`soul_runtime.memory.pg_cache`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from soul_runtime.memory import pg_cache
from soul_runtime.memory.erasure import unlink_files
from soul_runtime.memory.sqlite_db import postgres_url
from soul_runtime.text import check_id

CACHE_DIR = "SOUL_CACHE_DIR"
"""With a PostgreSQL storage, the environment variable naming this node's directory for the souls' caches (the
data dir when unset): node-local disk, any node's cache rebuilt from the server's rows when missing."""


def soul_dir(data_dir: str | Path, soul_id: str) -> Path:
    """Where a soul's databases (or, with a PostgreSQL storage, their caches on this node) are."""
    root = os.environ.get(CACHE_DIR) if postgres_url() is not None else None
    return Path(root or data_dir) / "souls" / check_id(soul_id, what="soul id")


def soul_ids(data_dir: str | Path, prefix: str = "") -> list[str]:
    """The souls with records (whose id starts with ``prefix``), sorted."""
    url = postgres_url()
    if url is not None:
        return pg_cache.soul_ids(url, prefix)
    root = soul_dir(data_dir, "x").parent
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith(prefix)) if root.is_dir() else []


def known(data_dir: str | Path, soul_id: str) -> bool:
    """Has the soul any record (something wrote it, and it was not erased since)?"""
    url = postgres_url()
    if url is None:
        return soul_dir(data_dir, soul_id).is_dir()
    return any(pg_cache.stored(url, soul_dir(data_dir, soul_id) / f"{db}.sqlite", keep_absent=False)
               for db in ("soul", "episodic", "semantic", "procedural"))


def stored(path: Path) -> bool:
    """Has the soul database whose (cache) file is ``path`` any record?"""
    url = postgres_url()
    return path.exists() if url is None else pg_cache.stored(url, path)


def forget_db(path: Path) -> int:
    """Remove one closed soul database for good: its rows on the server (first), then its files. Returns how
    many files were unlinked."""
    url = postgres_url()
    if url is not None:
        pg_cache.drop(url, *pg_cache.key_of(path))
    return unlink_files(path.parent, path.stem)


def remove_soul(data_dir: str | Path, soul_id: str) -> None:
    """Remove every record of a soul whose stores are closed: its rows on the server, then its directory."""
    url = postgres_url()
    if url is not None:
        pg_cache.drop(url, soul_id)
    shutil.rmtree(soul_dir(data_dir, soul_id), ignore_errors=True)
