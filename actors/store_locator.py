"""Handles of the store shard actors, by layer and soul (light: no memory engine, for drivers too)."""

from __future__ import annotations

from typing import Any

from soul_runtime.errors import NotFound

from . import raycalls
from .placement import store_of
from .settings import RuntimeConfig


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
