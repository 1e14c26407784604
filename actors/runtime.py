"""The runtime a user connects to: actors started on demand, soul handles.

It creates the runtime's actors (the controller, the store shards and the soul hosts; the controller creates
dedicated soul actors) through :func:`actors.raycalls.create`, the one place plain classes are made remote, and is
the module the public API (``soul_runtime.connect``) lands in.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from soul_runtime import soul_args, telemetry
from soul_runtime.config import SoulConfig
from soul_runtime.errors import ConfigError
from soul_runtime.memory.postgres_db import is_postgres
from soul_runtime.owner_only import make_dir, warn_if_loose
from soul_runtime.plugins import settings_env
from soul_runtime.records import (
    LAYERS,
    Digest,
    Episode,
    Fact,
    FactVersion,
    Procedure,
    RecalledItem,
    TurnResult,
    TurnTrace,
)
from soul_runtime.soul_api import AsyncSoulApi, Plan, SoulApi

if TYPE_CHECKING:
    from soul_runtime.soul_api import RayRuntimeApi
from soul_runtime.text import check_id

from . import client_session, raycalls, shard_reads
from . import retry as retry_policy
from .controller import host_name
from .fair_pool import tenant_of
from .placement import store_name
from .quotas import Quotas
from .routing import Routed, Router
from .settings import RuntimeConfig, default_data_dir, host_concurrency
from .shard_client import StoreLocator
from .shard_reads import ShardRead
from .tenant_limits import TenantLimits
from .tenant_usage import UsageBook, usage_book

CONTROLLER = "soul-controller"
T = TypeVar("T")
LIMITED_OPS = frozenset({"turn", "observe", "forget_where"})
"""The calls a tenant's limits count (:mod:`actors.quotas`): those that write; reads are never limited."""


