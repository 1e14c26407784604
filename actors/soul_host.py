"""Soul hosts: activate souls on demand, one activation per soul, passivate idle ones.

A host is a threaded Ray actor (plain class here, made remote in runtime.py).
Different souls run concurrently on its threads; a per-soul lock lets one turn
of a soul run at a time, and the soul itself checks the sequence number.
A dedicated actor for a hot soul is the same class hosting a single soul.

Turns arrive one per call (:meth:`SoulHost.run`) or several souls' at once (:meth:`SoulHost.run_batch`, from
a client's router). A batch's turns run side by side on the host's turn threads as one :class:`Crowd`, so
their recalls and writes reach each store shard together and go as one call.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from soul_runtime.batching import Crowd, parked
from soul_runtime.errors import InvalidInput, SoulError, StaleOwner, TurnFailed
from soul_runtime.loop.erase import forget_soul, forget_where
from soul_runtime.loop.soul import Soul, TurnResult
from soul_runtime.loop.trace import TurnTrace
from soul_runtime.memory.export import import_export
from soul_runtime.memory.sqlite_db import use_storage
from soul_runtime.models.base import LanguageModel
from soul_runtime.models.choice import make_model

from .channel import travels
from .introspection import ActorInfo
from .layer_shard import soul_dir
from .metrics import Metrics
from .parked_model import ParkedModel
from .remote_memory import RemoteMemory
from .routing import HOST_CHANNEL_METHODS, Later, Moved, read_registry
from .schedule import Closer, SizeTable, Ticker, batch_answer_at, over_capacity, to_passivate, within_capacity
from .settings import RuntimeConfig, process_capacity
from .shard_client import ShardCalls, StoreLocator


@dataclass
class _Activation:
    soul: Soul | None  # None while its opener is opening it
    lock: threading.Lock = field(default_factory=threading.Lock)
    ready: threading.Event = field(default_factory=threading.Event)

    @property
    def live(self) -> Soul:
        """The open soul (an activation returned by ``SoulHost._activate`` always has one)."""
        assert self.soul is not None
        return self.soul
    last_used: float = 0.0


class SoulHost(ActorInfo):
    def __init__(self, name: str, config: dict[str, Any], model: LanguageModel | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.cfg = RuntimeConfig.from_dict(config)
        self.capacity = process_capacity(self.cfg.host_capacity)  # active souls (0 in the config: automatic)
        use_storage(self.cfg.storage)
        self.crowd = Crowd()  # the threads running turns: a store call waits for the others to reach it
        model = model or make_model(self.cfg.model)
        self.model = model if model.offline else ParkedModel(model, self.crowd)  # a remote model is a wait
        self.stores = StoreLocator(self.cfg)
        self.calls = ShardCalls(self.stores, self.crowd, channels=self.cfg.local_channels)
        self.pool = ThreadPoolExecutor(self.cfg.host_threads, thread_name_prefix=f"{name}-turn")
        self.active: OrderedDict[str, _Activation] = OrderedDict()
        self.moved: dict[str, str] = read_registry(self.cfg.data_dir)  # souls served by another actor
        self.sizes = SizeTable()  # memory of each active soul, as of its last turn
        self.guard = threading.Lock()
        self._closer = Closer(f"{name}-close")  # souls passivated aside
        self._opening = 0  # activations being opened (in ``active`` without a soul yet)
        self.metrics = Metrics.create()
        self.clock = clock
        self.ticker = Ticker(self.cfg.idle_check_s, self.passivate_idle, name=f"{name}-idle") \
            if self.cfg.idle_check_s > 0 else None
        # for clients on this machine, as many calls at once as Ray runs
        self.serve_channel(HOST_CHANNEL_METHODS, self.cfg.host_threads if self.cfg.local_channels else 0)

    # ---- activation ------------------------------------------------------------------
    def _activate(self, soul_id: str) -> _Activation:
        """The soul's activation, opening it if need be. Opening (files, recovery) happens outside the host's
        lock, so a cold soul never stalls the other souls of the host; its own callers wait for it. A soul
        served by another actor (dedicated, or moved back) is refused with :class:`Moved` naming it."""
        with self.guard:
            to = self.moved.get(soul_id)
            if to is not None and to != self.name:
                raise Moved(soul_id, to)
            act = self.active.get(soul_id)
            opener = act is None
            if act is None:
                act = self.active[soul_id] = _Activation(None, last_used=self.clock())
                self._opening += 1
            else:
                self.active.move_to_end(soul_id)
                act.last_used = self.clock()
        if not opener:
            with parked(self.crowd):
                act.ready.wait()
            if act.soul is None:  # the opener failed: try again from scratch
                return self._activate(soul_id)
            return act
        try:
            d = soul_dir(self.cfg.data_dir, soul_id)
            act.soul = Soul(soul_id, d, memory=RemoteMemory(soul_id, self.calls,
                                                            d if self.cfg.storage == "local" else None),
                            model=self.model, config=self.cfg.soul, on_commit=self.metrics.model_usage)
        except BaseException:
            with self.guard:
                if self.active.get(soul_id) is act:
                    del self.active[soul_id]
                    self.sizes.pop(soul_id, None)
            raise
        finally:
            with self.guard:
                self._opening -= 1
            act.ready.set()
        self.metrics.activation()
        self._evict(aside=True)
        return act

    @contextmanager
    def _hold(self, soul_id: str) -> Iterator[_Activation]:
        """The soul's activation with its lock held (one turn at a time); if it was passivated between
        activation and lock, it is activated again."""
        while True:
            act = self._activate(soul_id)
            with parked(self.crowd):  # another call of the soul runs: this one cannot join a batch meanwhile
                act.lock.acquire()
            with self.guard:
                current = self.active.get(soul_id) is act
            if not current:
                act.lock.release()
                continue
            try:
                yield act
            finally:
                size = self._size(act)
                act.lock.release()
            with self.guard:
                if soul_id in self.active:
                    self.sizes[soul_id] = size
                over = bool(over_capacity(self.active, self.sizes, self.capacity, self.cfg.host_capacity_mb * 2**20))
            if over:  # a soul an eviction skipped because it was in a turn goes now
                self._evict(aside=True)
            return

    def _size(self, act: _Activation) -> int:
        """The soul's memory for eviction by bytes (0 when not limited, or when its files were closed)."""
        if not self.cfg.host_capacity_mb or act.soul is None:
            return 0
        try:
            return act.soul.memory_bytes()
        except sqlite3.Error:  # closed by forget or a failed turn: it is about to go anyway
            return 0

    def _evict(self, *, aside: bool = False) -> int:
        """Passivate idle souls and souls beyond capacity (least recently used first; the policy is
        :func:`to_passivate`); the files close outside the host's lock. Souls in a turn are skipped.

        With nothing to passivate - within capacity, and the least recently activated soul not idle - this
        returns without a pass over the active souls (it runs on every activation); over capacity with no soul
        idle it takes the oldest souls from the front of the LRU (what :func:`to_passivate` picks then, the bytes
        from the running total) without a pass either. ``aside``: the victims close
        on the host's closing thread (a turn that activated a soul does not wait for another soul's checkpoint);
        each victim's lock is held until its files are closed."""
        now = self.clock()
        victims: list[tuple[_Activation, str]] = []
        with self.guard:
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
            for sid in due:
                act = self.active[sid]
                if not act.live.busy and act.lock.acquire(blocking=False):  # memory work still running: later
                    del self.active[sid]
                    self.sizes.pop(sid, None)
                    victims.append((act, "idle" if now - act.last_used > self.cfg.idle_passivate_s else "capacity"))
        for _, reason in victims:  # passivated now (out of the active souls); their files close next
            self.metrics.passivation(reason)
        if aside and victims:
            self._closer.run(self._close_victims, victims)
        else:
            self._close_victims(victims)
        return len(victims)

    @staticmethod
    def _close_victims(victims: list[tuple[_Activation, str]]) -> None:
        """Close passivated souls whose locks :meth:`_evict` took, and release the locks."""
        for act, _ in victims:
            try:
                act.live.close()
            finally:
                act.lock.release()

    def wait_closed(self) -> None:
        """Wait until the souls passivated aside (see :meth:`_evict`) are closed."""
        self._closer.wait_closed()

    def stop(self) -> int:
        """Stop (see :mod:`actors.introspection`): the idle ticker, the channel, then every active soul is
        passivated (its last memory work lands first) and the closing thread ends. Returns how many souls were
        passivated."""
        if self.ticker is not None:
            self.ticker.stop()
            self.ticker = None
        super().stop()
        n = sum(self.passivate(sid) for sid in self.active_souls())
        self._closer.stop()
        self.pool.shutdown(wait=False)
        return n

    def passivate(self, soul_id: str) -> bool:
        with self.guard:
            act = self.active.get(soul_id)
        if act is None:
            return False
        act.ready.wait()
        with act.lock:
            with self.guard:
                if self.active.get(soul_id) is not act or act.soul is None:
                    return False
                del self.active[soul_id]
                self.sizes.pop(soul_id, None)
            act.live.close()
            self.metrics.passivation("asked")
            return True

    def move(self, soul_id: str, to: str) -> bool:
        """From now on ``to`` serves the soul: calls here are refused with :class:`Moved` naming it; the
        turn in progress finishes first and the soul is passivated (the controller's dedicate)."""
        with self.guard:
            self.moved[soul_id] = to
        return self.passivate(soul_id)

    def unmove(self, soul_id: str) -> None:
        """This actor serves the soul again (the controller's undedicate)."""
        with self.guard:
            self.moved.pop(soul_id, None)

    def passivate_idle(self) -> int:
        """Passivate the souls idle for longer than ``idle_passivate_s`` (the host's timer calls this)."""
        return self._evict()

    def active_souls(self) -> list[str]:
        with self.guard:
            return list(self.active)

    # ---- turns -------------------------------------------------------------------------
    def metrics_snapshot(self) -> dict[str, int]:
        """What this host counted, its calls to the store shards with the items they carried, and the turns
        that came over its local channel (``channel_calls``)."""
        return {**self.metrics.local, **self.calls.counts(), **self.channel_counts()}

    def run(self, soul_id: str, op: str, seq: int | None, request_id: str, payload: dict[str, Any]) -> TurnResult:
        """One turn (or observe, or forget_where) of the soul, numbered ``seq`` (None: the next number). The
        soul's lock here lets one call of a soul run at a time, in the order they take it (a client's router
        sends one call per soul at a time from each process); the soul itself checks ``seq``."""
        t0 = time.perf_counter()
        with self._hold(soul_id) as act, self._superseded(soul_id, act):
            act.last_used = self.clock()
            if op == "turn":
                res = act.live.turn(payload["text"], user=payload.get("user"), at=payload.get("at"),
                                    request_id=request_id, seq=seq, wait_writes=payload.get("wait_writes", True))
            elif op == "observe":
                res = act.live.observe(payload["messages"], at=payload.get("at"), session=payload.get("session"),
                                       request_id=request_id, seq=seq)
            elif op == "forget_where":
                res = forget_where(act.live, payload.get("ids"), payload.get("query"), request_id=request_id,
                                   seq=seq, at=payload.get("at"))
            else:
                raise InvalidInput(f"unknown operation {op!r}")
        self.metrics.turn(op, time.perf_counter() - t0)
        return res

    def run_batch(self, items: list[tuple[str, str, int | None, str, dict[str, Any]]]) -> list[Any]:
        """Several souls' calls in one (``run``'s arguments each; a client's router sends what its callers
        submitted together): they run side by side on the host's turn threads. One answer per item, in
        order: its result, or the :class:`SoulError` it raised (any other error as :class:`TurnFailed`)."""
        if not isinstance(items, list) or not all(isinstance(it, tuple) and len(it) == 5 for it in items):
            raise InvalidInput("run_batch takes a list of (soul_id, op, seq, request_id, payload) tuples")
        self.metrics.local["turn_calls"] += 1
        self.metrics.local["turn_items"] += len(items)
        self.crowd.join(len(items))  # members from now, not from when a thread picks the turn up
        if len(items) == 1:
            return [self._run_one(items[0])]
        futures = [self.pool.submit(self._run_one, it) for it in items]
        start, pending, half_s = time.monotonic(), set(futures), None
        while pending:  # all done, or the stragglers left behind (batch_answer_at)
            left = None if half_s is None else start + batch_answer_at(half_s) - time.monotonic()
            if left is not None and left <= 0:
                break
            _, pending = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
            if half_s is None and 2 * (len(futures) - len(pending)) >= len(futures):
                half_s = time.monotonic() - start
        self.metrics.local["turn_stragglers"] += len(pending)
        return [Later() if f in pending else f.result() for f in futures]

    def _run_one(self, item: tuple[str, str, int | None, str, dict[str, Any]]) -> Any:
        """One item of a batch (its caller joined the crowd for it; it leaves when done)."""
        soul_id, op = item[0], item[1]
        try:
            try:
                return self.run(*item)
            except SoulError as e:  # it must reach its caller, not fail the batch's answer
                return e if travels(e) else TurnFailed(f"{op} of {soul_id} failed: {e}")
            except Exception as e:  # noqa: BLE001 — this item's failure, not the batch's
                return TurnFailed(f"{op} of {soul_id} failed: {e!r}")
        finally:
            self.crowd.leave()

    @contextmanager
    def _superseded(self, soul_id: str, act: _Activation) -> Iterator[None]:
        """A newer owner took the soul over (StaleOwner): drop this activation, so that the next call here
        reactivates from disk under a new epoch, and let the caller see the error."""
        try:
            yield
        except StaleOwner:
            with self.guard:
                if self.active.get(soul_id) is act:
                    del self.active[soul_id]
                    self.sizes.pop(soul_id, None)
            act.live.close()
            raise

    def last_seq(self, soul_id: str) -> int:
        with self._hold(soul_id) as act:
            return act.live.last_seq

    def trace(self, soul_id: str, turn_id: str) -> TurnTrace:
        return self._activate(soul_id).live.trace(turn_id)

    def traces(self, soul_id: str, last: int) -> list[TurnTrace]:
        return self._activate(soul_id).live.traces(last)

    def usage(self, soul_id: str) -> dict[str, Any]:
        """The soul's model cost so far (every committed turn and observe), in all, per phase and per model."""
        return dict(self._activate(soul_id).live.state.usage)

    def forget(self, soul_id: str, stores: list[str] | None = None) -> dict[str, int]:
        """Erase a soul's memory for good (these layers, all by default) with its buffer and traces."""
        with self._hold(soul_id) as act:
            return forget_soul(act.live, stores)  # the last turn's memory work lands first, then all goes

    def import_(self, soul_id: str, blob: bytes) -> None:
        with self._hold(soul_id) as act:
            act.live.wait_memory_work()
            import_export(act.live.memory, blob, soul_id)  # type: ignore[arg-type]

    def ping(self) -> str:
        return self.name

