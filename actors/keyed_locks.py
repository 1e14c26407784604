"""One lock per key (a soul id), made on first use and dropped when nobody holds or waits for it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

L = TypeVar("L")


class Entry(Generic[L]):
    __slots__ = ("lock", "users")

    def __init__(self, lock: L) -> None:
        self.lock = lock
        self.users = 0  # holders and waiters


class KeyedLocks(Generic[L]):
    """Locks made by ``make`` (``threading.Lock`` for threads, ``asyncio.Lock`` for the coroutines of one event
    loop), one per key. An entry lives while someone holds or waits for it, or while ``keep(key)`` is true
    (a store shard keeps the entries of its open stores). ``guard`` protects the table; a caller that shares it
    (to read the table beside its own state) uses :meth:`users` and :meth:`take` with it held."""

    def __init__(self, make: Callable[[], L], *, guard: Any = None, keep: Callable[[str], bool] | None = None) -> None:
        self.make = make
        self.guard = guard if guard is not None else threading.Lock()
        self.keep = keep
        self.table: dict[str, Entry[L]] = {}

    def __len__(self) -> int:
        return len(self.table)

    def __contains__(self, key: str) -> bool:
        return key in self.table

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.table))

    @contextmanager
    def entry(self, key: str) -> Iterator[L]:
        """The key's lock, counted as used (held or waited for) until the block ends; the caller takes it."""
        with self.guard:
            e = self.table.get(key)
            if e is None:
                e = self.table[key] = Entry(self.make())
            e.users += 1
        try:
            yield e.lock
        finally:
            self.release(key, e)

    @contextmanager
    def held(self, key: str) -> Iterator[None]:
        """The key's (threading) lock held until the block ends."""
        with self.entry(key) as lock, lock:  # type: ignore[attr-defined]
            yield

    def users(self, key: str) -> int:
        """Holders and waiters of ``key`` (call with the guard held)."""
        e = self.table.get(key)
        return 0 if e is None else e.users

    def take(self, key: str) -> Entry[L]:
        """Take the lock of a key nobody holds or waits for, without waiting (call with the guard held); give it
        back with ``entry.lock.release()`` and then :meth:`release`."""
        e = self.table.get(key)
        if e is None:
            e = self.table[key] = Entry(self.make())
        e.users += 1
        taken = e.lock.acquire(blocking=False)  # type: ignore[attr-defined]
        assert taken, f"{key} was taken while in use"
        return e

    def release(self, key: str, e: Entry[L]) -> None:
        """One user fewer; the entry goes when it has none (unless ``keep(key)``)."""
        with self.guard:
            e.users -= 1
            if e.users == 0 and self.table.get(key) is e and not (self.keep is not None and self.keep(key)):
                del self.table[key]
