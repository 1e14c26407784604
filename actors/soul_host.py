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
from dataclasses import dataclass, field
from typing import Any

from soul_runtime.errors import InvalidInput
from soul_runtime.loop.soul import Soul, TurnResult
from soul_runtime.loop.trace import TurnTrace
from soul_runtime.memory.soul_memory import cross_layer_marks, merge_recalls, parse_stores, unpack_export
from soul_runtime.models.base import LanguageModel
from soul_runtime.models.choice import make_model
from soul_runtime.records import LAYERS, MemoryWrite, RecalledItem, WriteRequest, to_plain

from . import raycalls
from .introspection import ActorInfo
from .layer_shard import StoreLocator, soul_dir
from .metrics import Metrics
from .settings import RuntimeConfig


class RemoteMemory:
    """The loop's MemoryPort over store actors: parallel reads, cross-layer marks on write."""

    def __init__(self, soul_id: str, stores: StoreLocator) -> None:
        self.soul_id = soul_id
        self.stores = stores

    def recall(self, query: str, k: int = 10, *, now: Any, stores: Any = None,
               task_class: str | None = None) -> list[RecalledItem]:
        refs = [raycalls.call(self.stores.handle(s.value, self.soul_id), "recall", self.soul_id, query, k, float(now),
                              task_class) for s in parse_stores(stores)]
        return merge_recalls(raycalls.get(refs), k)

    def write_many(self, reqs: list[WriteRequest]) -> list[list[MemoryWrite]]:
        plain = [to_plain(r) for r in reqs]
        sem_ref = raycalls.call(self.stores.handle("semantic", self.soul_id), "apply", self.soul_id, plain)
        proc_ref = raycalls.call(self.stores.handle("procedural", self.soul_id), "apply", self.soul_id, plain)
        sem = raycalls.get(sem_ref)
        marks = cross_layer_marks(w for ws in sem for w in ws)
        epi = raycalls.get(raycalls.call(self.stores.handle("episodic", self.soul_id), "apply", self.soul_id, plain,
                                         marks))
        proc = raycalls.get(proc_ref)
        return [e + s + p for e, s, p in zip(epi, sem, proc, strict=True)]


@dataclass
class _Activation:
    soul: Soul
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)


class SoulHost(ActorInfo):
    def __init__(self, name: str, config: dict[str, Any], model: LanguageModel | None = None) -> None:
        self.name = name
        self.cfg = RuntimeConfig.from_dict(config)
        self.model = model or make_model(self.cfg.model)
        self.stores = StoreLocator(self.cfg)
        self.active: OrderedDict[str, _Activation] = OrderedDict()
        self.guard = threading.Lock()
        self.metrics = Metrics.create()

    # ---- activation ------------------------------------------------------------------
    def _activate(self, soul_id: str) -> _Activation:
        with self.guard:
            act = self.active.get(soul_id)
            if act is not None:
                self.active.move_to_end(soul_id)
                act.last_used = time.monotonic()
                return act
            soul = Soul(soul_id, soul_dir(self.cfg.data_dir, soul_id), memory=RemoteMemory(soul_id, self.stores),
                        model=self.model, config=self.cfg.soul)
            act = self.active[soul_id] = _Activation(soul)
            self.metrics.activation()
            self._evict_locked()
            return act

    def _evict_locked(self) -> None:
        now = time.monotonic()
        for sid in list(self.active):
            act = self.active[sid]
            over = len(self.active) > self.cfg.host_capacity
            idle = now - act.last_used > self.cfg.idle_passivate_s
            if (over or idle) and act.lock.acquire(blocking=False):
                try:
                    act.soul.close()
                    del self.active[sid]
                    self.metrics.passivation()
                finally:
                    act.lock.release()

    def passivate(self, soul_id: str) -> bool:
        with self.guard:
            act = self.active.get(soul_id)
        if act is None:
            return False
        with act.lock, self.guard:
            if self.active.get(soul_id) is act:
                act.soul.close()
                del self.active[soul_id]
                self.metrics.passivation()
                return True
        return False

    def passivate_idle(self) -> int:
        with self.guard:
            before = len(self.active)
            self._evict_locked()
            return before - len(self.active)

    def active_souls(self) -> list[str]:
        with self.guard:
            return list(self.active)

    # ---- turns -------------------------------------------------------------------------
    def run(self, soul_id: str, op: str, seq: int, request_id: str, payload: dict[str, Any]) -> TurnResult:
        t0 = time.perf_counter()
        act = self._activate(soul_id)
        with act.lock:
            act.last_used = time.monotonic()
            if op == "turn":
                res = act.soul.turn(payload["text"], user=payload.get("user"), at=payload.get("at"),
                                    request_id=request_id, seq=seq)
            elif op == "observe":
                res = act.soul.observe(payload["messages"], at=payload.get("at"), session=payload.get("session"),
                                       request_id=request_id, seq=seq)
            else:
                raise InvalidInput(f"unknown operation {op!r}")
        self.metrics.turn(op, time.perf_counter() - t0)
        return res

    def last_seq(self, soul_id: str) -> int:
        act = self._activate(soul_id)
        with act.lock:
            return act.soul.last_seq

    def trace(self, soul_id: str, turn_id: str) -> TurnTrace:
        return self._activate(soul_id).soul.trace(turn_id)

    def traces(self, soul_id: str, last: int) -> list[TurnTrace]:
        return self._activate(soul_id).soul.traces(last)

    def forget(self, soul_id: str) -> dict[str, int]:
        """Erase a soul's memory for good: all three layers, its buffer and traces."""
        act = self._activate(soul_id)
        with act.lock:
            refs = {s.value: raycalls.call(self.stores.handle(s.value, soul_id), "forget", soul_id) for s in LAYERS}
            out = {k: int(v) for k, v in zip(refs, raycalls.get(list(refs.values())), strict=True)}
            out["traces"] = act.soul.state.count()
            act.soul.state.wipe()
            return out

    def import_(self, soul_id: str, blob: bytes) -> None:
        data = unpack_export(blob)
        act = self._activate(soul_id)
        with act.lock:  # all layers are checked first, so a refused import changes nothing
            empty = raycalls.get([raycalls.call(self.stores.handle(s.value, soul_id), "read", soul_id, "is_empty")
                                  for s in LAYERS])
            if not all(empty):
                raise InvalidInput(f"import needs an empty soul: {soul_id} already has memories")
            refs = [raycalls.call(self.stores.handle(s.value, soul_id), "import_", soul_id, data[s.value])
                    for s in LAYERS]
            raycalls.get(refs)

    def ping(self) -> str:
        return self.name

