"""A soul's reads (recall, facts, fact history, procedures, episodes, stats, export): straight to the store shard of
each layer, not through the soul's owner, and retried as the owner's calls are when the shard meets a lock another
process holds on the soul's database (a paused or cut-off old owner's, which a network file system keeps until
its lease expires): once a second for up to ``lease_wait_s`` (:class:`~actors.retry.LockWait`), then the
StorageError is the caller's. Any other error is the caller's at once; a shard that died is restarted by Ray, which
retries the call itself (the shards' ``max_task_retries``).

The policy is one generator (:func:`read_steps`) run by the drivers of :mod:`soul_runtime.steps`; the blocking
driver (:func:`run_reads`) sends the first try of every read of a call at once, as the calls were sent before, and
waits for each; a refused one is tried again alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from soul_runtime.errors import SoulError
from soul_runtime.steps import Call, Pause, run_steps, run_steps_async

from . import raycalls
from .retry import LockWait, RetryPolicy, lock_held


@dataclass(frozen=True)
class ShardRead:
    """``method(*args, **kwargs)`` on the store shard of the soul's ``layer``."""

    layer: str
    soul_id: str
    method: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def read_steps(read: ShardRead, retry: RetryPolicy, clock: Callable[[], float] = time.monotonic
               ) -> Generator[Any, Any, Any]:
    """The policy: yields the read (a :class:`~soul_runtime.steps.Call` of it: send back its answer, or throw the
    raw Ray error or the shard's own) and pauses (send back None); returns the answer."""
    locked = LockWait(retry, clock, f"{read.method} of {read.soul_id} ({read.layer})")
    while True:
        try:
            return (yield Call(read, read.method, read.args))
        except (raycalls.TASK_ERROR, SoulError) as e:
            err = raycalls.translate(e)
            if not lock_held(err):
                raise err from None
            yield Pause(locked.pause(err))


def _send(handle_of: Callable[[ShardRead], Any], read: ShardRead) -> Any:
    return raycalls.call(handle_of(read), read.method, *read.args, **read.kwargs)


def send_reads(reads: Sequence[ShardRead], handle_of: Callable[[ShardRead], Any]) -> list[Any]:
    """The first try of each read, sent (its ObjectRef): the reads of a call are in flight together."""
    return [_send(handle_of, r) for r in reads]


def run_reads(reads: Sequence[ShardRead], handle_of: Callable[[ShardRead], Any], retry: RetryPolicy,
              timeout: float | None, first: Sequence[Any] | None = None) -> list[Any]:
    """The answers of ``reads``, blocking: their first tries (``first``, else sent now, all at once), each waited
    for (``timeout`` a try) and retried by the policy."""
    first = send_reads(reads, handle_of) if first is None else first
    out = []
    for i, (read, ref) in enumerate(zip(reads, first, strict=True)):
        pending: list[Any] = [ref]

        def perform(step: Call | Pause, pending: list[Any] = pending, read: ShardRead = read) -> Any:
            if isinstance(step, Pause):
                time.sleep(step.seconds)
                return None
            sent = pending.pop() if pending else _send(handle_of, read)
            return raycalls.get_raw(sent, timeout=timeout)
        try:
            out.append(run_steps(read_steps(read, retry), perform))
        except Exception as e:  # a time-out, or anything else Ray raised: as the project's own
            drain(first[i + 1:], timeout)
            raise raycalls.translate(e) from None
    return out


def drain(refs: Sequence[Any], timeout: float | None) -> None:
    """Wait out the other reads of a call that failed (one soul's reads fail together: a soul that does not
    exist), so Ray does not report their errors as never retrieved."""
    for ref in refs:
        try:
            raycalls.get_raw(ref, timeout=timeout)
        except Exception:  # noqa: BLE001 - the call's error is the first one
            pass


async def run_read_async(read: ShardRead, handle_of: Callable[[ShardRead], Any], retry: RetryPolicy) -> Any:
    """The answer of ``read``, awaited, retried by the policy."""
    async def perform(step: Call | Pause) -> Any:
        if isinstance(step, Pause):
            await asyncio.sleep(step.seconds)
            return None
        return await _send(handle_of, read)
    return await run_steps_async(read_steps(read, retry), perform)