class Runtime:
    """A connection to soul-runtime on Ray. Use as a context manager, or call :meth:`close`."""

    def __init__(self, cfg: RuntimeConfig, *, started_ray: bool, detached: bool, limits: bool = True) -> None:
        self.cfg = cfg
        self.started_ray = started_ray
        self.detached = detached
        self._start_actors()  # sets self.cfg to the runtime's resolved configuration
        self.quotas = Quotas(self.cfg.data_dir, TenantLimits(self.cfg.data_dir, self.cfg.storage),
                             storage=self.cfg.storage, book=_refusals_book(self.cfg)) if limits else None
        """The tenants' limits on this process's turns (``TENANT:soul`` ids; the key table's, as the service's)."""
        self.stores = StoreLocator(self.cfg)
        dedicated = raycalls.get(raycalls.call(self.controller, "dedicated_souls"), timeout=120)
        self.router = Router([host_name(i) for i in range(self.cfg.hosts)], self.cfg.namespace, dedicated,
                             channels=self.cfg.local_channels, busy_wait_s=self.cfg.busy_wait_s,
                             retry=replace(retry_policy.DEFAULT, lease_wait_s=self.cfg.lease_wait_s))

    # ---- actors ----------------------------------------------------------------------
    def _opts(self, **kw: Any) -> dict[str, Any]:
        base: dict[str, Any] = {"max_restarts": -1, "num_cpus": 0, "scheduling_strategy": "SPREAD"}
        if self.detached:
            base["lifetime"] = "detached"
        base.update(kw)
        return base

    def _start_actors(self) -> None:
        ns, conf = self.cfg.namespace, self.cfg.to_dict()
        make_dir(self.cfg.data_dir)  # owner-only (0700) when created here
        if self.detached and CONTROLLER in raycalls.named_actors(ns):
            found = raycalls.get_actor(CONTROLLER, ns)
            if found is not None:  # a runtime is up: the same routing, or ConfigError
                self.cfg = RuntimeConfig.from_dict(raycalls.get(raycalls.call(found, "check_layout", conf),
                                                                timeout=120))
                self._note_model(conf)
                if set(self._names()) <= raycalls.named_actors(ns):  # all its actors too: attach (no class
                    self.controller = found  # export, no engine imports, no pings; store handles are looked
                    self._keep = [self.controller]  # up when first used)
                    return
        from .controller import RuntimeController
        from .layer_shard import LayerShard
        from .soul_host import SoulHost
        controller = raycalls.create(RuntimeController, CONTROLLER, ns, (conf, SoulHost),
                                       **self._opts(max_task_retries=-1, max_concurrency=1000))
        # concurrent first connects: everyone gets the winner's actor
        self.controller = raycalls.confirm_created({CONTROLLER: controller}, ns, timeout=300)[CONTROLLER]
        # before any other actor exists: the same routing as the running actors and as the data dir was
        # created with, or ConfigError (two processes must never open one soul's files); automatic host and
        # shard counts come back resolved (the data dir's recorded layout, else the cluster's CPUs)
        self.cfg = cfg = RuntimeConfig.from_dict(raycalls.get(raycalls.call(self.controller, "check_layout",
                                                                            conf), timeout=120))
        self._note_model(conf)
        conf = cfg.to_dict()
        named: dict[str, Any] = {}
        for layer in ("episodic", "semantic", "procedural"):
            for i in range(cfg.shards(layer)):
                name = store_name(layer, i)
                named[name] = raycalls.create(LayerShard, name, ns, (layer, cfg.data_dir, conf["soul"]["memory"],
                                                                     cfg.store_capacity, cfg.embedder, i,
                                                                     cfg.shards(layer), cfg.retention_every_s,
                                                                     cfg.storage, cfg.store_capacity_mb * 2**20,
                                                                     cfg.shard_threads if cfg.local_channels else 0,
                                                                     cfg.embedder_args),
                                              **self._opts(max_task_retries=-1, max_concurrency=cfg.shard_threads))
        for i in range(cfg.hosts):
            named[host_name(i)] = raycalls.create(SoulHost, host_name(i), ns, (host_name(i), conf),
                                                  **self._opts(max_concurrency=host_concurrency(cfg), max_task_retries=-1))
        named = raycalls.confirm_created(named, ns, timeout=300)
        # keep the handles: a non-detached actor dies when its last handle goes away
        self._keep = list(named.values()) + [self.controller]

    def _note_model(self, asked: dict[str, Any]) -> None:
        """The model is the running runtime's (whoever started it chose it): say so when this client asked for
        another one."""
        if (asked.get("model"), asked.get("model_args")) != (self.cfg.model, self.cfg.model_args):
            import logging
            logging.getLogger(__name__).warning(
                "namespace %r is served with model %r (asked: %r); the model is the one the runtime was started "
                "with", self.cfg.namespace, self.cfg.model, asked.get("model"))

    def _names(self) -> list[str]:
        cfg = self.cfg
        return [store_name(layer, i) for layer in ("episodic", "semantic", "procedural")
                for i in range(cfg.shards(layer))] + [host_name(i) for i in range(cfg.hosts)] + [CONTROLLER]

    def store(self, layer: str, soul_id: str) -> Any:
        return self.stores.handle(layer, soul_id)

    # ---- public ----------------------------------------------------------------------
    def soul(self, soul_id: str) -> SoulHandle:
        return SoulHandle(self, check_id(soul_id, what="soul id"))

    def async_soul(self, soul_id: str) -> AsyncSoulHandle:
        return AsyncSoulHandle(self, check_id(soul_id, what="soul id"))

    def dedicate(self, soul_id: str) -> str:
        """Give a hot soul its own actor (needs free ``soul_slot`` resources)."""
        return str(raycalls.get(raycalls.call(self.controller, "dedicate", check_id(soul_id)), timeout=120))

    def undedicate(self, soul_id: str) -> bool:
        return bool(raycalls.get(raycalls.call(self.controller, "undedicate", check_id(soul_id)), timeout=120))

    def placement(self, soul_id: str) -> dict[str, Any]:
        return dict(raycalls.get(raycalls.call(self.controller, "placement", check_id(soul_id))))

    def souls(self) -> list[str]:
        """Ids of the souls with data in the runtime's data dir (as the cluster sees it)."""
        return list(raycalls.get(raycalls.call(self.controller, "souls"), timeout=60))

    def stats(self) -> dict[str, Any]:
        hosts = [raycalls.get_actor(host_name(i), self.cfg.namespace) for i in range(self.cfg.hosts)]
        active = raycalls.get([raycalls.call(h, "active_souls") for h in hosts if h is not None])
        return {"souls": len(self.souls()), "active": sum(len(a) for a in active), "hosts": self.cfg.hosts,
                "shards": {layer: self.cfg.shards(layer) for layer in ("episodic", "semantic", "procedural")},
                "data_dir": self.cfg.data_dir, "namespace": self.cfg.namespace}

    def shutdown_actors(self) -> None:
        """Stop this runtime's actors and kill them (for detached actors on a cluster): each one's stop step
        runs first (:mod:`actors.introspection`) — the dedicated soul actors and hosts (their souls' last memory
        work reaches the shards), then the shards (their open stores close), then the controller."""
        names = self._names()
        dedicated = list(raycalls.get(raycalls.call(self.controller, "dedicated_souls"), timeout=60).values())
        hosts = dedicated + [n for n in names if n.startswith("soul-host")]
        shards = [n for n in names if n.startswith("soul-store")]
        for group in (hosts, shards, [CONTROLLER]):
            handles = [h for h in (raycalls.get_actor(n, self.cfg.namespace) for n in group) if h is not None]
            raycalls.get([raycalls.call(h, "stop") for h in handles], timeout=120)
        for name in dedicated + names:
            h = raycalls.get_actor(name, self.cfg.namespace)
            if h is not None:
                raycalls.kill(h)

    def close(self, *, flush: bool = True) -> None:
        """Disconnect. ``flush``: have the episodic shards save their vector indices first (a client of long-lived
        actors, such as one CLI command on the local runtime, leaves that to ``shutdown_actors``)."""
        if not flush:
            if self.started_ray:
                raycalls.shutdown()
            return
        try:  # save the vector indices now rather than rebuilding them on the next start
            shards = [raycalls.get_actor(store_name("episodic", i), self.cfg.namespace)
                      for i in range(self.cfg.episodic_shards)]
            raycalls.get([raycalls.call(h, "flush") for h in shards if h is not None], timeout=30)
        except Exception:  # closing must not fail because an actor is gone
            pass
        if self.started_ray:
            raycalls.shutdown()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Plans:
    """The soul's calls over Ray: to the actor that holds the soul (ordered with its other calls, see
    actors/routing.py) or straight to the store shards (reads, see actors/shard_reads.py)."""

    def __init__(self, rt: Runtime, soul_id: str) -> None:
        self.rt = rt
        self.soul_id = soul_id

    def shard(self, read: ShardRead) -> Any:
        return self.rt.store(read.layer, read.soul_id)

    def _owner(self, method: str, *args: Any) -> Routed:
        return Routed(self.soul_id, method, args)

    def turn(self, text: str, user: str | None, at: Any, request_id: str | None, wait_writes: bool
             ) -> Plan[TurnResult]:
        payload = soul_args.turn(text, user, at, wait_writes)
        return Plan(self._owner("run", "turn", None, soul_args.request_id(request_id), payload), _same)

    def observe(self, messages: Sequence[dict[str, Any]], at: Any, session: str | None,
                request_id: str | None) -> Plan[TurnResult]:
        payload = soul_args.observe(messages, at, session)
        return Plan(self._owner("run", "observe", None, soul_args.request_id(request_id), payload), _same)

    def recall(self, query: str, k: int, at: Any, stores: Iterable[str] | None) -> Plan[list[RecalledItem]]:
        query, k, when, layers = soul_args.recall(query, k, at, stores)
        now = soul_args.now(when)
        from soul_runtime.memory.soul_memory import merge_recalls
        refs = [ShardRead(s.value, self.soul_id, "read_recall", (self.soul_id, query, k, now))
                for s in (LAYERS if layers is None else layers)]
        return Plan(refs, lambda lists: merge_recalls(lists, k))

    def _read(self, layer: str, method: str, *args: Any, **kw: Any) -> ShardRead:
        return ShardRead(layer, self.soul_id, "read", (self.soul_id, method, *args), kw)

    def facts(self, entity: str | None) -> Plan[list[Fact]]:
        return Plan(self._read("semantic", "facts", entity), list)

    def fact_history(self, entity: str, attribute: str) -> Plan[list[FactVersion]]:
        return Plan(self._read("semantic", "history", *soul_args.fact_history(entity, attribute)), list)

    def procedures(self, task_class: str | None) -> Plan[list[Procedure]]:
        return Plan(self._read("procedural", "procedures", task_class), list)

    def episodes(self, since: Any, until: Any, session: str | None, sessions_ago: int | None) -> Plan[list[Episode]]:
        return Plan(self._read("episodic", "episodes", **soul_args.episodes(since, until, session, sessions_ago)),
                    list)

    def digests(self) -> Plan[list[Digest]]:
        return Plan(self._read("episodic", "current_digests"), list)

    def stats(self) -> Plan[dict[str, Any]]:
        refs = [self._read(s.value, "stats") for s in LAYERS] + [self._owner("usage")]

        def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for p in parts[:-1]:
                out.update(p)
            out["model_usage"] = parts[-1]
            return out
        return Plan(refs, merge)

    def export(self) -> Plan[bytes]:
        refs = [self._read(s.value, "export") for s in LAYERS]

        from soul_runtime.memory.export import pack_export

        def pack(parts: list[dict[str, Any]]) -> bytes:
            return pack_export(dict(zip(LAYERS, parts, strict=True)))
        return Plan(refs, pack)

    def import_(self, blob: bytes) -> Plan[None]:
        return Plan(self._owner("import_", soul_args.import_blob(blob)), lambda r: None)

    def forget(self, stores: Iterable[str] | None) -> Plan[dict[str, int]]:
        layers = soul_args.stores(stores)
        return Plan(self._owner("forget", None if layers is None else [s.value for s in layers]), dict)

    def forget_where(self, ids: Iterable[str] | None, query: str | None, request_id: str | None
                     ) -> Plan[TurnResult]:
        ids_, phrase = soul_args.forget_where(ids, query)
        payload = {"ids": ids_, "query": phrase, "at": soul_args.now(None)}
        return Plan(self._owner("run", "forget_where", None, soul_args.request_id(request_id), payload), _same)

    def trace(self, turn_id: str) -> Plan[TurnTrace]:
        return Plan(self._owner("trace", turn_id), _same)

    def traces(self, last: int) -> Plan[list[TurnTrace]]:
        return Plan(self._owner("traces", soul_args.traces(last)), list)


