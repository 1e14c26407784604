"""Erasure: a forgotten soul, layer or memory leaves no byte of its content on disk.

A whole layer (or soul) is erased by closing its store and unlinking its files —
the SQLite database with its ``-wal``/``-shm`` files, the vector index and its
sidecar — and starting again from empty files. Single memories are deleted
inside the files: ``secure_delete`` zeroes the freed cells and pages, the FTS5
segments are merged (a delete only adds a tombstone; the term stays in the old
segment until a merge), ``VACUUM`` rewrites the file without free space, and a
``TRUNCATE`` checkpoint empties the WAL, whose frames would still hold old pages.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from soul_runtime.errors import InvalidInput, StorageError

MIN_NEEDLE = 3  # shorter forgotten texts ("16", "ok") would match everything; their memories go by id


@dataclass(frozen=True)
class Erased:
    """What a targeted forget removed from one layer: ids, the texts they held, the messages they came from."""

    ids: tuple[str, ...] = ()
    texts: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    def __add__(self, other: Erased) -> Erased:
        return Erased(self.ids + other.ids, self.texts + other.texts,
                      tuple(dict.fromkeys(self.sources + other.sources)))


@dataclass(frozen=True)
class ForgetQuery:
    """Which memories a targeted forget removes: these ids, every memory whose text contains ``phrase``
    (case-insensitive) or one of ``texts`` (as whole words), and the episodes recorded from ``sources``."""

    ids: tuple[str, ...] = ()
    phrase: str = ""
    texts: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    @classmethod
    def make(cls, ids: Iterable[str] | None = None, phrase: str | None = None) -> ForgetQuery:
        if isinstance(ids, str):
            ids = [ids]
        got = tuple(ids or ())
        if not all(isinstance(i, str) and 0 < len(i) <= 500 for i in got):
            raise InvalidInput("forget_where ids must be memory ids (strings such as ep-3, tendril:database)")
        if phrase is not None and (not isinstance(phrase, str) or not phrase.strip() or len(phrase) > 1000):
            raise InvalidInput("forget_where query must be a non-empty phrase of at most 1000 characters")
        if not got and not phrase:
            raise InvalidInput("forget_where needs ids or a query")
        return cls(got, (phrase or "").strip())

    def follow_up(self, erased: Erased) -> ForgetQuery:
        """What else holds what was just forgotten: memories stating its words, episodes of its messages."""
        return ForgetQuery(texts=erased.texts, sources=erased.sources)

    def with_texts(self, texts: Iterable[str]) -> ForgetQuery:
        return ForgetQuery(self.ids, self.phrase, tuple(dict.fromkeys(self.texts + tuple(texts))), self.sources)

    def matches(self, *texts: Any) -> bool:
        """The phrase anywhere in ``texts``; a followed-up text only as whole words (a forgotten value "red"
        must not take "ordered" with it)."""
        return (bool(self.phrase) and mentions(list(texts), (self.phrase,))) or \
            mentions(list(texts), self.texts, whole_words=True)

    def from_sources(self, sources: Iterable[str]) -> bool:
        return bool(self.sources) and not set(self.sources).isdisjoint(sources)


def is_episode_id(memory_id: str) -> bool:
    return memory_id.startswith("ep-") and memory_id[3:].isdigit()


def mentions(value: Any, needles: Sequence[str], *, whole_words: bool = False) -> bool:
    """Does ``value`` (text, msgpack bytes, or nested lists/dicts of them) contain one of ``needles``
    (case-insensitive; needles shorter than ``MIN_NEEDLE`` are ignored)?"""
    wanted = [n.casefold() for n in needles if len(n.strip()) >= MIN_NEEDLE]
    if not wanted:
        return False
    hay = _text_of(value).casefold()
    if not whole_words:
        return any(n in hay for n in wanted)
    return any(re.search(r"(?<!\w)" + re.escape(n) + r"(?!\w)", hay) for n in wanted)


def _text_of(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        try:
            value = msgpack.unpackb(value, raw=False, strict_map_key=False)
        except Exception:
            return bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "\n".join(_text_of(k) + "\n" + _text_of(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "\n".join(_text_of(v) for v in value)
    return str(value)


def layer_files(directory: Path, prefix: str) -> list[Path]:
    """The files of one store: ``prefix.sqlite``, its -wal/-shm, ``prefix.usearch`` and sidecars, temp files."""
    return sorted(f for f in Path(directory).glob(f"{prefix}.*") if f.is_file())


def unlink_files(directory: Path, prefix: str) -> int:
    """Remove a closed store's files (durably: the directory entry removal is synced). Returns how many."""
    files = layer_files(directory, prefix)
    for f in files:
        f.unlink(missing_ok=True)
    if files:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return len(files)


def compact(db: sqlite3.Connection, fts_tables: Sequence[str] = ()) -> None:
    """After deletes: merge FTS5 segments, rewrite the file without free pages, and empty the WAL."""
    try:
        for t in fts_tables:
            db.execute(f"INSERT INTO {t}({t}) VALUES('optimize')")
        db.execute("VACUUM")
        busy = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.DatabaseError as e:
        raise StorageError(f"compacting after a forget failed: {e}") from e
    if busy and busy[0]:
        raise StorageError("another connection holds the database: the WAL could not be emptied after a forget")
