"""The runtime's configuration: how many hosts and shards, where data lives, which model."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from soul_runtime.config import SoulConfig
from soul_runtime.embedding.choice import EMBEDDERS
from soul_runtime.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    data_dir: str
    namespace: str = "souls"
    hosts: int = 2
    """Soul-host actors; souls are placed on them by rendezvous hashing of the soul id."""
    episodic_shards: int = 2
    semantic_shards: int = 1
    procedural_shards: int = 1
    host_capacity: int = 256
    """Active souls per host (LRU); the rest are passivated to disk."""
    idle_passivate_s: float = 600.0
    store_capacity: int = 256
    """Open per-soul stores per shard (LRU)."""
    host_threads: int = 16
    max_dedicated: int = 16
    """Dedicated actors for hot souls (custom resource ``soul_slot``)."""
    shard_threads: int = 8
    """Threads per store shard: different souls are served concurrently (one soul at a time each), and the
    episodic shard's embedder batches what they ask for together."""
    embedder: str = "default"
    """``default`` (MiniLM on onnxruntime) or ``fast`` (hashing; for benchmarks and tests)."""
    model: str = "auto"
    """``auto`` (Anthropic when ANTHROPIC_API_KEY is set, else offline), ``offline`` or ``anthropic``."""
    soul: SoulConfig = field(default_factory=SoulConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.data_dir, str) or not self.data_dir:
            raise ConfigError("data_dir must be a non-empty path")
        for name in ("hosts", "episodic_shards", "semantic_shards", "procedural_shards", "host_capacity",
                     "store_capacity", "host_threads", "shard_threads", "max_dedicated"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1 or v > 10_000:
                raise ConfigError(f"{name} must be an int in 1..10000, got {v!r}")
        v = self.idle_passivate_s
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"idle_passivate_s must be a finite number > 0, got {v!r}")
        if not isinstance(self.namespace, str) or not self.namespace or len(self.namespace) > 100:
            raise ConfigError(f"namespace must be a non-empty string, got {self.namespace!r}")
        if not isinstance(self.soul, SoulConfig):
            raise ConfigError("soul must be a SoulConfig")
        if self.embedder not in EMBEDDERS:
            raise ConfigError(f"embedder must be one of {', '.join(EMBEDDERS)}, got {self.embedder!r}")
        if self.model not in ("auto", "offline", "anthropic"):
            raise ConfigError(f"model must be auto, offline or anthropic, got {self.model!r}")

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


def default_data_dir() -> str:
    return os.environ.get("SOUL_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".soul-runtime")
