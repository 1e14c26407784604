"""Soul hosts: activate souls on demand, one activation per soul, passivate idle ones.

A host is a threaded Ray actor (plain class here, made remote in runtime.py).
Different souls run concurrently on its threads; a per-soul lock lets one turn
of a soul run at a time, and the soul itself checks the sequence number.
A dedicated actor for a hot soul is the same class hosting a single soul.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from soul_runtime.errors import InvalidInput
from soul_runtime.loop.soul import Soul, TurnResult
from soul_runtime.loop.trace import TurnTrace
from soul_runtime.memory.soul_memory import (
    answer_without_store,
    cross_layer_marks,
    merge_recalls,
    parse_stores,
    unpack_export,
)
from soul_runtime.models.base import LanguageModel
from soul_runtime.models.choice import make_model
from soul_runtime.records import LAYERS, MemoryWrite, RecalledItem, Store, WriteRequest, to_plain

from . import raycalls
from .introspection import ActorInfo
from .layer_shard import ShardCalls, StoreLocator, soul_dir
from .metrics import Metrics
from .settings import RuntimeConfig


class RemoteMemory:
    """The loop's MemoryPort over store actors: the three layers in parallel, cross-layer marks on write,
    each call batched with other souls' calls to the same shard (:class:`ShardCalls`)."""

    def __init__(self, soul_id: str, calls: ShardCalls) -> None:
        self.soul_id = soul_id
        self.calls = calls

    def recall(self, query: str, k: int = 10, *, now: Any, stores: Any = None,
               task_class: str | None = None) -> list[RecalledItem]:
        tickets = [self.calls.start(s.value, self.soul_id, "recall_batch",
                                    (self.soul_id, query, k, float(now), task_class)) for s in parse_stores(stores)]
        return merge_recalls([t.result()[0] for t in tickets], k)

    def write_many(self, reqs: list[WriteRequest]) -> list[list[MemoryWrite]]:
        """The layers that have something to write get a call (semantic and procedural at once, then episodic
        with the semantic layer's marks); the others answer here without a call (``answer_without_store``)."""
        plain = [to_plain(r) for r in reqs]

        def start(layer: Store, marks: dict[str, list[str]] | None = None) -> Any:
            answer = answer_without_store(layer, reqs, marks)
            if answer is not None:
                return answer
            return self.calls.start(layer.value, self.soul_id, "apply_batch", (self.soul_id, plain, marks))

        def result(pending: Any) -> list[list[MemoryWrite]]:
            return pending if isinstance(pending, list) else pending.result()[0]

        sem_p, proc_p = start(Store.SEMANTIC), start(Store.PROCEDURAL)
        sem = result(sem_p)
        epi = result(start(Store.EPISODIC, cross_layer_marks(w for ws in sem for w in ws)))
        proc = result(proc_p)
        return [e + s + p for e, s, p in zip(epi, sem, proc, strict=True)]


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
    last_used: float = field(default_factory=time.monotonic)