def _same(answer: Any) -> Any:
    return answer


def _traced(ref: Routed) -> tuple[Routed, Any]:
    """A call of the soul's order (turn, observe, forget_where) as a span of this process (``soul OP``, a child of
    the current context) whose context goes to the host in the call's payload; the call as it is, and no span,
    when traces are off."""
    if ref.method != "run" or telemetry.tracer() is None:
        return ref, None
    op, seq, rid, payload = ref.args
    span = telemetry.start(f"soul {op}", kind="client", attributes={"soul.id": ref.soul_id, "soul.op": op,
                                                                    "soul.request_id": rid})
    carried = telemetry.carrier(telemetry.context_with(span))
    return Routed(ref.soul_id, ref.method, (op, seq, rid, {**payload, telemetry.CARRIER_KEY: carried})), span


def _refusals_book(cfg: RuntimeConfig) -> UsageBook:
    """Where this process counts the turns it refused over a tenant's limit (``soul tenants usage``): beside the
    hosts' books, when this machine sees them (a PostgreSQL storage, or the data dir here); the book is written
    only once there is a refusal in it."""
    if is_postgres(cfg.storage) or Path(cfg.data_dir).is_dir():
        return usage_book(cfg.data_dir, cfg.storage, f"client-{socket.gethostname()}-{os.getpid()}", resume=False)
    return UsageBook(None)


