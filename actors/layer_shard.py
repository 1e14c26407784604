"""Store actors: one layer's stores for the souls of one shard (plain class; made remote in runtime.py).

Each shard keeps an LRU of open per-soul stores; a soul's files live in
``DATA_DIR/souls/SOUL_ID/``. Calls are idempotent (writes are keyed by turn), so
Ray may retry them after a restart.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from soul_runtime.config import MemoryConfig
from soul_runtime.embedding.base import default_embedder
from soul_runtime.errors import NotFound
from soul_runtime.memory.episodic import EpisodicStore
from soul_runtime.memory.procedural import ProceduralStore
from soul_runtime.memory.semantic import SemanticStore
from soul_runtime.records import Store, request_from_plain
from soul_runtime.text import check_id

from . import raycalls
from .introspection import ActorInfo
from .metrics import Metrics
from .placement import store_of
from .settings import RuntimeConfig

LayerStore = EpisodicStore | SemanticStore | ProceduralStore


def soul_dir(data_dir: str, soul_id: str) -> Path:
    return Path(data_dir) / "souls" / check_id(soul_id, what="soul id")


class LayerShard(ActorInfo):
    """The stores of one layer for the souls hashed to this shard."""

    def __init__(self, layer: str, data_dir: str, memory_config: dict[str, Any], capacity: int = 256) -> None:
        self.layer = Store(layer)
        self.data_dir = data_dir
        self.cfg = MemoryConfig(**memory_config)
        self.capacity = capacity
        self.open: OrderedDict[str, LayerStore] = OrderedDict()
        self.embedder = default_embedder() if self.layer is Store.EPISODIC else None
        self.metrics = Metrics.create()

    def _store(self, soul_id: str) -> Any:
        st = self.open.get(soul_id)
        if st is not None:
            self.open.move_to_end(soul_id)
            return st
        d = soul_dir(self.data_dir, soul_id)
        if self.layer is Store.EPISODIC:
            assert self.embedder is not None
            st = EpisodicStore(d, self.embedder, self.cfg)
        elif self.layer is Store.SEMANTIC:
            st = SemanticStore(d, self.cfg)
        else:
            st = ProceduralStore(d, self.cfg)
        self.open[soul_id] = st
        while len(self.open) > self.capacity:
            _, old = self.open.popitem(last=False)
            old.close()
        return st

    def ping(self) -> str:
        return self.layer.value


    def recall(self, soul_id: str, query: str, k: int, now: float, task_class: str | None = None) -> list[Any]:
        t0 = time.perf_counter()
        st = self._store(soul_id)
        if self.layer is Store.EPISODIC:
            out = st.recall(query, k, now)
        elif self.layer is Store.SEMANTIC:
            out = st.recall(query, k)
        else:
            out = st.recall(query, k, task_class)
        self.metrics.recall(self.layer.value, time.perf_counter() - t0)
        return list(out)

    def apply(self, soul_id: str, reqs: list[dict[str, Any]], marks: dict[str, list[str]] | None = None
              ) -> list[list[Any]]:
        st = self._store(soul_id)
        requests = [request_from_plain(r) for r in reqs]
        if self.layer is Store.EPISODIC:
            out = st.apply_many(requests, **(marks or {}))
        else:
            out = st.apply_many(requests)
        for ws in out:
            for w in ws:
                self.metrics.write(w.store.value, w.op.value)
        return out

    def read(self, soul_id: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Read-only calls: facts, history, procedures, episodes, stats, task_classes."""
        if method not in {"facts", "history", "procedures", "episodes", "stats", "task_classes", "export",
                          "is_empty"}:
            raise AttributeError(method)
        return getattr(self._store(soul_id), method)(*args, **kwargs)

    def forget(self, soul_id: str) -> int:
        return int(self._store(soul_id).forget())

    def import_(self, soul_id: str, data: dict[str, Any]) -> None:
        self._store(soul_id).import_(data)

    def sweep(self, soul_id: str, now: float) -> dict[str, int]:
        st = self._store(soul_id)
        return dict(st.sweep(now)) if hasattr(st, "sweep") else {}

    def flush(self) -> int:
        n = 0
        for st in self.open.values():
            if isinstance(st, EpisodicStore):
                st.flush()
                n += 1
        return n

    def close_soul(self, soul_id: str) -> None:
        st = self.open.pop(soul_id, None)
        if st is not None:
            st.close()


class StoreLocator:
    """Handles of the store shards, by layer and soul."""

    def __init__(self, cfg: RuntimeConfig) -> None:
        self.cfg = cfg
        self._handles: dict[str, Any] = {}

    def handle(self, layer: str, soul_id: str) -> Any:
        name = store_of(soul_id, layer, self.cfg.shards(layer))
        h = self._handles.get(name)
        if h is None:
            h = raycalls.get_actor(name, self.cfg.namespace)
            if h is None:
                raise NotFound(f"store actor {name} is not running")
            self._handles[name] = h
        return h
