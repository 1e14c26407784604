"""Souls taking idempotent turns in order, one thread each, until told to stop: what the fault tests (a node
killed, PostgreSQL restarted) run while they break things, and what they count afterwards."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class TurnStreams:
    """Each soul's turns in order, its text from ``say(soul, i)``, request id ``soul-i`` (a retry of a turn is the
    same turn); ``acked`` the sequence numbers acknowledged, ``answered_at`` when, ``errors`` what a caller saw."""

    def __init__(self, rt: Any, souls: list[str], say: Callable[[str, int], str]) -> None:
        self.rt, self.souls, self.say = rt, souls, say
        self.acked: dict[str, list[int]] = {s: [] for s in souls}
        self.answered_at: dict[str, list[float]] = {s: [] for s in souls}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._stream, args=(s,)) for s in souls]

    def _stream(self, s: str) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                r = self.rt.soul(s).turn(self.say(s, i), user="ops", request_id=f"{s}-{i}")
            except Exception as e:  # noqa: BLE001 - what a caller would see is the test's finding
                self.errors.append(f"{s}#{i}: {e!r}")
                return
            self.acked[s].append(r.seq)
            self.answered_at[s].append(time.time())
            i += 1

    def start(self) -> TurnStreams:
        for t in self.threads:
            t.start()
        return self

    def total(self) -> int:
        return sum(map(len, self.acked.values()))

    def first_answers_after(self, t0: float, souls: list[str]) -> dict[str, float | None]:
        return {s: min((a for a in self.answered_at[s] if a > t0), default=None) for s in souls}

    def finish(self, timeout_s: float = 300) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=timeout_s)