def _limited(ref: Any) -> str:
    """The tenant whose limits a call counts against ("" for none: a read, a soul of no tenant)."""
    if isinstance(ref, Routed) and ref.method == "run" and ref.args and ref.args[0] in LIMITED_OPS:
        return tenant_of(ref.soul_id)
    return ""


class SoulHandle(SoulApi):
    """A soul on the runtime over Ray. Every method blocks until its answer is there (at most ``timeout``
    seconds).

    ``turn`` and ``observe`` are strictly ordered per soul; reads see every
    acknowledged turn's writes.
    """

    def __init__(self, rt: Runtime, soul_id: str, timeout: float | None = 600.0) -> None:
        self.id = soul_id
        self._p = plans = _Plans(rt, soul_id)
        self._shard = plans.shard
        self._router = rt.router
        self._quotas = rt.quotas
        self.timeout = timeout

    def _run(self, plan: Plan[T]) -> T:
        ref = plan.call
        tenant = _limited(ref) if self._quotas is not None else ""
        if tenant and self._quotas is not None:
            with self._quotas.turn_sync(tenant, self.id):  # over a limit: QuotaExceeded, nothing sent
                return self._send(plan)
        return self._send(plan)

    def _send(self, plan: Plan[T]) -> T:
        ref = plan.call
        if isinstance(ref, Routed):
            ref, span = _traced(ref)
            try:
                answer = self._router.run(ref, self.timeout)
            except BaseException as e:
                telemetry.end(span, error=e)
                raise
            telemetry.end(span)
            return plan.then(answer)
        reads = [r for r in (ref if isinstance(ref, list) else [ref]) if isinstance(r, ShardRead)]
        sent = shard_reads.send_reads(reads, self._shard)  # store reads in flight while the owner's call runs
        if isinstance(ref, list):
            try:
                owner = {i: self._router.run(r, self.timeout) for i, r in enumerate(ref) if isinstance(r, Routed)}
            except Exception:
                shard_reads.drain(sent, self.timeout)
                raise
            got = iter(shard_reads.run_reads(reads, self._shard, self._router.retry, self.timeout, sent))
            return plan.then([owner[i] if i in owner else next(got) for i in range(len(ref))])
        return plan.then(shard_reads.run_reads(reads, self._shard, self._router.retry, self.timeout, sent)[0])


