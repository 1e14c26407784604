"""The turn orchestrator: per soul, a sequence number and strict order; across souls, concurrency.

An asyncio actor (plain class here, made remote in runtime.py). For each soul it
holds a FIFO lock: turn n+1 is sent to the soul's host only after turn n was
acknowledged (its writes and buffer checkpoint durable). Souls do not wait for
each other. Its state is only a cache: after a restart it re-reads each soul's
last sequence number from the host, and the host deduplicates retried requests
by request id, so no turn is lost or applied twice.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from soul_runtime.errors import (
    ConfigError,
    InvalidInput,
    OutOfOrder,
    RuntimeUnavailable,
    SoulError,
    StaleOwner,
    TurnFailed,
)
from soul_runtime.owner_only import write_file
from soul_runtime.text import check_id

from . import raycalls
from .placement import rendezvous
from .settings import SIZE_KEYS, RuntimeConfig, claim_data_dir, layout, mismatch, recorded_layout, resolve

RETRIES = 40
SEQ_CACHE = 100_000
"""Souls whose next sequence number the orchestrator remembers; a forgotten one is numbered by its host."""


def host_name(i: int) -> str:
    return f"soul-host-{i}"


def dedicated_name(soul_id: str) -> str:
    return f"soul-dedicated-{soul_id}"


K = TypeVar("K")
V = TypeVar("V")


class BoundedLRU(OrderedDict[K, V]):
    """A dict that forgets its least recently written entries beyond ``maxsize``."""

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        self.maxsize = maxsize

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.maxsize:
            self.popitem(last=False)


class TurnOrchestrator:
    def __init__(self, config: dict[str, Any], host_class: Any = None) -> None:
        # automatic host and shard counts are decided here, once, where the data dir is: its recorded layout,
        # else the cluster's CPUs; every client and actor then takes them from this actor
        cfg = RuntimeConfig.from_dict(config)
        self.cfg = resolve(cfg, recorded_layout(cfg.data_dir), raycalls.cluster_cpus())
        self.config = self.cfg.to_dict()
        self.host_class = host_class
        self.locks: dict[str, list[Any]] = {}  # soul -> [lock, users]; an entry lives while it is used
        self.next_seq: BoundedLRU[str, int] = BoundedLRU(SEQ_CACHE)  # a cache: the host knows the truth
        self.registry = Path(self.cfg.data_dir) / "dedicated.json"
        self.dedicated: dict[str, str] = self._load_registry()
        self.hosts = [host_name(i) for i in range(self.cfg.hosts)]
        self._handles: dict[str, Any] = {}

    def _load_registry(self) -> dict[str, str]:
        try:
            return dict(json.loads(self.registry.read_text()))
        except (OSError, ValueError):
            return {}

    def _save_registry(self) -> None:
        write_file(self.registry, json.dumps(self.dedicated), durable=False)

    def host_of(self, soul_id: str) -> str:
        return self.dedicated.get(soul_id) or rendezvous(soul_id, self.hosts)

    def _handle(self, name: str) -> Any:
        h = self._handles.get(name)
        if h is None:
            h = raycalls.get_actor(name, self.cfg.namespace)
            if h is None:
                raise RuntimeUnavailable(f"soul host {name} is not running")
            self._handles[name] = h
        return h

    async def _call(self, name: str, method: str, *args: Any) -> Any:
        """Call a host, retrying while it is dead or restarting (the calls are idempotent)."""
        for attempt in range(RETRIES):
            try:
                return await raycalls.call(self._handle(name), method, *args)
            except raycalls.ACTOR_DIED:
                self._handles.pop(name, None)
                if attempt == RETRIES - 1:
                    raise RuntimeUnavailable(f"soul host {name} stays unavailable") from None
                await asyncio.sleep(min(2.0, 0.1 * (attempt + 1)))
            except raycalls.TASK_ERROR as e:
                raise raycalls.translate(e) from None
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def _lock(self, soul_id: str) -> AsyncIterator[None]:
        """The soul's FIFO lock (asyncio.Lock wakes waiters in order); dropped when nobody holds or awaits it,
        so the orchestrator's state stays bounded by the souls in flight, not the souls ever seen."""
        entry = self.locks.get(soul_id)
        if entry is None:
            entry = self.locks[soul_id] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self.locks[soul_id]

    async def submit(self, soul_id: str, op: str, payload: dict[str, Any], request_id: str) -> Any:
        """Run one turn (or observe) of a soul in order; returns its TurnResult."""
        check_id(soul_id, what="soul id")
        if not request_id:
            raise InvalidInput("request_id is required")
        async with self._lock(soul_id):
            name = self.host_of(soul_id)
            for _ in range(RETRIES):
                # None when not cached (a soul's first turn here, or forgotten by the LRU): the host, the soul's
                # one owner, gives it the next number itself; no extra call to ask it first
                seq = self.next_seq.get(soul_id)
                try:
                    result = await self._call(name, "run", soul_id, op, seq, request_id, payload)
                except OutOfOrder as e:  # another orchestrator incarnation got there first
                    self.next_seq[soul_id] = e.expected
                    continue
                except StaleOwner:  # the host's activation was superseded: it reactivates, same request id
                    self.next_seq.pop(soul_id, None)
                    continue
                except SoulError:
                    raise
                except Exception as e:
                    raise TurnFailed(f"turn of {soul_id} failed: {e.__class__.__name__}: {e}") from None
                self.next_seq[soul_id] = max(seq or 0, int(result.seq) + 1)
                return result
            raise TurnFailed(f"turn of {soul_id} could not be ordered after {RETRIES} attempts")

    async def exclusive(self, soul_id: str, method: str, *args: Any) -> Any:
        """A host call ordered with the soul's turns (forget, import)."""
        check_id(soul_id, what="soul id")
        async with self._lock(soul_id):
            return await self._call(self.host_of(soul_id), method, soul_id, *args)

    async def read(self, soul_id: str, method: str, *args: Any) -> Any:
        """A read from the soul's host (traces, model usage), ordered with the soul's turns."""
        if method not in ("trace", "traces", "last_seq", "usage"):
            raise InvalidInput(f"unknown read {method!r}")
        check_id(soul_id, what="soul id")
        async with self._lock(soul_id):  # ordered with turns, forget and dedicate: never on a stale host
            return await self._call(self.host_of(soul_id), method, soul_id, *args)

    # ---- hot souls ---------------------------------------------------------------------
    async def dedicate(self, soul_id: str) -> str:
        """Move a soul onto its own actor (capped by the ``soul_slot`` resource)."""
        check_id(soul_id, what="soul id")
        async with self._lock(soul_id):
            if soul_id in self.dedicated:
                return self.dedicated[soul_id]
            if len(self.dedicated) >= self.cfg.max_dedicated:
                raise InvalidInput(f"already {len(self.dedicated)} dedicated souls (max_dedicated)")
            await self._call(self.host_of(soul_id), "passivate", soul_id)
            name = dedicated_name(soul_id)
            cfg = {**self.config, "host_capacity": 1}
            raycalls.create(self.host_class, name, self.cfg.namespace, (name, cfg), resources={"soul_slot": 1},
                            num_cpus=0, max_restarts=-1, max_concurrency=2, lifetime="detached")
            try:
                await asyncio.wait_for(self._call(name, "ping"), timeout=60)
            except asyncio.TimeoutError:
                raise RuntimeUnavailable("no 'soul_slot' resource free for a dedicated soul actor") from None
            self.dedicated[soul_id] = name
            self._save_registry()
            return name

    async def undedicate(self, soul_id: str) -> bool:
        async with self._lock(soul_id):
            name = self.dedicated.get(soul_id)
            if name is None:
                return False
            await self._call(name, "passivate", soul_id)
            handle = self._handles.pop(name, None) or raycalls.get_actor(name, self.cfg.namespace)
            del self.dedicated[soul_id]
            self._save_registry()
            if handle is not None:
                raycalls.kill(handle)
            return True

    async def placement(self, soul_id: str) -> dict[str, Any]:
        if soul_id in self.dedicated:
            return {"host": self.dedicated[soul_id], "dedicated": True}
        return {"host": self.host_of(soul_id), "dedicated": False}

    async def souls(self) -> list[str]:
        root = Path(self.cfg.data_dir) / "souls"
        return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.exists() else []

    async def ping(self) -> str:
        return "ok"

    async def pid(self) -> int:
        return os.getpid()

    async def config_dict(self) -> dict[str, Any]:
        return self.config

    async def check_layout(self, client: dict[str, Any]) -> dict[str, Any]:
        """Refuse a client whose routing differs from this runtime's, or a data dir recorded with another
        layout (ConfigError); record the layout on first use. Returns this runtime's configuration (the
        client takes its host and shard counts from it)."""
        mine = RuntimeConfig.from_dict(self.config)
        asked = RuntimeConfig.from_dict(client)
        theirs = resolve(asked, {k: getattr(mine, k) for k in SIZE_KEYS}, 1)  # automatic counts: ours
        if theirs.data_dir != mine.data_dir:
            raise ConfigError(f"this Ray namespace {mine.namespace!r} already serves data_dir {mine.data_dir!r}; "
                              "connect with that data_dir or another namespace")
        err = mismatch(layout(mine), layout(theirs), f"namespace {mine.namespace!r}")
        if err is not None:
            raise err
        claim_data_dir(mine)
        return self.config


__all__ = ["TurnOrchestrator"]
