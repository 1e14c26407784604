"""What runs by itself: idle passivation in the soul hosts, retention sweeps in the store shards, and the closing
of what an eviction set aside.

The decisions are pure functions of an explicit ``now`` (tested with a made-up
clock); :class:`Ticker` is only the thread that calls them every so often.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class SizeTable(dict[str, int]):
    """Bytes per entry with their sum kept as entries are set and dropped, so "is anything beyond capacity?" is
    answered without a pass over every open entry (:func:`within_capacity`)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __setitem__(self, key: str, value: int) -> None:
        self.total += int(value) - self.get(key, 0)
        super().__setitem__(key, int(value))

    def __delitem__(self, key: str) -> None:
        self.total -= self.get(key, 0)
        super().__delitem__(key)

    def pop(self, key: str, default: Any = None) -> Any:
        if key in self:
            self.total -= self[key]
        return super().pop(key, default)


def within_capacity(count: int, total_bytes: int, capacity: int, max_bytes: int) -> bool:
    """Nothing to evict: at most ``capacity`` entries and (``max_bytes`` > 0) at most ``max_bytes`` in all."""
    return count <= capacity and (max_bytes <= 0 or total_bytes <= max_bytes)


def over_capacity(lru: Mapping[str, Any], sizes: SizeTable, capacity: int, max_bytes: int) -> list[str]:
    """:func:`beyond_capacity` of the keys of ``lru`` (oldest first), answered without a pass over them when
    the count and the running byte total are within bounds (the common case, on every call)."""
    if within_capacity(len(lru), sizes.total, capacity, max_bytes):
        return []
    return beyond_capacity(list(lru), sizes, capacity, max_bytes)


def beyond_capacity(lru: Sequence[str], sizes: Mapping[str, int], capacity: int, max_bytes: int) -> list[str]:
    """The least recently used entries of ``lru`` (oldest first) to drop so that at most ``capacity`` stay and,
    when ``max_bytes`` > 0, their ``sizes`` add up to at most ``max_bytes``. The most recent entry always
    stays (one entry larger than the budget is not evicted from under its user)."""
    drop = max(0, len(lru) - capacity)
    if max_bytes > 0:
        used = sum(sizes.get(k, 0) for k in lru[drop:])
        while used > max_bytes and drop < len(lru) - 1:
            used -= sizes.get(lru[drop], 0)
            drop += 1
    return list(lru[:drop])


def to_passivate(last_used: Mapping[str, float], now: float, idle_s: float, capacity: int,
                 sizes: Mapping[str, int] | None = None, max_bytes: int = 0) -> list[str]:
    """Souls to passivate, oldest use first: those idle longer than ``idle_s``, then the least recently used
    until no more than ``capacity`` stay active and (``max_bytes`` > 0) their ``sizes`` fit in ``max_bytes``.
    ``last_used`` is in LRU order (oldest first)."""
    idle = [sid for sid, t in last_used.items() if now - t > idle_s]
    stay = [sid for sid in last_used if sid not in idle]
    return idle + beyond_capacity(stay, sizes or {}, capacity, max_bytes)


def batch_answer_at(half_done_s: float, *, slack_s: float = 0.05) -> float:
    """When a host answers a batch of turns, in seconds after it started: half its turns took ``half_done_s``;
    a turn still running at twice that (plus ``slack_s``) is a straggler — a cold soul, a slow model call — and
    is answered on its own later instead of holding up the others."""
    return 2 * max(0.0, half_done_s) + slack_s


PART_HOLD_MAX_S = 0.005
PART_HOLD_SHARE = 0.05


def part_hold(running_s: float, *, most_s: float = PART_HOLD_MAX_S, share: float = PART_HOLD_SHARE) -> float:
    """How long a host holds a finished turn's answer for the others of its batch that may finish with it, so
    they travel in one part (one write, one wake-up of the caller): ``share`` of the time the batch has run, at
    most ``most_s`` — a few milliseconds on turns of a tenth of a second and more, nothing on instant ones."""
    return min(most_s, share * max(0.0, running_s))


def sweep_due(last_swept: float | None, now: float, every_s: float) -> bool:
    """Is a soul's retention sweep due (never swept, or ``every_s`` seconds since the last one)?"""
    return every_s > 0 and (last_swept is None or now - last_swept >= every_s)


MAX_CLOSING = 64
"""Closings at most waiting for an actor's closing thread; beyond, the evicting caller closes itself."""


class Closer:
    """Closes what an eviction took out (a soul, a store) on a thread of its own, off the path of the call that
    made room (closing saves an index and checkpoints a WAL: fsyncs). Beyond ``max_waiting`` closings waiting,
    the caller closes itself, so open files stay bounded."""

    def __init__(self, name: str, max_waiting: int = MAX_CLOSING) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.max_waiting = max_waiting
        self._waiting = 0
        self._lock = threading.Lock()

    def run(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            inline = self._waiting >= self.max_waiting
            self._waiting += 0 if inline else 1
        if inline:
            fn(*args)
        else:
            self._pool.submit(self._queued, fn, args)

    def _queued(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        finally:
            with self._lock:
                self._waiting -= 1

    def wait_closed(self) -> None:
        """Wait until everything handed over so far is closed."""
        self._pool.submit(lambda: None).result()

    def stop(self) -> None:
        """Close what was handed over, then end the closing thread."""
        self._pool.shutdown(wait=True)


class Ticker:
    """A daemon thread calling ``fn`` every ``every_s`` seconds until :meth:`stop`; an error in ``fn`` is
    reported to ``on_error`` and does not stop the ticks."""

    def __init__(self, every_s: float, fn: Callable[[], object], *, name: str,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self.every_s = every_s
        self.fn = fn
        self.on_error = on_error
        self.ticks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.fn()
            except BaseException as e:  # a failed tick must not end the schedule
                if self.on_error is not None:
                    self.on_error(e)
            self.ticks += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
