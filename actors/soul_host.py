"""Soul hosts: activate souls on demand, one activation per soul, passivate idle ones.

A host is an async Ray actor (plain class here, made remote in runtime.py): its souls' calls run as coroutines
on the actor's event loop, each driving the soul's steps (:mod:`soul_runtime.steps`). A turn that waits for its
model (an async adapter's HTTP call) or for a store shard (an answer over a local channel or Ray) holds no
thread; the code between those waits — context assembly, the offline model, the soul's SQLite commits — runs
on the host's ``host_threads``. Different souls run concurrently; a per-soul lock lets one call of a soul run
at a time, and the soul itself checks the sequence number. A dedicated actor for a hot soul is the same class
hosting a single soul.

Calls arrive one at a time (:meth:`SoulHost.run`) or several souls' at once (:meth:`SoulHost.run_batch`, from
a client's router); their recalls and writes to one store shard go out together (:class:`ShardCalls` batches
what the loop's turns send in one round).

**Admission.** A host runs at most ``host_admission`` calls at once; one beyond it is refused at once with
:class:`~soul_runtime.errors.RuntimeBusy`, which the caller's router waits out (``busy_wait_s``). A caller that
gives up (a timeout, a cancelled coroutine, a closed connection) does not cut a call short: a call that has
begun runs to its end, and a retry with its request id gets its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from soul_runtime import telemetry
from soul_runtime.errors import InvalidInput, RuntimeBusy, SoulError, StaleOwner, StorageError, TurnFailed
from soul_runtime.loop.erase import forget_soul_steps, forget_where_steps
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.export import import_export
from soul_runtime.memory.sqlite_db import use_storage
from soul_runtime.models.base import AsyncLanguageModel, LanguageModel
from soul_runtime.models.choice import make_model
from soul_runtime.records import TurnResult, TurnTrace
from soul_runtime.steps import Steps, drive_async, on_pool

from . import raycalls
from .channel import travels
from .fair_gate import fair_model
from .fair_pool import TENANT, FairPool, tenant_of
from .introspection import ActorBase
from .metrics import Metrics
from .remote_memory import RemoteMemory
from .routing import HOST_CHANNEL_METHODS, Later, Moved, read_registry
from .schedule import SizeTable, batch_answer_at, over_capacity, part_hold, to_passivate, within_capacity
from .settings import RuntimeConfig, process_capacity
from .shard_client import ShardCalls, StoreLocator
from .soul_presence import require_known, soul_dir
from .tenant_usage import FLUSH_S, UsageBook, usage_book
from .tenant_weights import TenantWeights
from .turn_spans import Calls, TurnSpans


@dataclass
class _Activation:
    soul: Soul | None  # None while its opener is opening it
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    last_used: float = 0.0

    @property
    def live(self) -> Soul:
        """The open soul (an activation returned by ``SoulHost._activate`` always has one)."""
        assert self.soul is not None
        return self.soul


def loop_model(model: LanguageModel | AsyncLanguageModel) -> LanguageModel | AsyncLanguageModel:
    """The model as a host's loop calls it: a remote adapter's asynchronous view (its HTTP calls awaited), any
    other model as it is (coroutine methods awaited, plain ones run on the host's threads)."""
    view = getattr(model, "asynchronous", None)
    return view() if callable(view) else model


class SoulHost(ActorBase):
    def __init__(self, name: str, config: dict[str, Any], model: LanguageModel | AsyncLanguageModel | None = None,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.cfg = RuntimeConfig.from_dict(config)
        self.capacity = process_capacity(self.cfg.host_capacity)  # active souls (0 in the config: automatic)
        use_storage(self.cfg.storage)
        self.weights = TenantWeights(self.cfg.data_dir, self.cfg.storage)
        self.model = fair_model(loop_model(model or make_model(self.cfg.model, args=self.cfg.model_args)),
                                self.cfg.model_slots, self.weights)  # this process's
        self.stores = StoreLocator(self.cfg)
        self.calls = ShardCalls(self.stores, channels=self.cfg.local_channels)
        self.pool = FairPool(self.cfg.host_threads, self.weights, thread_name_prefix=f"{name}-work",
                             slots=self.cfg.host_steps)
        self._aside: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None  # see _aside_places
        self._closing_pool = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-close")  # souls passivated aside
        self.active: OrderedDict[str, _Activation] = OrderedDict()
        self.moved: dict[str, str] = read_registry(self.cfg.data_dir)  # souls served by another actor
        self.sizes = SizeTable()  # memory of each active soul, as of its last turn
        self._closing: set[asyncio.Future[Any]] = set()
        self._work: set[asyncio.Task[Any]] = set()  # memory work running beside its turn (wait_writes=False)
        self._opening = 0  # activations being opened (in ``active`` without a soul yet)
        self.in_progress = 0
        self.metrics = Metrics.create()
        self._book_lock = threading.Lock()
        self.book = usage_book(self.cfg.data_dir, self.cfg.storage, name) if raycalls.current_actor() else UsageBook(None)
        self.traced = Calls() if telemetry.tracer() is not None else None  # the calls' spans, when traces are on
        self._committed = self._counted if self.traced is None else self.traced.hook(self._counted)
        self.clock = clock
        self._ticker: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self.start(HOST_CHANNEL_METHODS, self.cfg.host_threads if self.cfg.local_channels else 0)

    def on_start(self) -> None:
        """The idle ticker (passivation), when running on an event loop (as a Ray actor, made on its loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None and self.cfg.idle_check_s > 0:
            self._ticker = loop.create_task(self._tick())
        if loop is not None and self.book.kept:
            self._flusher = loop.create_task(self._flush_every())

    async def _flush_every(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            self._take_waits()
            await asyncio.to_thread(self._write_book)  # a file, or a statement to the server: off the loop

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.idle_check_s)
            try:
                await self.passivate_idle()
            except Exception:  # noqa: BLE001 — the next tick tries again
                pass

    def _counted(self, trace: TurnTrace) -> None:
        """A committed turn (observe, forget) counted: its model calls and tokens, and its tenant's usage."""
        tokens = self.metrics.model_usage(trace)
        tenant = tenant_of(trace.soul_id)
        self.metrics.tenant_turn(tenant, tokens)
        with self._book_lock:  # a host thread; the loop's flusher writes the book (_flush_every)
            self.book.add(tenant, "turns")
            self.book.add(tenant, "tokens", tokens)

    def _take_waits(self) -> None:
        """(On the loop.) The seconds each tenant's work waited since the last take, into the book."""
        waited = self.pool.take_waits()
        gate = getattr(self.model, "gate", None)
        if gate is not None:
            for tenant, s in gate.waited_s.items():
                waited[tenant] += s
            gate.waited_s = defaultdict(float)
        with self._book_lock:
            for tenant, s in waited.items():
                self.book.add(tenant, "queued_s", s)
                self.metrics.tenant_queued(tenant, s)

    def _write_book(self) -> None:
        with self._book_lock:  # the host's threads count turns meanwhile: the write goes outside the lock
            doc = self.book.due()
        try:
            if doc is not None:
                self.book.write(doc)
        except (OSError, StorageError):  # counting must never fail a turn; the next flush writes it
            pass

    def _spawned(self, task: asyncio.Task[Any]) -> None:
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    async def _drive(self, steps: Steps[Any], soul: Soul, spans: TurnSpans | None = None) -> Any:
        targets = {"model": self.model, "memory": soul.memory} if spans is None else \
            spans.targets(self.model, soul.memory)
        return await drive_async(steps, targets, self.pool, self._spawned, aside=self._aside_places())

    def _aside_places(self) -> asyncio.Semaphore:
        """The places on the pool the memory work beside the turns may hold: all but a quarter, which a burst of
        memory work leaves to the turns' own steps (their replies); the memory work still has most of the pool,
        so under a sustained load it does not fall behind the turns."""
        loop = asyncio.get_running_loop()
        if self._aside is None or self._aside[0] is not loop:
            slots = min(self.cfg.host_threads, self.cfg.host_steps or self.cfg.host_threads)
            self._aside = (loop, asyncio.Semaphore(max(1, slots - max(1, slots // 4))))
        return self._aside[1]

    async def _in_pool(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await on_pool(asyncio.get_running_loop(), self.pool, fn, *args)

    # ---- activation ------------------------------------------------------------------
    async def _activate(self, soul_id: str) -> _Activation:
        """The soul's activation, opening it if need be. Opening (files, recovery) runs beside the other souls'
        calls; its own callers wait for it. A soul served by another actor (dedicated, or moved back) is refused
        with :class:`Moved` naming it."""
        to = self.moved.get(soul_id)
        if to is not None and to != self.name:
            raise Moved(soul_id, to)
        act = self.active.get(soul_id)
        if act is not None:
            self.active.move_to_end(soul_id)
            act.last_used = self.clock()
            await act.ready.wait()
            if act.soul is None:  # the opener failed: try again from scratch
                return await self._activate(soul_id)
            return act
        act = self.active[soul_id] = _Activation(None, last_used=self.clock())
        self._opening += 1
        try:
            d = soul_dir(self.cfg.data_dir, soul_id)
            memory = RemoteMemory(soul_id, self.calls, d if self.cfg.storage == "local" else None)
            soul = await self._in_pool(lambda: Soul(soul_id, d, memory=memory, model=self.model,
                                                    config=self.cfg.soul, on_commit=self._committed,
                                                    recover=False))
            try:
                await self._drive(soul.recover_steps(), soul)
            except BaseException:
                await self._in_pool(soul.close)
                raise
            act.soul = soul
        except BaseException:
            if self.active.get(soul_id) is act:
                del self.active[soul_id]
                self.sizes.pop(soul_id, None)
            raise
        finally:
            self._opening -= 1
            act.ready.set()
        self.metrics.activation()
        await self._evict(aside=True)
        return act

    @asynccontextmanager
    async def _hold(self, soul_id: str) -> AsyncIterator[_Activation]:
        """The soul's activation with its lock held (one call at a time); if it was passivated between
        activation and lock, it is activated again."""
        while True:
            act = await self._activate(soul_id)
            await act.lock.acquire()
            if self.active.get(soul_id) is not act:
                act.lock.release()
                continue
            try:
                yield act
            finally:
                size = self._size(act)
                act.lock.release()
            if soul_id in self.active:
                self.sizes[soul_id] = size
            if over_capacity(self.active, self.sizes, self.capacity, self.cfg.host_capacity_mb * 2**20):
                await self._evict(aside=True)  # a soul an eviction skipped because it was in a call goes now
            return

    def _size(self, act: _Activation) -> int:
        """The soul's memory for eviction by bytes (0 when not limited, or when its files were closed)."""
        if not self.cfg.host_capacity_mb or act.soul is None:
            return 0
        try:
            return act.soul.memory_bytes()
        except sqlite3.Error:  # closed by forget or a failed turn: it is about to go anyway
            return 0

    async def _evict(self, *, aside: bool = False) -> int:
        """Passivate idle souls and souls beyond capacity (least recently used first; the policy is
        :func:`to_passivate`). Souls in a call, or with memory work still running, are skipped.

        With nothing to passivate - within capacity, and the least recently activated soul not idle - this
        returns without a pass over the active souls (it runs on every activation); over capacity with no soul
        idle it takes the oldest souls from the front of the LRU without a pass either. ``aside``: the victims'
        files close on the host's closing thread while the caller goes on; each victim's lock is held until its
        files are closed."""
        now = self.clock()
        oldest = next(iter(self.active.values()), None)
        idle = oldest is not None and now - oldest.last_used > self.cfg.idle_passivate_s
        max_bytes = self.cfg.host_capacity_mb * 2**20
        if not idle and within_capacity(len(self.active), self.sizes.total, self.capacity, max_bytes):
            return 0
        if not idle:  # over capacity (count or bytes): the oldest open souls beyond it, from the LRU's front
            live = (sid for sid, a in self.active.items() if a.soul is not None)
            n_live = len(self.active) - self._opening
            due = list(islice(live, max(0, n_live - self.capacity)))
            used = self.sizes.total - sum(self.sizes.get(sid, 0) for sid in due)
            while max_bytes > 0 and used > max_bytes and len(due) < n_live - 1:  # the newest always stays
                due.append(next(live))
                used -= self.sizes.get(due[-1], 0)
        else:
            last = {sid: a.last_used for sid, a in self.active.items() if a.soul is not None}
            due = to_passivate(last, now, self.cfg.idle_passivate_s, self.capacity, self.sizes, max_bytes)
        victims: list[_Activation] = []
        for sid in due:
            act = self.active[sid]
            if not act.live.busy and not act.lock.locked():  # memory work still running: later
                await act.lock.acquire()  # free: taken at once
                del self.active[sid]
                self.sizes.pop(sid, None)
                victims.append(act)
                self.metrics.passivation("idle" if now - act.last_used > self.cfg.idle_passivate_s else "capacity")
        if not victims:
            return 0
        closing = asyncio.ensure_future(self._close_victims(victims))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        if not aside:
            await closing
        return len(victims)

    async def _close_victims(self, victims: list[_Activation]) -> None:
        """Close passivated souls whose locks :meth:`_evict` took (on the closing thread), and release the
        locks."""
        try:
            await asyncio.get_running_loop().run_in_executor(self._closing_pool, _close_all, victims)
        finally:
            for act in victims:
                act.lock.release()

    async def wait_closed(self) -> None:
        """Wait until the souls passivated aside (see :meth:`_evict`) are closed."""
        while self._closing:
            await asyncio.wait(list(self._closing))

    async def stop(self) -> int:
        """Stop (see :mod:`actors.introspection`): the channel, then :meth:`on_stop`. Returns how many souls were
        passivated. (Written out as a coroutine: Ray runs an async actor's coroutine methods on its loop.)"""
        n: int = await super().stop()
        return n

    async def on_stop(self) -> int:
        """The idle ticker, then every active soul is passivated (its last memory work lands first) and the
        closing thread ends."""
        for task in (self._ticker, self._flusher):
            if task is not None:
                task.cancel()
        self._ticker = self._flusher = None
        n = 0
        for sid in self.active_souls():
            n += await self.passivate(sid)
        if self._work:
            await asyncio.wait(list(self._work))
        await self.wait_closed()
        self._take_waits()
        with self._book_lock, contextlib.suppress(OSError, StorageError):
            self.book.flush(force=True)
        close = getattr(self.model, "aclose", None)  # a remote model's clients on this loop
        if close is not None:
            await close()
        self._closing_pool.shutdown(wait=True)
        self.pool.shutdown(wait=False)
        telemetry.flush()  # the spans not yet exported go before the actor is killed
        return n

    async def passivate(self, soul_id: str) -> bool:
        act = self.active.get(soul_id)
        if act is None:
            return False
        await act.ready.wait()
        async with act.lock:
            if self.active.get(soul_id) is not act or act.soul is None:
                return False
            del self.active[soul_id]
            self.sizes.pop(soul_id, None)
            soul = act.live
            await self._drive(soul.wait_steps(), soul)  # its last memory work lands (on the loop) first
            await self._in_pool(soul.close)
            self.metrics.passivation("asked")
            return True

    async def move(self, soul_id: str, to: str) -> bool:
        """From now on ``to`` serves the soul: calls here are refused with :class:`Moved` naming it; the
        call in progress finishes first and the soul is passivated (the controller's dedicate)."""
        self.moved[soul_id] = to
        return await self.passivate(soul_id)

    def unmove(self, soul_id: str) -> None:
        """This actor serves the soul again (the controller's undedicate)."""
        self.moved.pop(soul_id, None)

    async def passivate_idle(self) -> int:
        """Passivate the souls idle for longer than ``idle_passivate_s`` (the host's timer calls this)."""
        return await self._evict()

    def active_souls(self) -> list[str]:
        return list(self.active)

    # ---- calls ---------------------------------------------------------------------------
    def metrics_snapshot(self) -> dict[str, int]:
        """What this host counted, its calls to the store shards with the items they carried, the calls that
        came over its local channel (``channel_calls``), and the calls in progress now (``in_progress``)."""
        return {**self.metrics.local, **self.calls.counts(), **self.channel_counts(), "in_progress": self.in_progress,
                "memory_work": len(self._work)}

    async def run(self, soul_id: str, op: str, seq: int | None, request_id: str, payload: dict[str, Any]
                  ) -> TurnResult:
        """One turn (or observe, or forget_where) of the soul, numbered ``seq`` (None: the next number). The
        soul's lock here lets one call of a soul run at a time, in the order they take it (a client's router
        sends one call per soul at a time from each process); the soul itself checks ``seq``. Refused with
        RuntimeBusy when ``host_admission`` calls are in progress; a call that has begun ends even if its caller
        goes away."""
        if self.in_progress >= self.cfg.host_admission:
            self.metrics.local["busy"] += 1
            raise RuntimeBusy(f"{self.name} has {self.in_progress} calls in progress (host_admission)")
        self.in_progress += 1
        task = asyncio.ensure_future(self._run(soul_id, op, seq, request_id, payload))
        task.add_done_callback(self._ended)
        return await asyncio.shield(task)

    def _ended(self, task: asyncio.Future[Any]) -> None:
        self.in_progress -= 1
        if not task.cancelled():
            task.exception()  # seen: a caller that went away leaves no "never retrieved" warning

    async def _run(self, soul_id: str, op: str, seq: int | None, request_id: str, payload: dict[str, Any]
                   ) -> TurnResult:
        TENANT.set(tenant_of(soul_id))  # this call's task: its work waits for threads and model in fair order
        carried = payload.get(telemetry.CARRIER_KEY) if isinstance(payload, dict) else None
        spans = None if self.traced is None else self.traced.begin(op, soul_id, request_id, carried)
        try:
            res = await self._run_traced(soul_id, op, seq, request_id, payload, spans)
        except BaseException as e:
            if self.traced is not None and spans is not None:
                self.traced.end(spans, error=e)
            raise
        if self.traced is not None and spans is not None:
            self.traced.end(spans, res)
        return res

    async def _run_traced(self, soul_id: str, op: str, seq: int | None, request_id: str, payload: dict[str, Any],
                          spans: TurnSpans | None) -> TurnResult:
        t0 = time.perf_counter()
        async with self._hold(soul_id) as act, self._superseded(soul_id, act):
            act.last_used = self.clock()
            soul = act.live
            steps: Steps[TurnResult]
            if op == "turn":
                steps = soul.turn_steps(payload["text"], user=payload.get("user"), at=payload.get("at"),
                                        request_id=request_id, seq=seq, wait_writes=payload.get("wait_writes", True))
            elif op == "observe":
                steps = soul.observe_steps(payload["messages"], at=payload.get("at"), session=payload.get("session"),
                                           request_id=request_id, seq=seq)
            elif op == "forget_where":
                steps = forget_where_steps(soul, payload.get("ids"), payload.get("query"), request_id=request_id,
                                           seq=seq, at=payload.get("at"))
            else:
                raise InvalidInput(f"unknown operation {op!r}")
            res: TurnResult = await self._drive(steps, soul, spans)
        self.metrics.turn(op, time.perf_counter() - t0)
        return res

    async def run_batch(self, items: list[tuple[str, str, int | None, str, dict[str, Any]]]) -> list[Any]:
        """Several souls' calls in one (``run``'s arguments each; a client's router sends what its callers
        submitted together): they run side by side. One answer per item, in order: its result, or the
        :class:`SoulError` it raised (any other error as :class:`TurnFailed`); an item still running when the
        others are long done is answered :class:`Later` (it goes on; its caller asks for it alone)."""
        tasks = self._batch_tasks(items)
        start, pending, half_s = time.monotonic(), set(tasks), None
        while pending:  # all done, or the stragglers left behind (batch_answer_at)
            left = None if half_s is None else start + batch_answer_at(half_s) - time.monotonic()
            if left is not None and left <= 0:
                break
            _, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if half_s is None and 2 * (len(tasks) - len(pending)) >= len(tasks):
                half_s = time.monotonic() - start
        self.metrics.local["turn_stragglers"] += len(pending)
        return [Later() if t in pending else t.result() for t in tasks]

    async def run_stream(self, items: list[tuple[str, str, int | None, str, dict[str, Any]]]
                         ) -> AsyncIterator[list[tuple[int, Any]]]:
        """:meth:`run_batch` answered in parts, for a caller on this machine (the local channel carries each part
        as it is yielded): each item's answer (index, answer) as soon as it is done, those done together in one
        part, so a turn's caller does not wait for the other turns of its batch, and nothing is a straggler. Those
        that finish within :func:`part_hold` of the first travel together."""
        tasks = self._batch_tasks(items)
        index = {t: i for i, t in enumerate(tasks)}
        pending = set(tasks)
        start = time.monotonic()
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            hold = part_hold(time.monotonic() - start) if pending else 0.0
            if hold > 0:
                more, pending = await asyncio.wait(pending, timeout=hold)
                done |= more
            yield sorted((index[t], t.result()) for t in done)

    def _batch_tasks(self, items: list[tuple[str, str, int | None, str, dict[str, Any]]]) -> list[asyncio.Task[Any]]:
        """A batch's items started side by side (counted), each answering its result or its own error."""
        if not isinstance(items, list) or not all(isinstance(it, tuple) and len(it) == 5 for it in items):
            raise InvalidInput("run_batch takes a list of (soul_id, op, seq, request_id, payload) tuples")
        self.metrics.local["turn_calls"] += 1
        self.metrics.local["turn_items"] += len(items)
        return [asyncio.ensure_future(self._run_one(it)) for it in items]

    async def _run_one(self, item: tuple[str, str, int | None, str, dict[str, Any]]) -> Any:
        """One item of a batch: its result or its error, as an answer."""
        soul_id, op = item[0], item[1]
        try:
            return await self.run(*item)
        except SoulError as e:  # it must reach its caller, not fail the batch's answer
            return e if travels(e) else TurnFailed(f"{op} of {soul_id} failed: {e}")
        except Exception as e:  # noqa: BLE001 — this item's failure, not the batch's
            return TurnFailed(f"{op} of {soul_id} failed: {e!r}")

    @asynccontextmanager
    async def _superseded(self, soul_id: str, act: _Activation) -> AsyncIterator[None]:
        """A newer owner took the soul over (StaleOwner): drop this activation, so that the next call here
        reactivates from disk under a new epoch, and let the caller see the error."""
        try:
            yield
        except StaleOwner:
            if self.active.get(soul_id) is act:
                del self.active[soul_id]
                self.sizes.pop(soul_id, None)
            await self._in_pool(act.live.close)
            raise

    async def last_seq(self, soul_id: str) -> int:
        async with self._hold(soul_id) as act:
            return act.live.last_seq

    async def _read(self, soul_id: str) -> Soul:
        """The soul, for a read: activated if it exists; NotFound, and nothing created, if it does not."""
        TENANT.set(tenant_of(soul_id))
        if soul_id not in self.active:
            require_known(self.cfg.data_dir, soul_id)
        return (await self._activate(soul_id)).live

    async def trace(self, soul_id: str, turn_id: str) -> TurnTrace:
        soul = await self._read(soul_id)
        return await self._in_pool(soul.trace, turn_id)

    async def traces(self, soul_id: str, last: int) -> list[TurnTrace]:
        soul = await self._read(soul_id)
        return await self._in_pool(soul.traces, last)

    async def usage(self, soul_id: str) -> dict[str, Any]:
        """The soul's model cost so far (every committed turn and observe), in all, per phase and per model."""
        return dict((await self._read(soul_id)).state.usage)

    async def forget(self, soul_id: str, stores: list[str] | None = None) -> dict[str, int]:
        """Erase a soul's memory (these layers, all by default) for good, with its buffer and traces."""
        TENANT.set(tenant_of(soul_id))
        async with self._hold(soul_id) as act:  # the last turn's memory work lands first, then all goes
            return await self._drive(forget_soul_steps(act.live, stores), act.live)

    async def import_(self, soul_id: str, blob: bytes) -> None:
        TENANT.set(tenant_of(soul_id))
        async with self._hold(soul_id) as act:
            soul = act.live
            await self._drive(soul.wait_steps(), soul)
            await self._in_pool(import_export, soul.memory, blob, soul_id)

    def ping(self) -> str:
        return self.name


def _close_all(victims: list[_Activation]) -> None:
    for act in victims:
        act.live.close()