class AsyncSoulHandle(AsyncSoulApi):
    """The same API as :class:`SoulHandle`, as coroutines (for asyncio servers)."""

    def __init__(self, rt: Runtime, soul_id: str) -> None:
        self.id = soul_id
        self._p = plans = _Plans(rt, soul_id)
        self._shard = plans.shard
        self._router = rt.router
        self._quotas = rt.quotas

    def _await(self, ref: Any) -> Any:
        if isinstance(ref, ShardRead):
            return shard_reads.run_read_async(ref, self._shard, self._router.retry)
        if not isinstance(ref, Routed):
            return ref
        ref, span = _traced(ref)
        return self._router.run_async(ref) if span is None else self._spanned(ref, span)

    async def _spanned(self, ref: Routed, span: Any) -> Any:
        try:
            answer = await self._router.run_async(ref)
        except BaseException as e:
            telemetry.end(span, error=e)
            raise
        telemetry.end(span)
        return answer

    async def _run(self, plan: Plan[T]) -> T:
        tenant = _limited(plan.call) if self._quotas is not None else ""
        if tenant and self._quotas is not None:
            async with self._quotas.turn(tenant, self.id):  # over a limit: QuotaExceeded, nothing sent
                return await self._send(plan)
        return await self._send(plan)

    async def _send(self, plan: Plan[T]) -> T:
        import asyncio
        ref = plan.call
        try:
            if isinstance(ref, list):
                return plan.then(list(await asyncio.gather(*(self._await(r) for r in ref))))
            return plan.then(await self._await(ref))
        except Exception as e:
            raise raycalls.translate(e) from None


