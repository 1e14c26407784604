"""Which embedder: ``default`` (MiniLM, one per process) or ``fast`` (hashing; benchmarks and tests)."""

from __future__ import annotations

from soul_runtime.embedding.base import Embedder, default_embedder
from soul_runtime.errors import ConfigError

EMBEDDERS = ("default", "fast")


def make_embedder(name: str) -> Embedder:
    if name == "default":
        return default_embedder()
    if name == "fast":
        from soul_runtime.embedding.fast import FastEmbedder
        return FastEmbedder()
    raise ConfigError(f"embedder must be one of {', '.join(EMBEDDERS)}, got {name!r}")
