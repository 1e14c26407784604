"""The runtime's configuration: how many hosts and shards, where data lives, which model."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from soul_runtime.config import SoulConfig
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
    model: str = "auto"
    """``auto`` (Anthropic when ANTHROPIC_API_KEY is set, else offline), ``offline`` or ``anthropic``."""
    soul: SoulConfig = field(default_factory=SoulConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.data_dir, str) or not self.data_dir:
            raise ConfigError("data_dir must be a non-empty path")
        for name in ("hosts", "episodic_shards", "semantic_shards", "procedural_shards", "host_capacity",
                     "store_capacity", "host_threads", "max_dedicated"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1 or v > 10_000:
                raise ConfigError(f"{name} must be an int in 1..10000, got {v!r}")
        if not isinstance(self.idle_passivate_s, (int, float)) or self.idle_passivate_s <= 0:
            raise ConfigError("idle_passivate_s must be > 0")
        if self.model not in ("auto", "offline", "anthropic"):
            raise ConfigError(f"model must be auto, offline or anthropic, got {self.model!r}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["soul"] = self.soul.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RuntimeConfig:
        d = dict(d)
        soul = SoulConfig.from_dict(d.pop("soul", {}))
        return cls(soul=soul, **d)

    def shards(self, layer: str) -> int:
        return int(getattr(self, f"{layer}_shards"))


def default_data_dir() -> str:
    return os.environ.get("SOUL_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".soul-runtime")