PROCESS_ENV = {"MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "2")}
"""Set in every process of the runtime: glibc gives each thread that allocates an arena of its own, and each
keeps the memory it freed; a store shard's threads (store calls, embedding runs) held about 100 MiB more
resident with the default (8 per core) than with two, at the same speed."""


def connect(address: str | None = None, *, data_dir: str | os.PathLike[str] | None = None, namespace: str = "souls",
            config: RuntimeConfig | None = None, soul_config: SoulConfig | None = None,
            connect_attempts: int = client_session.CLIENT_ATTEMPTS, limits: bool = True, **options: Any) -> Runtime:
    """Connect to soul-runtime.

    ``address``: ``None`` starts (or joins, in this process) a local Ray — the
    embedded default; ``"auto"`` joins a running cluster from one of its nodes;
    ``"ray://host:port"`` connects over Ray Client. ``options`` are
    :class:`RuntimeConfig` fields (``hosts``, ``episodic_shards`` …); ``model``, ``embedder`` and ``storage``
    default to ``SOUL_MODEL`` / ``SOUL_EMBEDDER`` / ``SOUL_STORAGE`` when set; the first two may name the user's
    own (``package.module:attr``, see docs/models.md). The model and embedder settings in the environment (:func:`soul_runtime.plugins.settings_env`)
    reach every actor.
    ``connect_attempts``: Ray Client sessions tried when the session is lost before the connect
    finished - the head's session server died at start (a known Ray 2.60 failure) or the session's
    channel dropped while the actors were being found - each retry logged at warning with its cause;
    never an AuthError, never after a turn was submitted; 1 disables the retry. A session lost while
    connecting is noticed at once (not after Ray's 30 s reconnect wait), and a session the head is slow to
    open is reported at warning every 10 s of the wait.
    ``limits``: a turn, observe or forget of a tenant's soul (``TENANT:soul``) from this process is refused with
    QuotaExceeded, before it is sent, when the tenant is over a limit the key table sets for it
    (``soul tenants set``; counted by this process, as by a service replica); False leaves limiting to a caller
    that does its own (the HTTP service).
    """
    if not isinstance(connect_attempts, int) or isinstance(connect_attempts, bool) or not 1 <= connect_attempts <= 10:
        raise ConfigError(f"connect_attempts must be an int in 1..10, got {connect_attempts!r}")
    if config is None:
        kw: dict[str, Any] = dict(options)
        for key, var in (("model", "SOUL_MODEL"), ("embedder", "SOUL_EMBEDDER"), ("storage", "SOUL_STORAGE")):
            if key not in kw and os.environ.get(var, "").strip():
                kw[key] = os.environ[var].strip()
        if soul_config is not None:
            kw["soul"] = soul_config
        config = RuntimeConfig(data_dir=str(Path(data_dir or default_data_dir()).expanduser().resolve())
                               if address in (None, "auto") else str(data_dir or default_data_dir()),
                               namespace=namespace, **kw)
    if address is not None and not isinstance(address, str):
        raise ConfigError("address must be None, 'auto' or 'ray://host:port'")
    if isinstance(address, str) and address != "auto" and not address.startswith("ray://") and ":" not in address:
        raise ConfigError(f"address {address!r} is not 'auto', 'ray://host:port' or 'host:port'")
    if address is None or address == "auto":  # the data dir is on this machine: say if others can read it
        warn_if_loose(config.data_dir)
    env = {**PROCESS_ENV, **settings_env()}  # what the models and embedders read, and the allocator's arenas

    def attach(started: bool) -> Runtime:  # finds or creates the actors: idempotent, submits no turn
        try:
            return Runtime(config, started_ray=started, detached=address is not None, limits=limits)
        except BaseException:
            if started:
                raycalls.shutdown()
            raise
    return raycalls.start(address, attach, namespace=config.namespace, env_vars=env or None,
                          resources={"soul_slot": config.max_dedicated} if address is None else None,
                          client_attempts=connect_attempts)


if TYPE_CHECKING:
    def _as_promised(rt: Runtime) -> RayRuntimeApi:
        """Type-checked only: the Ray runtime is what ``soul_runtime.connect`` promises for a Ray address."""
        return rt

