"""The turn path's client side: a soul's calls go straight to the actor that owns it, in order, retried.

A soul lives on the host its id hashes to (rendezvous over the hosts), or on its dedicated actor. Its host is
its one owner and orders its calls: one at a time under the soul's lock, numbered by the soul itself, a
retried request id answered from the record. This module, in every client process:

- routes: the hash, plus the runtime's dedicated souls (read from the orchestrator once, then learnt from
  :class:`Moved` answers: a host that no longer holds a soul names the actor that does);
- orders: one call per soul in flight from this process (:class:`SoulLocks`), so a crowd of submitters of
  one soul waits here, not on the host's threads, and other souls on that host are not held up;
- retries: while the owner is dead or restarting (the call is idempotent by its request id), after a
  superseded activation (:class:`StaleOwner`), and after a move; every other error is the caller's.

The retry policy is written once (:meth:`Router.steps`, a generator of calls and pauses) and driven by a
blocking loop (:meth:`Router.run`) and by a coroutine (:meth:`Router.run_async`).

Batched turns: the coroutine driver sends the turns its event loop's callers submit in one round to one host
as one ``run_batch`` call (:class:`AsyncBatcher`); the host runs them side by side and answers each (its result,
its own error, or :class:`Later` for a straggler, which is then asked for alone). A dead host fails the whole
call and each turn is retried on its own, as before. The blocking driver sends one turn per call: its threads
arrive one by one, and batching them cost a wait without filling batches.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import weakref
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soul_runtime.batching import AsyncBatcher
from soul_runtime.errors import OutOfOrder, RuntimeUnavailable, SoulError, StaleOwner, TurnFailed

from . import raycalls
from .channel import ChannelBook, ChannelBroken, ChannelTimeout
from .introspection import channel_address
from .placement import rendezvous

RETRIES = 40
BATCHED = frozenset({"run"})
"""The methods whose calls the coroutine driver batches per host (turns, observes, forget_where)."""
MAX_BATCH = 16
REGISTRY = "dedicated.json"
"""The data dir's record of dedicated souls (soul id -> actor name), written by the orchestrator."""


