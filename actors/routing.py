"""The turn path's client side: a soul's calls go straight to the actor that owns it, in order, retried.

A soul lives on the host its id hashes to (rendezvous over the hosts), or on its dedicated actor. Its host is
its one owner and orders its calls: one at a time under the soul's lock, numbered by the soul itself, a
retried request id answered from the record. This module, in every client process:

- routes: the hash, plus the runtime's dedicated souls (read from the controller once, then learnt from
  :class:`Moved` answers: a host that no longer holds a soul names the actor that does);
- orders: one call per soul in flight from this process (a lock per soul, :class:`KeyedLocks`), so a crowd of
  submitters of one soul waits here, not on the host's threads, and other souls on that host are not held up;
- retries: while the owner is dead or restarting (the call is idempotent by its request id), after a
  superseded activation (:class:`StaleOwner`), and after a move; while the host is at its admission limit
  (:class:`RuntimeBusy`) for up to ``busy_wait_s``, with growing pauses; while another process holds a lock on
  the soul's database (a :class:`StorageError` "database is locked": an old owner's lock, which a network file
  system keeps until its lease expires) for up to ``lease_wait_s``; every other error is the caller's.

The retry policy is written once (:meth:`Router.steps`, a generator of :class:`~soul_runtime.steps.Call` and
:class:`~soul_runtime.steps.Pause` steps, a call's target an :class:`Actor`) and run by the one pair of drivers
of :mod:`soul_runtime.steps`: blocking (:meth:`Router.run`) and from a coroutine (:meth:`Router.run_async`).

Batched turns: the coroutine driver sends the turns its event loop's callers submit in one round to one host
as one ``run_batch`` call (:class:`AsyncBatcher`: at most ``MAX_BATCH`` turns a call and ``MAX_CALLS`` calls out
per host: together above what a host admits, and few enough calls that what arrives meanwhile fills the next; a
call out for ``RELEASE_AFTER_S`` stops counting, so turns do not wait behind ones waiting for a slow model); the
host runs them side by side and answers each (its result,
its own error, or :class:`Later` for a straggler, which is then asked for alone). A dead host fails the whole
call and each turn is retried on its own. The blocking driver sends one turn per call: its threads arrive one
by one, and batching them would cost a wait without filling batches.

Every call goes through one :class:`~actors.transport.Transport`: a host's local channel on this machine, else
Ray.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soul_runtime.batching import AsyncBatcher
from soul_runtime.errors import (
    Moved,
    OutOfOrder,
    RuntimeBusy,
    RuntimeUnavailable,
    SoulError,
    StaleOwner,
    TurnFailed,
)
from soul_runtime.steps import Call, Pause, run_steps, run_steps_async

from . import raycalls
from . import retry as retry_policy
from .channel import ChannelBook, ChannelTimeout
from .fair_pool import tenant_of
from .handles import ActorHandles
from .introspection import channel_address
from .keyed_locks import KeyedLocks
from .placement import rendezvous
from .retry import RetryPolicy
from .transport import DirectTransport, Transport

HOST_CHANNEL_METHODS = ("run", "run_batch", "run_stream")
"""What a host serves on its local channel (:meth:`actors.soul_host.SoulHost.serve_channel`)."""
BATCHED = frozenset({"run"})
"""The methods whose calls the coroutine driver batches per host (turns, observes, forget_where)."""
MAX_BATCH = 256
MAX_CALLS = 4
RELEASE_AFTER_S = 0.5
"""A ``run_batch`` call out this long (its turns wait for a model) no longer counts among the ``MAX_CALLS``: turns
submitted meanwhile go in a new call instead of waiting for a slow one to answer."""
BUSY_PAUSE_S = (0.02, 1.0)
"""The first and the longest pause before a busy host is tried again."""
log = logging.getLogger("soul_runtime.routing")
REGISTRY = "dedicated.json"
"""The data dir's record of dedicated souls (soul id -> actor name), written by the controller."""


