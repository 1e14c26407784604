"""The runtime's control actor: its layout, and which souls have a dedicated actor.

An asyncio actor (plain class here, made remote in runtime.py). It decides the host and shard counts once
(the data dir's recorded layout, else the cluster's CPUs), refuses a client with another layout, and moves a
hot soul onto its own actor and back (recorded in the data dir's ``dedicated.json``). Turns do not pass
through it: a client sends a soul's calls straight to the soul's owner, which orders them
(:mod:`actors.routing`), so no one actor carries every soul of the node.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from soul_runtime.errors import ConfigError, InvalidInput, RuntimeUnavailable
from soul_runtime.memory.soul_records import soul_ids
from soul_runtime.memory.sqlite_db import use_storage
from soul_runtime.models.choice import make_model
from soul_runtime.owner_only import write_file
from soul_runtime.text import check_id

from . import raycalls
from . import retry as retry_policy
from .handles import ActorHandles
from .placement import rendezvous
from .routing import REGISTRY, read_registry
from .settings import (
    SIZE_KEYS,
    RuntimeConfig,
    claim_data_dir,
    host_concurrency,
    layout,
    mismatch,
    recorded_layout,
    resolve,
)


def host_name(i: int) -> str:
    return f"soul-host-{i}"


def dedicated_name(soul_id: str) -> str:
    return f"soul-dedicated-{soul_id}"


class RuntimeController:
    """The runtime's control actor (see the module's doc)."""

    def __init__(self, config: dict[str, Any], host_class: Any = None) -> None:
        # automatic host and shard counts are decided here, once, where the data dir is: its recorded layout,
        # else the cluster's CPUs; every client and actor then takes them from this actor
        cfg = RuntimeConfig.from_dict(config)
        self.cfg = resolve(cfg, recorded_layout(cfg.data_dir), raycalls.cluster_cpus())
        self.config = self.cfg.to_dict()
        use_storage(self.cfg.storage)
        self.host_class = host_class
        self.registry = Path(self.cfg.data_dir) / REGISTRY
        self.dedicated: dict[str, str] = read_registry(self.cfg.data_dir)
        self._moving = asyncio.Lock()  # one dedicate or undedicate at a time
        self.hosts = [host_name(i) for i in range(self.cfg.hosts)]
        self.handles = ActorHandles(self.cfg.namespace)
        self._model_checked = False

    def _save_registry(self) -> None:
        write_file(self.registry, json.dumps(self.dedicated))  # durable: a restarted host routes by it

    async def _call(self, name: str, method: str, *args: Any) -> Any:
        """Call a host, retrying while it is dead or restarting (the calls are idempotent)."""
        retry = retry_policy.DEFAULT
        for attempt in range(retry.attempts):
            try:
                return await raycalls.call(self.handles.get(name), method, *args)
            except raycalls.ACTOR_DIED:
                self.handles.forget(name)
                if retry.last(attempt):
                    raise RuntimeUnavailable(f"soul host {name} stays unavailable") from None
                await asyncio.sleep(retry.pause(attempt))
            except raycalls.TASK_ERROR as e:
                raise raycalls.translate(e) from None
        raise AssertionError("unreachable")

    # ---- hot souls ---------------------------------------------------------------------
    async def dedicate(self, soul_id: str) -> str:
        """Move a soul onto its own actor (capped by the ``soul_slot`` resource): the actor is started, the
        move recorded, then the soul's host finishes the turn in progress, passivates the soul and from then
        on answers its calls with :class:`~actors.routing.Moved` naming the new actor."""
        check_id(soul_id, what="soul id")
        async with self._moving:
            if soul_id in self.dedicated:
                return self.dedicated[soul_id]
            if len(self.dedicated) >= self.cfg.max_dedicated:
                raise InvalidInput(f"already {len(self.dedicated)} dedicated souls (max_dedicated)")
            name = dedicated_name(soul_id)
            cfg = {**self.config, "host_capacity": 1}
            handle = raycalls.create(self.host_class, name, self.cfg.namespace, (name, cfg),
                                     resources={"soul_slot": 1}, num_cpus=0, max_restarts=-1,
                                     max_concurrency=host_concurrency(self.cfg),
                                     lifetime="detached")
            try:
                await asyncio.wait_for(self._call(name, "ping"), timeout=60)
            except asyncio.TimeoutError:
                self.handles.forget(name)
                raycalls.kill(handle)
                raise RuntimeUnavailable("no 'soul_slot' resource free for a dedicated soul actor") from None
            self.dedicated[soul_id] = name
            self._save_registry()  # before the host lets go: a restarted host reads it
            await self._call(rendezvous(soul_id, self.hosts), "move", soul_id, name)
            return name

    async def undedicate(self, soul_id: str) -> bool:
        async with self._moving:
            name = self.dedicated.get(soul_id)
            if name is None:
                return False
            home = rendezvous(soul_id, self.hosts)
            await self._call(name, "move", soul_id, home)  # its turn in progress ends; callers are sent home
            del self.dedicated[soul_id]
            self._save_registry()
            await self._call(home, "unmove", soul_id)
            handle = self.handles.forget(name) or raycalls.get_actor(name, self.cfg.namespace)
            if handle is not None:
                raycalls.kill(handle)
            return True

    async def dedicated_souls(self) -> dict[str, str]:
        """Soul id -> the actor serving it, for the souls that have their own (clients route by it)."""
        return dict(self.dedicated)

    async def placement(self, soul_id: str) -> dict[str, Any]:
        if soul_id in self.dedicated:
            return {"host": self.dedicated[soul_id], "dedicated": True}
        return {"host": rendezvous(soul_id, self.hosts), "dedicated": False}

    async def souls(self) -> list[str]:
        return soul_ids(self.cfg.data_dir)

    async def stop(self) -> int:
        """Stop (the lifecycle of :mod:`actors.introspection`): nothing runs beside its calls."""
        return 0

    async def ping(self) -> str:
        return "ok"

    async def pid(self) -> int:
        return os.getpid()

    async def check_layout(self, client: dict[str, Any]) -> dict[str, Any]:
        """Refuse a client whose routing or embedder differs from this runtime's, or a data dir recorded with
        another layout or embedder (ConfigError); record the layout on first use; make this runtime's model
        once, so a model that cannot be made is a ConfigError here rather than in every host. Returns this
        runtime's configuration (the client takes its host and shard counts, and its model, from it)."""
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
        if not self._model_checked:  # before a host makes it: a model that cannot be made is the client's error
            make_model(mine.model, args=mine.model_args)
            self._model_checked = True
        return self.config


__all__ = ["RuntimeController"]