def read_registry(data_dir: str) -> dict[str, str]:
    try:
        data = json.loads((Path(data_dir) / REGISTRY).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


class Moved(StaleOwner):
    """This actor no longer holds the soul: ``to`` does (a dedicated actor, or back on its host)."""

    def __init__(self, soul_id: str, to: str) -> None:
        super().__init__(f"soul {soul_id} is served by {to}")
        self.soul_id, self.to = soul_id, to

    def __reduce__(self) -> tuple[Any, ...]:
        return (Moved, (self.soul_id, self.to))


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
class _Pause:
    seconds: float


@dataclass(frozen=True)
class _Batchable:
    """A turn the coroutine driver sends in a batch with others to the same actor (``run_batch``); the blocking
    driver sends it alone (``run``)."""

    name: str
    handle: Any
    item: tuple[Any, ...]


class SoulLocks:
    """One lock per soul, for threads; an entry lives while someone holds or waits for it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self.locks: dict[str, list[Any]] = {}  # soul -> [lock, users]

    @contextmanager
    def held(self, soul_id: str) -> Iterator[None]:
        with self._guard:
            entry = self.locks.setdefault(soul_id, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self.locks[soul_id]


class AsyncSoulLocks:
    """The same for coroutines of one event loop (asyncio.Lock wakes its waiters in order), with the loop's
    batchers of turns per host."""

    def __init__(self, channels: ChannelBook | None = None) -> None:
        self.locks: dict[str, list[Any]] = {}
        self.batchers: dict[str, AsyncBatcher[tuple[Any, Any], Any]] = {}
        self.channels = channels

    def batcher(self, name: str) -> AsyncBatcher[tuple[Any, Any], Any]:
        b = self.batchers.get(name)
        if b is None:
            async def send(items: list[tuple[Any, Any]]) -> Any:  # (handle, item): handles of one named actor
                handle, batch = items[0][0], [item for _, item in items]
                if self.channels is not None and self.channels.enabled:  # a host on this machine: its channel
                    try:
                        return await self.channels.call_async(name, handle, "run_batch", batch)
                    except ChannelBroken:  # none, or it broke (the host died): through Ray, the same requests
                        pass
                return await raycalls.call(handle, "run_batch", batch)
            b = self.batchers[name] = AsyncBatcher(send, max_batch=MAX_BATCH)
        return b

    def drop_idle(self, name: str) -> None:
        """Forget the batcher of ``name`` if it has nothing waiting or out (a dedicated actor's, so the
        batchers of actors that have gone do not pile up)."""
        b = self.batchers.get(name)
        if b is not None and b.idle:
            del self.batchers[name]

    @contextmanager
    def _entry(self, soul_id: str) -> Iterator[asyncio.Lock]:
        entry = self.locks.setdefault(soul_id, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            yield entry[0]
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self.locks[soul_id]


def _resume(gen: Generator[Any, Any, Any], value: Any, error: BaseException | None) -> Any:
    """The policy's next step after a call's answer (``value``) or its error."""
    return gen.send(value) if error is None else gen.throw(error)


class Router:
    """Where a soul's calls go from this process (see the module's doc)."""

    def __init__(self, hosts: list[str], namespace: str, dedicated: dict[str, str] | None = None, *,
                 channels: bool = False) -> None:
        self.hosts = list(hosts)
        self.channels = ChannelBook(channel_address, enabled=channels)  # blocking turns to hosts on this machine
        self.namespace = namespace
        self.dedicated: dict[str, str] = dict(dedicated or {})
        self._handles: dict[str, Any] = {}
        self.locks = SoulLocks()
        self._async_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncSoulLocks] = \
            weakref.WeakKeyDictionary()  # per event loop, gone with it

    def owner(self, soul_id: str) -> str:
        return self.dedicated.get(soul_id) or rendezvous(soul_id, self.hosts)

    def _handle(self, name: str) -> Any:
        h = self._handles.get(name)
        if h is None:
            h = raycalls.get_actor(name, self.namespace)
            if h is None:
                raise RuntimeUnavailable(f"{name} is not running")
            self._handles[name] = h
        return h

    def _gone(self, name: str, soul_id: str) -> None:
        self._handles.pop(name, None)
        if self.dedicated.pop(soul_id, None) == name:
            self.channels.forget(name)

    def _moved(self, soul_id: str, to: str) -> None:
        if to in self.hosts and rendezvous(soul_id, self.hosts) == to:
            old = self.dedicated.pop(soul_id, None)
        else:
            old, self.dedicated[soul_id] = self.dedicated.get(soul_id), to
        if old is not None and old != to:  # a dedicated actor the soul left: it goes away
            self.channels.forget(old)

    def steps(self, call: Routed) -> Generator[Any, Any, Any]:
        """The retry policy: yields calls — object refs, or :class:`_Batchable` calls a driver may batch (send
        back the value, or throw the raw Ray error or the item's own error) — and pauses (send back None);
        returns the answer."""
        for attempt in range(RETRIES):
            name = self.owner(call.soul_id)
            try:
                try:
                    handle = self._handle(name)
                    ref = _Batchable(name, handle, (call.soul_id, *call.args)) if call.method in BATCHED else \
                        raycalls.call(handle, call.method, call.soul_id, *call.args)
                except RuntimeUnavailable:  # not found (a dedicated actor gone, a host not up yet)
                    self._gone(name, call.soul_id)
                    if attempt == RETRIES - 1:
                        raise
                    yield _Pause(min(2.0, 0.1 * (attempt + 1)))
                    continue
                answer = yield ref
                if isinstance(answer, Later):  # a straggler of its batch: ask for it alone (same request id)
                    answer = yield raycalls.call(handle, call.method, call.soul_id, *call.args)
                return answer
            except raycalls.ACTOR_DIED:  # dead or restarting: the same request again (idempotent)
                self._gone(name, call.soul_id)  # a dedicated actor that died may be gone for good
                if attempt == RETRIES - 1:
                    raise RuntimeUnavailable(f"{name} stays unavailable") from None
                yield _Pause(min(2.0, 0.1 * (attempt + 1)))
            except (raycalls.TASK_ERROR, SoulError) as e:  # a batch answers an item's own error as itself
                err = raycalls.translate(e)
                if isinstance(err, Moved):
                    self._moved(call.soul_id, err.to)
                    if attempt >= 2:  # bounced more than once: a move in progress, let it finish
                        yield _Pause(0.05)
                elif isinstance(err, (StaleOwner, OutOfOrder)):  # superseded activation: it reactivates
                    continue
                elif isinstance(err, SoulError):
                    raise err from None
                else:
                    raise TurnFailed(f"{call.method} of {call.soul_id} failed: {err}") from None
        raise TurnFailed(f"{call.method} of {call.soul_id} could not be served after {RETRIES} attempts")

    def run(self, call: Routed, timeout: float | None = None) -> Any:
        """Drive :meth:`steps` blocking (the soul's calls from this process one at a time)."""
        with self.locks.held(call.soul_id):
            gen = self.steps(call)
            try:
                step = next(gen)
                while True:
                    if isinstance(step, _Pause):
                        time.sleep(step.seconds)
                        step = _resume(gen, None, None)
                        continue
                    value, error = self._blocking(step, timeout)
                    step = _resume(gen, value, error)
            except StopIteration as stop:
                return stop.value
            except Exception as e:  # a time-out, or anything else Ray raised: as the project's own
                raise raycalls.translate(e) from None

    def _blocking(self, step: Any, timeout: float | None) -> tuple[Any, BaseException | None]:
        """One call of the policy, waited for: a turn over its host's local channel if it has one here, else
        through Ray. The answer, or the call's own error (for the policy)."""
        try:
            if isinstance(step, _Batchable):
                ch = self.channels.client(step.name, step.handle)
                if ch is not None:
                    try:
                        return ch.call("run", *step.item, timeout=timeout), None
                    except ChannelBroken:  # the host died or restarted: through Ray (same request id)
                        pass
                    except ChannelTimeout:
                        return None, TurnFailed("no answer in time")
                step = raycalls.call(step.handle, "run", *step.item)
            return raycalls.get_raw(step, timeout), None
        except Exception as e:  # the call's own error goes into the policy
            return None, e

    async def run_async(self, call: Routed) -> Any:
        """Drive :meth:`steps` as a coroutine (the soul's calls from this event loop one at a time)."""
        loop = asyncio.get_running_loop()
        locks = self._async_locks.setdefault(loop, AsyncSoulLocks(self.channels))
        with locks._entry(call.soul_id) as lock:
            async with lock:
                gen = self.steps(call)
                try:
                    step = next(gen)
                    while True:
                        if isinstance(step, _Pause):
                            await asyncio.sleep(step.seconds)
                            step = _resume(gen, None, None)
                            continue
                        try:
                            if isinstance(step, _Batchable):
                                try:
                                    value = await locks.batcher(step.name).submit((step.handle, step.item))
                                finally:
                                    if step.name not in self.hosts:
                                        locks.drop_idle(step.name)
                            else:
                                value = await step
                            error = None
                        except Exception as e:
                            value, error = None, e
                        step = _resume(gen, value, error)
                except StopIteration as stop:
                    return stop.value
                except Exception as e:
                    raise raycalls.translate(e) from None
