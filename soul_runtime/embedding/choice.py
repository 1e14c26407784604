"""Which embedder: ``default`` (MiniLM, one per process) or ``fast`` (hashing; benchmarks and tests)."""

from __future__ import annotations

from soul_runtime.embedding.base import Embedder, default_embedder
from soul_runtime.errors import ConfigError

EMBEDDERS = ("default", "fast")


def make_embedder(name: str, *, threads: int | None = None) -> Embedder:
    """``threads``: the default embedder's intra-op threads (None: its own default, up to 2). A process that
    shares the cores with other embedding processes (a store shard) gives its share: one thread per text is
    ~20 % less CPU per text than two, at a longer wait for a lone text."""
    if name == "default":
        if threads is not None:
            from soul_runtime.embedding.minilm import MiniLMEmbedder
            return MiniLMEmbedder(threads=threads)
        return default_embedder()
    if name == "fast":
        from soul_runtime.embedding.fast import FastEmbedder
        return FastEmbedder()
    raise ConfigError(f"embedder must be one of {', '.join(EMBEDDERS)}, got {name!r}")
