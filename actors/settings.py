"""The runtime's configuration: how many hosts and shards, where data lives, which model."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from soul_runtime.config import SoulConfig
from soul_runtime.embedding.choice import check_embedder_name, embedder_identity
from soul_runtime.errors import ConfigError
from soul_runtime.memory.postgres_db import redacted
from soul_runtime.models.choice import check_model_name
from soul_runtime.owner_only import make_dir, write_file
from soul_runtime.plugins import check_args
from soul_runtime.storage_modes import check_storage


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    data_dir: str
    namespace: str = "souls"
    hosts: int = 0
    """Soul-host actors; souls are placed on them by rendezvous hashing of the soul id. 0 (the default, for
    this and the three shard counts): what the data dir was first served with, else sized to the cluster's
    CPUs (:func:`sizes_for`); resolved once, by the controller, and recorded in ``runtime.json``."""
    episodic_shards: int = 0
    semantic_shards: int = 0
    procedural_shards: int = 0
    host_capacity: int = 0
    """Active souls per host (LRU); the rest are passivated to disk. Each holds 3 file descriptors while active;
    0 (the default): as many as the host process's open-file limit allows (:func:`fd_capacity`)."""
    host_capacity_mb: int = 1024
    """And the memory the active souls of a host may hold (session buffers, SQLite caches), in MiB; 0: no limit."""
    idle_passivate_s: float = 600.0
    idle_check_s: float = 30.0
    """How often a host passivates its idle souls by itself (0: only when another soul is activated)."""
    retention_every_s: float = 3600.0
    """How often each store shard runs the TTL sweep and archived-fact purge on its souls; it runs only when
    ``episodic_ttl_days`` or ``archived_fact_ttl_days`` is set (both off by default). 0: never."""
    store_capacity: int = 0
    """Open per-soul stores per shard (LRU): each holds up to 3 file descriptors while open; 0 (the default):
    as many as the shard process's open-file limit allows (:func:`fd_capacity`)."""
    store_capacity_mb: int = 512
    """And the memory the open stores of a shard may hold (vector indices, SQLite caches), in MiB; 0: no limit."""
    host_threads: int = 8
    """Threads per host for its souls' own work between waits: the code of a turn, the offline model, SQLite
    commits and fsyncs. A turn waiting for its model or its stores holds none (the host is an async actor)."""
    host_admission: int = 1000
    """Turns (observes, forgets) a host admits in progress at once; beyond it a call waits in the caller's
    router (up to ``busy_wait_s``) and then fails with RuntimeBusy. Each in-progress turn holds its context and
    the model's answer (tens of KiB), so the default keeps a host within a few hundred MiB of them."""
    host_steps: int = 0
    """Steps of its souls' work (the code between waits) a host runs at once on its ``host_threads``, handed out in
    weighted fair order of the tenants waiting for them (docs/service.md, "Fair scheduling"); 0 (the default): as
    many as ``host_threads``. Fewer leaves each running step more of the host process's interpreter lock: a
    tenant's step that goes first then also runs about as fast as it would alone."""
    model_slots: int = 0
    """Model calls a host has out at once, handed out in weighted fair order of the tenants waiting for them
    (docs/service.md, "Fair scheduling"); 0 (the default): the model's own ``max_concurrency`` (a remote model's,
    1024 by default). The offline model runs on the host's threads, which are handed out in the same order."""
    busy_wait_s: float = 30.0
    """How long a caller's router keeps trying a host that is at ``host_admission`` before RuntimeBusy."""
    lease_wait_s: float = 120.0
    """How long a caller keeps trying a call (a turn, or a read of a store shard) that failed because another
    process holds a lock on one of the soul's databases (a previous owner that was paused or cut off; on a network file system its lock lasts
    until its lease expires, 90 s on Linux's nfsd) before the StorageError is the caller's
    (:class:`actors.retry.RetryPolicy`)."""
    max_dedicated: int = 16
    """Dedicated actors for hot souls (custom resource ``soul_slot``)."""
    shard_threads: int = 8
    """Threads per store shard: different souls are served concurrently (one soul at a time each), and the
    episodic shard's embedder batches what they ask for together."""
    local_channels: bool = True
    """A host calls the store shards on its own machine over their local channels (a Unix socket each, see
    :mod:`actors.channel`) instead of through Ray: ≈ 20 µs per call instead of ≈ 1 ms. False: Ray only."""
    embedder: str = "default"
    """``default`` (MiniLM on onnxruntime), ``fast`` (hashing; for benchmarks and tests), a user's embedder as
    ``package.module:attr`` or an entry point of the group ``soul_runtime.embedders`` (docs/models.md). The data
    dir records its id and dimension: another embedder is refused."""
    embedder_args: dict[str, str] = field(default_factory=dict)
    """Keyword arguments of a user's embedder class or factory (str values)."""
    storage: str = "local"
    """``local``: SQLite in WAL mode (one machine). ``postgresql://…``: the souls' records in PostgreSQL, each
    node's data dir holding caches of them (a cluster of several nodes: docs/deploying.md). ``shared``: a
    rollback journal, for a data dir on network storage that actors on several nodes open."""
    model: str = "auto"
    """``auto`` (Anthropic when ANTHROPIC_API_KEY is set, else offline), ``offline``, ``anthropic``, ``openai`` (an
    OpenAI-compatible chat-completions server), or a user's model as ``package.module:attr`` or an entry point of
    the group ``soul_runtime.models`` (docs/models.md). Resolved in every host process."""
    model_args: dict[str, str] = field(default_factory=dict)
    """Keyword arguments of a user's model class or factory, or the settings of ``anthropic`` / ``openai``
    (``base_url``, ``api_key``, ``model``, ``memory_model``, ``timeout_s``, ``max_retries``), str values; they take
    precedence over the environment."""
    soul: SoulConfig = field(default_factory=SoulConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.data_dir, str) or not self.data_dir:
            raise ConfigError("data_dir must be a non-empty path")
        for name in SIZE_KEYS + ("host_capacity", "store_capacity", "host_threads", "host_admission", "shard_threads",
                                 "max_dedicated"):
            v = getattr(self, name)
            low = 0 if name in SIZE_KEYS + CAPACITY_KEYS else 1
            if not isinstance(v, int) or isinstance(v, bool) or v < low or v > 10_000:
                auto = " (0: sized to the cluster)" if name in SIZE_KEYS else \
                    " (0: sized to the open-file limit)" if low == 0 else ""
                raise ConfigError(f"{name} must be an int in {low}..10000{auto}, got {v!r}")
        for name, what in (("model_slots", "the model's max_concurrency"), ("host_steps", "host_threads")):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 100_000:
                raise ConfigError(f"{name} must be an int in 0..100000 (0: {what}), got {v!r}")
        for name in ("host_capacity_mb", "store_capacity_mb"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > 10_000_000:
                raise ConfigError(f"{name} must be an int in 0..10000000 (0: no limit), got {v!r}")
        v = self.idle_passivate_s
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"idle_passivate_s must be a finite number > 0, got {v!r}")
        for name in ("idle_check_s", "retention_every_s", "busy_wait_s", "lease_wait_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{name} must be a finite number >= 0 (0: off), got {v!r}")
        if not isinstance(self.namespace, str) or not self.namespace or len(self.namespace) > 100:
            raise ConfigError(f"namespace must be a non-empty string, got {self.namespace!r}")
        if not isinstance(self.soul, SoulConfig):
            raise ConfigError("soul must be a SoulConfig")
        if not isinstance(self.local_channels, bool):
            raise ConfigError(f"local_channels must be True or False, got {self.local_channels!r}")
        check_embedder_name(self.embedder)
        object.__setattr__(self, "embedder_args", check_args(self.embedder_args, "embedder_args"))
        check_storage(self.storage)
        check_model_name(self.model)
        object.__setattr__(self, "model_args", check_args(self.model_args, "model_args"))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["soul"] = self.soul.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RuntimeConfig:
        if not isinstance(d, dict):
            raise ConfigError("a runtime configuration must be a dict")
        d = dict(d)
        soul = SoulConfig.from_dict(d.pop("soul", {}))
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"unknown runtime configuration keys: {', '.join(sorted(unknown))}")
        return cls(soul=soul, **d)

    def shards(self, layer: str) -> int:
        return int(getattr(self, f"{layer}_shards"))


