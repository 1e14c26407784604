"""What runs by itself: idle passivation in the soul hosts and retention sweeps in the store shards.

The decisions are pure functions of an explicit ``now`` (tested with a made-up
clock); :class:`Ticker` is only the thread that calls them every so often.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping


def to_passivate(last_used: Mapping[str, float], now: float, idle_s: float, capacity: int) -> list[str]:
    """Souls to passivate, oldest use first: those idle longer than ``idle_s``, then the least recently used
    until no more than ``capacity`` stay active. ``last_used`` is in LRU order (oldest first)."""
    idle = [sid for sid, t in last_used.items() if now - t > idle_s]
    stay = [sid for sid in last_used if sid not in idle]
    return idle + stay[: max(0, len(stay) - capacity)]


def sweep_due(last_swept: float | None, now: float, every_s: float) -> bool:
    """Is a soul's retention sweep due (never swept, or ``every_s`` seconds since the last one)?"""
    return every_s > 0 and (last_swept is None or now - last_swept >= every_s)


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