def read_registry(data_dir: str) -> dict[str, str]:
    try:
        data = json.loads((Path(data_dir) / REGISTRY).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


@dataclass(frozen=True)
class Routed:
    """A call to a soul's owner: ``method(soul_id, *args)`` on whichever actor holds the soul."""

    soul_id: str
    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Later:
    """A host's answer for a turn of a batch that was still running when the others were done: the client asks
    for it alone, with the same request id (the host returns the turn's result once it has run, never runs it
    twice)."""


@dataclass(frozen=True)
class Actor:
    """The target of a call of the policy (``Call(Actor(...), method, item)``: ``method(*item)`` on the actor
    ``name``). A ``batchable`` call (a turn) the coroutine driver may send in a batch with others to the same
    actor (``run_batch``); the blocking driver sends it alone."""

    name: str
    handle: Any
    batchable: bool


class AsyncSoulLocks:
    """The locks of one event loop's coroutines, per soul (asyncio.Lock wakes its waiters in order), with the
    loop's batchers of turns per host."""

    def __init__(self, transport: Transport | Any) -> None:
        self.locks: KeyedLocks[asyncio.Lock] = KeyedLocks(asyncio.Lock)
        self.batchers: dict[tuple[str, str], AsyncBatcher[tuple[Any, Any], Any]] = {}
        self.transport = transport

    def batcher(self, name: str, tenant: str = "") -> AsyncBatcher[tuple[Any, Any], Any]:
        """The batcher of turns to ``name`` of one tenant's souls: each tenant's turns go in calls of their own,
        so one tenant's flood of calls out does not hold another's turns back in this process."""
        b = self.batchers.get((name, tenant))
        if b is None:
            async def send(items: list[tuple[Any, Any]], answer: Callable[[int, Any], None]) -> Any:
                handle, batch = items[0][0], [item for _, item in items]  # (handle, item): one named actor's

                def parts(done: list[tuple[int, Any]]) -> None:
                    for i, a in done:
                        answer(i, a)
                return await self.transport.send_parts_async(name, handle, "run_stream", "run_batch", parts, batch)
            b = self.batchers[(name, tenant)] = AsyncBatcher(send, max_batch=MAX_BATCH, max_calls=MAX_CALLS,
                                                    release_after_s=RELEASE_AFTER_S, early=True)
        return b

    def drop_idle(self, name: str, tenant: str = "") -> None:
        """Forget the batcher of ``name`` and ``tenant`` if it has nothing waiting or out (a dedicated actor's, or a
        tenant's, so the batchers of actors that have gone and of tenants gone quiet do not pile up)."""
        b = self.batchers.get((name, tenant))
        if b is not None and b.idle:
            del self.batchers[(name, tenant)]


class Router:
    """Where a soul's calls go from this process (see the module's doc). ``transport``: how a call reaches the
    actor (default: a host's local channel on this machine when ``channels``, else Ray)."""

    def __init__(self, hosts: list[str], namespace: str, dedicated: dict[str, str] | None = None, *,
                 channels: bool = False, transport: Transport | DirectTransport | None = None,
                 retry: RetryPolicy = retry_policy.DEFAULT, busy_wait_s: float = 30.0) -> None:
        self.hosts = list(hosts)
        self.channels = ChannelBook(channel_address, enabled=channels)  # turns to hosts on this machine
        self.transport = transport if transport is not None else Transport(self.channels, HOST_CHANNEL_METHODS)
        self.namespace = namespace
        self.dedicated: dict[str, str] = dict(dedicated or {})
        self.handles = ActorHandles(namespace)
        self.retry = retry
        self.busy_wait_s = busy_wait_s
        self.clock = time.monotonic  # when a held lock was first met (lease_wait_s)
        self.locks: KeyedLocks[threading.Lock] = KeyedLocks(threading.Lock)
        self._async_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncSoulLocks] = \
            weakref.WeakKeyDictionary()  # per event loop, gone with it

    def owner(self, soul_id: str) -> str:
        return self.dedicated.get(soul_id) or rendezvous(soul_id, self.hosts)

    def _gone(self, name: str, soul_id: str) -> None:
        self.handles.forget(name)
        if self.dedicated.pop(soul_id, None) == name:
            self.transport.forget(name)

    def _moved(self, soul_id: str, to: str) -> None:
        if to in self.hosts and rendezvous(soul_id, self.hosts) == to:
            old = self.dedicated.pop(soul_id, None)
        else:
            old, self.dedicated[soul_id] = self.dedicated.get(soul_id), to
        if old is not None and old != to:  # a dedicated actor the soul left: it goes away
            self.transport.forget(old)

    def steps(self, call: Routed) -> Generator[Any, Any, Any]:
        """The retry policy: yields calls (:class:`~soul_runtime.steps.Call` of an :class:`Actor`; send back the
        value, or throw the raw Ray error or the call's own error) and pauses (send back None); returns the
        answer."""
        retry = self.retry
        busy: float | None = None  # when the owner first answered busy
        locked = retry_policy.LockWait(retry, self.clock, f"{call.method} of {call.soul_id}")
        busy_n = 0
        attempt = -1
        while attempt + 1 < retry.attempts:
            attempt += 1
            name = self.owner(call.soul_id)
            try:
                try:
                    handle = self.handles.get(name)
                except RuntimeUnavailable:  # not found (a dedicated actor gone, a host not up yet)
                    self._gone(name, call.soul_id)
                    if retry.last(attempt):
                        raise
                    yield Pause(retry.pause(attempt))
                    continue
                item = (call.soul_id, *call.args)
                answer = yield Call(Actor(name, handle, call.method in BATCHED), call.method, item)
                if isinstance(answer, Later):  # a straggler of its batch: ask for it alone (same request id)
                    answer = yield Call(Actor(name, handle, False), call.method, item)
                return answer
            except raycalls.ACTOR_DIED:  # dead or restarting: the same request again (idempotent)
                self._gone(name, call.soul_id)  # a dedicated actor that died may be gone for good
                if retry.last(attempt):
                    raise RuntimeUnavailable(f"{name} stays unavailable") from None
                yield Pause(retry.pause(attempt))
            except (raycalls.TASK_ERROR, SoulError) as e:  # a batch answers an item's own error as itself
                err = raycalls.translate(e)
                if isinstance(err, RuntimeBusy):  # at its admission limit: wait, not counted as an attempt
                    now = time.monotonic()
                    busy = now if busy is None else busy
                    if now - busy >= self.busy_wait_s:
                        raise RuntimeBusy(f"{call.method} of {call.soul_id}: {err} for {now - busy:.1f} s "
                                          "(busy_wait_s)") from None
                    low, high = BUSY_PAUSE_S
                    yield Pause(min(high, low * 2 ** min(busy_n, 10)))
                    busy_n += 1
                    attempt -= 1
                elif isinstance(err, Moved):
                    self._moved(call.soul_id, err.to)
                    if attempt >= 2:  # bounced more than once: a move in progress, let it finish
                        yield Pause(0.05)
                elif isinstance(err, (StaleOwner, OutOfOrder)):  # superseded activation: it reactivates
                    continue
                elif retry_policy.lock_held(err):  # another process holds the soul's database: wait its lock out
                    yield Pause(locked.pause(err))
                    attempt -= 1
                elif isinstance(err, SoulError):
                    raise err from None
                else:
                    raise TurnFailed(f"{call.method} of {call.soul_id} failed: {err}") from None
        raise TurnFailed(f"{call.method} of {call.soul_id} could not be served after {retry.attempts} attempts")

    def run(self, call: Routed, timeout: float | None = None) -> Any:
        """Run :meth:`steps` blocking (the soul's calls from this process one at a time)."""
        def perform(step: Call | Pause) -> Any:
            if isinstance(step, Pause):
                time.sleep(step.seconds)
                return None
            return self._blocking(step, timeout)

        with self.locks.held(call.soul_id):
            try:
                return run_steps(self.steps(call), perform)
            except Exception as e:  # a time-out, or anything else Ray raised: as the project's own
                raise raycalls.translate(e) from None

    def _blocking(self, step: Call, timeout: float | None) -> Any:
        """One call of the policy, waited for (a turn alone: the blocking driver's threads arrive one by one).
        Its error goes into the policy."""
        actor: Actor = step.target
        try:
            return self.transport.send(actor.name, actor.handle, step.method, *step.args).result(timeout)
        except ChannelTimeout:
            raise TurnFailed("no answer in time") from None

    async def run_async(self, call: Routed) -> Any:
        """Run :meth:`steps` as a coroutine (the soul's calls from this event loop one at a time)."""
        loop = asyncio.get_running_loop()
        locks = self._async_locks.get(loop)
        if locks is None:
            locks = self._async_locks[loop] = AsyncSoulLocks(self.transport)

        async def perform(step: Call | Pause) -> Any:
            if isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
                return None
            actor: Actor = step.target
            if not actor.batchable:
                return await self.transport.send_async(actor.name, actor.handle, step.method, *step.args)
            tenant = tenant_of(call.soul_id)
            try:
                return await locks.batcher(actor.name, tenant).submit((actor.handle, step.args))
            finally:
                if tenant or actor.name not in self.hosts:
                    locks.drop_idle(actor.name, tenant)
        with locks.locks.entry(call.soul_id) as lock:
            async with lock:
                try:
                    return await run_steps_async(self.steps(call), perform)
                except Exception as e:
                    raise raycalls.translate(e) from None