class SoulHost(ActorInfo):
    def __init__(self, name: str, config: dict[str, Any], model: LanguageModel | None = None) -> None:
        self.name = name
        self.cfg = RuntimeConfig.from_dict(config)
        self.model = model or make_model(self.cfg.model)
        self.stores = StoreLocator(self.cfg)
        self.calls = ShardCalls(self.stores)
        self.active: OrderedDict[str, _Activation] = OrderedDict()
        self.guard = threading.Lock()
        self.metrics = Metrics.create()

    # ---- activation ------------------------------------------------------------------
    def _activate(self, soul_id: str) -> _Activation:
        """The soul's activation, opening it if need be. Opening (files, recovery) happens outside the host's
        lock, so a cold soul never stalls the other souls of the host; its own callers wait for it."""
        with self.guard:
            act = self.active.get(soul_id)
            opener = act is None
            if act is None:
                act = self.active[soul_id] = _Activation(None)
            else:
                self.active.move_to_end(soul_id)
                act.last_used = time.monotonic()
        if not opener:
            act.ready.wait()
            if act.soul is None:  # the opener failed: try again from scratch
                return self._activate(soul_id)
            return act
        try:
            act.soul = Soul(soul_id, soul_dir(self.cfg.data_dir, soul_id), memory=RemoteMemory(soul_id, self.calls),
                            model=self.model, config=self.cfg.soul, on_commit=self.metrics.model_usage)
        except BaseException:
            with self.guard:
                if self.active.get(soul_id) is act:
                    del self.active[soul_id]
            raise
        finally:
            act.ready.set()
        self.metrics.activation()
        self._evict()
        return act

    @contextmanager
    def _hold(self, soul_id: str) -> Iterator[_Activation]:
        """The soul's activation with its lock held (one turn at a time); if it was passivated between
        activation and lock, it is activated again."""
        while True:
            act = self._activate(soul_id)
            with act.lock:
                with self.guard:
                    current = self.active.get(soul_id) is act
                if current:
                    yield act
                    return

    def _evict(self) -> int:
        """Passivate souls beyond capacity (least recently used first) and idle ones; the files close outside
        the host's lock. Souls in a turn are skipped."""
        now = time.monotonic()
        victims: list[_Activation] = []
        with self.guard:
            over = len(self.active) - self.cfg.host_capacity
            for sid in list(self.active):
                act = self.active[sid]
                idle = now - act.last_used > self.cfg.idle_passivate_s
                if (idle or over > 0) and act.soul is not None and not act.soul.busy and act.lock.acquire(blocking=False):
                    del self.active[sid]
                    victims.append(act)
                    over -= 1
        for act in victims:
            try:
                act.live.close()
                self.metrics.passivation()
            finally:
                act.lock.release()
        return len(victims)

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
            act.live.close()
            self.metrics.passivation()
            return True

    def passivate_idle(self) -> int:
        return self._evict()

    def active_souls(self) -> list[str]:
        with self.guard:
            return list(self.active)

    # ---- turns -------------------------------------------------------------------------
    def run(self, soul_id: str, op: str, seq: int, request_id: str, payload: dict[str, Any]) -> TurnResult:
        t0 = time.perf_counter()
        with self._hold(soul_id) as act:
            act.last_used = time.monotonic()
            if op == "turn":
                res = act.live.turn(payload["text"], user=payload.get("user"), at=payload.get("at"),
                                    request_id=request_id, seq=seq, wait_writes=payload.get("wait_writes", True))
            elif op == "observe":
                res = act.live.observe(payload["messages"], at=payload.get("at"), session=payload.get("session"),
                                       request_id=request_id, seq=seq)
            else:
                raise InvalidInput(f"unknown operation {op!r}")
        self.metrics.turn(op, time.perf_counter() - t0)
        return res

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

    def forget(self, soul_id: str) -> dict[str, int]:
        """Erase a soul's memory for good: all three layers, its buffer and traces."""
        with self._hold(soul_id) as act:
            act.live.settle()  # the last turn's memory work lands first, then everything goes
            refs = {s.value: raycalls.call(self.stores.handle(s.value, soul_id), "forget", soul_id) for s in LAYERS}
            out = {k: int(v) for k, v in zip(refs, raycalls.get(list(refs.values())), strict=True)}
            out["traces"] = act.live.state.count()
            act.live.state.wipe()
            return out

    def import_(self, soul_id: str, blob: bytes) -> None:
        data = unpack_export(blob)
        with self._hold(soul_id) as act:  # all layers are checked first, so a refused import changes nothing
            act.live.settle()
            empty = raycalls.get([raycalls.call(self.stores.handle(s.value, soul_id), "read", soul_id, "is_empty")
                                  for s in LAYERS])
            if not all(empty):
                raise InvalidInput(f"import needs an empty soul: {soul_id} already has memories")
            refs = [raycalls.call(self.stores.handle(s.value, soul_id), "import_", soul_id, data[s.value])
                    for s in LAYERS]
            raycalls.get(refs)

    def ping(self) -> str:
        return self.name

