"""Handles of named actors, looked up once and kept: one cache for every caller."""

from __future__ import annotations

import threading
from typing import Any

from soul_runtime.errors import RuntimeUnavailable

from . import raycalls


class ActorHandles:
    """Handles of the named actors of ``namespace``, by name. :meth:`get` raises :class:`RuntimeUnavailable`
    for an actor that is not running; :meth:`forget` drops a handle whose actor died or went."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._handles: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Any:
        h = self._handles.get(name)
        if h is None:
            h = raycalls.get_actor(name, self.namespace)
            if h is None:
                raise RuntimeUnavailable(f"actor {name} is not running")
            with self._lock:
                h = self._handles.setdefault(name, h)
        return h

    def forget(self, name: str) -> Any | None:
        """Drop the handle of ``name``; returns it (None when none was kept)."""
        with self._lock:
            return self._handles.pop(name, None)