def sizes_for(cpus: int) -> dict[str, int]:
    """Host and shard counts for a cluster of ``cpus`` CPUs: a host and an episodic shard per CPU (at least
    two each, so one busy process never holds every soul), half as many semantic shards and a quarter as
    many procedural ones (their calls are lighter); capped so a large cluster is not flooded with actors."""
    c = max(1, int(cpus))
    return {"hosts": max(2, min(64, c)), "episodic_shards": max(2, min(64, c)),
            "semantic_shards": max(1, min(32, c // 2)), "procedural_shards": max(1, min(16, c // 4))}


FDS_PER_SOUL = 3
"""A soul's SQLite database with its ``-wal`` and ``-shm`` (a host's soul, or a shard's open store)."""
FD_RESERVE = 256
"""Descriptors kept for everything else a process opens (Ray's sockets, logs, libraries)."""
MAX_AUTO_CAPACITY = 4096


def fd_capacity(open_file_limit: int) -> int:
    """The automatic ``host_capacity`` / ``store_capacity`` of a process whose open-file limit is
    ``open_file_limit``: the souls whose files fit beside :data:`FD_RESERVE` other descriptors, at least 16 and
    at most :data:`MAX_AUTO_CAPACITY` (the byte limits ``host_capacity_mb`` / ``store_capacity_mb`` still apply)."""
    return max(16, min(MAX_AUTO_CAPACITY, (int(open_file_limit) - FD_RESERVE) // FDS_PER_SOUL))


def process_capacity(configured: int) -> int:
    """``configured``, or for 0 (automatic) :func:`fd_capacity` of this process's soft open-file limit."""
    if configured:
        return configured
    import resource
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return fd_capacity(soft if soft != resource.RLIM_INFINITY else 1 << 20)


def resolve(cfg: RuntimeConfig, recorded: dict[str, Any] | None, cpus: int) -> RuntimeConfig:
    """``cfg`` with its automatic (0) host and shard counts filled in: from the layout the data dir was first
    served with when there is one (so a data dir keeps its routing), else :func:`sizes_for` ``cpus``."""
    auto = [k for k in SIZE_KEYS if getattr(cfg, k) == 0]
    if not auto:
        return cfg
    src = recorded if recorded is not None and all(isinstance(recorded.get(k), int) for k in SIZE_KEYS) \
        else sizes_for(cpus)
    sizes: dict[str, Any] = {k: int(src[k]) for k in auto}
    return replace(cfg, **sizes)


def recorded_layout(data_dir: str) -> dict[str, Any] | None:
    """The layout ``DATA_DIR/runtime.json`` records, or None before the data dir was first served."""
    path = os.path.join(data_dir, LAYOUT_FILE)
    try:
        with open(path) as f:
            return dict(json.load(f))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"{path} is unreadable ({e}); restore it or remove it to accept this layout") from None


DATA_FORMAT = "soul-runtime/data@1"
LAYOUT_FILE = "runtime.json"
SIZE_KEYS = ("hosts", "episodic_shards", "semantic_shards", "procedural_shards")
CAPACITY_KEYS = ("host_capacity", "store_capacity")
LAYOUT_KEYS = ("format", "namespace", "hosts", "episodic_shards", "semantic_shards", "procedural_shards", "embedder",
               "embedder_dim", "storage")
EMBEDDER_KEYS = ("embedder", "embedder_dim")


def layout(cfg: RuntimeConfig) -> dict[str, Any]:
    """What every process serving a data dir must agree on: the on-disk format, who serves it and how souls
    are routed to hosts and shards, and the embedder the episodes are indexed with (its id and dimension; a
    user's embedder is made and checked here, once per process). ``model`` is recorded for information:
    another model may serve the data dir later."""
    embedder_id, dim = embedder_identity(cfg.embedder, cfg.embedder_args)
    return {"format": DATA_FORMAT, "namespace": cfg.namespace, "hosts": cfg.hosts,
            "episodic_shards": cfg.episodic_shards, "semantic_shards": cfg.semantic_shards,
            "procedural_shards": cfg.procedural_shards, "embedder": embedder_id, "embedder_dim": dim,
            "storage": redacted(cfg.storage), "model": cfg.model}


def upgraded(recorded: dict[str, Any]) -> dict[str, Any]:
    """A record written without ``embedder_dim`` always named the default embedder (MiniLM, 384-d), whatever
    served it: it is read as MiniLM's."""
    if "embedder_dim" in recorded:
        return recorded
    from soul_runtime.embedding.minilm import MiniLMEmbedder
    return {**recorded, "embedder": MiniLMEmbedder.embedder_id, "embedder_dim": MiniLMEmbedder.dim}


def mismatch(recorded: dict[str, Any], wanted: dict[str, Any], where: str) -> ConfigError | None:
    recorded = upgraded(recorded)
    keys = [k for k in LAYOUT_KEYS if recorded.get(k) != wanted.get(k)]
    if not keys:
        return None
    diffs = ", ".join(f"{k}={recorded.get(k)!r} (asked: {wanted.get(k)!r})" for k in keys)
    if set(keys) <= set(EMBEDDER_KEYS):
        return ConfigError(f"{where} is served with the embedder {recorded.get('embedder')!r} "
                           f"({recorded.get('embedder_dim')}-d), not {wanted.get('embedder')!r} "
                           f"({wanted.get('embedder_dim')}-d): its episodes are indexed with that embedder's vectors, "
                           "which no other embedder's can be compared with; connect with embedder= the one it was "
                           "served with, or use another data dir")
    return ConfigError(f"{where} is served with {diffs}: a client routing differently would open "
                       "souls' files from a second process; connect with the same configuration, or use another "
                       "data dir")


def claim_data_dir(cfg: RuntimeConfig) -> dict[str, Any]:
    """Record the layout in ``DATA_DIR/runtime.json`` on first use, or refuse one that differs (ConfigError).
    Automatic host and shard counts take the recorded ones (or this machine's CPUs on first use)."""
    recorded = recorded_layout(cfg.data_dir)
    cfg = resolve(cfg, recorded, os.cpu_count() or 2)
    want = layout(cfg)
    if recorded is None:  # first use: record ours, unless another process recorded its layout first
        write_file(make_dir(cfg.data_dir) / LAYOUT_FILE, json.dumps(want, indent=1) + "\n", replace=False)
        recorded = recorded_layout(cfg.data_dir) or {}
    err = mismatch(recorded, want, f"data dir {cfg.data_dir}")
    if err is not None:
        raise err
    return dict(recorded)


def default_data_dir() -> str:
    return os.environ.get("SOUL_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".soul-runtime")


def host_concurrency(cfg: RuntimeConfig) -> int:
    """Ray's ``max_concurrency`` for a soul host (an async actor): room for every admitted call beside the
    other calls (reads, pings, moves), so Ray never queues below the host's own admission limit."""
    return cfg.host_admission + 100
