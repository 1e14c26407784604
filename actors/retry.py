"""How long the turn path keeps trying an actor that is dead or restarting, or a soul whose database another
process still has locked: one policy for every caller."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from soul_runtime.errors import StorageError

log = logging.getLogger("soul_runtime.routing")

LOCK_HELD = ("database is locked",)
"""SQLite's words (SQLITE_BUSY) for a database another connection holds a lock on, past its busy timeout."""
LEASE_WAIT_S = 120.0
"""Default of :attr:`RetryPolicy.lease_wait_s` (and of the runtime's ``lease_wait_s`` setting)."""


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` calls at most; the pause after the n-th failed one (0-based) grows by ``step_s`` up to
    ``max_pause_s`` (40 attempts: ≈ 70 s of waiting in all, longer than a restarting actor takes).

    ``lease_wait_s``: how long, from the first such refusal, a call is tried again (pausing ``lock_pause_s``
    between tries, not counted as attempts) when it failed because another process holds a lock on one of the
    soul's databases (:func:`lock_held`). A new owner meets that lock when the old one is paused or cut off
    with it held: SQLite waits out its own busy timeout (30 s) first, and on a network file system a lock of a
    client that died or was cut off is held by the server until that client's lease expires (90 s by default
    on Linux's nfsd, NFSv4's lease; EFS and most filers use a similar figure), so a first try can fail for up
    to a minute and a half after the old owner stopped. 120 s (the default) outlasts a 90 s lease with a busy
    timeout to spare: a turn then waits instead of failing with :class:`StorageError`."""

    attempts: int = 40
    step_s: float = 0.1
    max_pause_s: float = 2.0
    lease_wait_s: float = LEASE_WAIT_S
    lock_pause_s: float = 1.0

    def pause(self, attempt: int) -> float:
        return min(self.max_pause_s, self.step_s * (attempt + 1))

    def last(self, attempt: int) -> bool:
        return attempt >= self.attempts - 1

    def lock_pause(self, first_locked: float, now: float) -> float | None:
        """The pause before trying again a call refused for a held lock, when the first refusal came at
        ``first_locked``; None once ``lease_wait_s`` has passed (the error is then the caller's)."""
        left = first_locked + self.lease_wait_s - now
        return None if left <= 0 else min(self.lock_pause_s, left)


def lock_held(err: BaseException) -> bool:
    """Did the call fail because another process holds a lock on a database it needed (SQLITE_BUSY after the
    busy timeout), rather than for a fault of the storage (disk full, I/O error, read-only)?"""
    return isinstance(err, StorageError) and any(m in str(err) for m in LOCK_HELD)


class LockWait:
    """One call's wait for a lock another process holds on the soul's database (:func:`lock_held`), from its first
    refusal on ``clock``: a turn's on its owner and a read's on the soul's store shard wait alike."""

    def __init__(self, policy: RetryPolicy, clock: Callable[[], float], what: str) -> None:
        self.policy, self.clock, self.what = policy, clock, what
        self.first: float | None = None

    def pause(self, err: BaseException) -> float:
        """The pause before the next try after ``err`` (a refusal for a held lock); the StorageError, naming
        ``lease_wait_s``, once that has passed. The first refusal is logged (a warning with ``lock_wait``)."""
        now = self.clock()
        first = self.first = now if self.first is None else self.first
        pause = self.policy.lock_pause(first, now)
        if pause is None:
            raise StorageError(f"{err} (still locked after {now - first:.0f} s more of tries: lease_wait_s)") from None
        if first == now:
            log.warning("%s: %s; trying again for up to %.0f s (an old owner's lock, held until its lease expires "
                        "on a network file system)", self.what, err, self.policy.lease_wait_s,
                        extra={"lock_wait": self.policy.lease_wait_s})
        return pause


DEFAULT = RetryPolicy()
