"""Which embedder: ``default`` (MiniLM, one per process), ``fast`` (hashing; benchmarks and tests), or the
user's, named ``package.module:attr`` or by an entry point in the group ``soul_runtime.embedders``
(resolved by :mod:`soul_runtime.plugins`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from soul_runtime import plugins
from soul_runtime.embedding.base import Embedder
from soul_runtime.errors import ConfigError, SoulError

BUILTIN_EMBEDDERS = ("default", "fast")


@functools.lru_cache(maxsize=1)
def default_embedder() -> Embedder:
    """The project's default embedder (all-MiniLM-L6-v2, int8 ONNX, 384-d), one per process.

    The model loads lazily on first use; a missing model raises
    :class:`EmbedderError` then.
    """
    from soul_runtime.embedding.minilm import MiniLMEmbedder

    return MiniLMEmbedder()


def check_embedder_name(name: object) -> str:
    """``name`` if it is a built-in name or well formed for the resolver (nothing is imported), else ConfigError."""
    return plugins.check_name(name, "embedder")


def make_embedder(name: str, *, threads: int | None = None, args: Mapping[str, str] | None = None) -> Embedder:
    """``threads``: the default embedder's intra-op threads (None: its own default, up to 2). A process that
    shares the cores with other embedding processes (a store shard) gives its share: one thread per text is
    ~20 % less CPU per text than two, at a longer wait for a lone text. ``args``: keyword arguments of a
    user's embedder class or factory."""
    args = _checked(name, args)
    if name == "default":
        if threads is not None:
            from soul_runtime.embedding.minilm import MiniLMEmbedder
            return MiniLMEmbedder(threads=threads)
        return default_embedder()
    if name == "fast":
        from soul_runtime.embedding.fast import FastEmbedder
        return FastEmbedder()
    factory = plugins.load_factory(name, group=plugins.EMBEDDER_GROUP, what="embedder")
    return check_embedder(name, plugins.build(name, factory, args, Embedder, "embedder"))


def _checked(name: str, args: Mapping[str, str] | None) -> dict[str, str]:
    checked = plugins.check_args(args or {}, "embedder_args")
    check_embedder_name(name)
    if name in BUILTIN_EMBEDDERS and checked:
        raise ConfigError(f"the {name!r} embedder takes no embedder_args, got {sorted(checked)}")
    return checked


def check_embedder(name: str, emb: Embedder) -> Embedder:
    """A user's embedder with a usable ``embedder_id`` and ``dim``, or ConfigError saying which is wrong."""
    eid = getattr(emb, "embedder_id", None)
    if not isinstance(eid, str) or not eid.strip():
        raise ConfigError(f"embedder {name!r}: embedder_id must be a non-empty str (a stable name of model, weights "
                          f"and pooling), got {eid!r}")
    dim = getattr(emb, "dim", None)
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= 65_536:
        raise ConfigError(f"embedder {name!r}: dim must be an int in 1..65536 (the vectors' dimension), got {dim!r}")
    return emb


@functools.lru_cache(maxsize=16)
def _identity(name: str, args: tuple[tuple[str, str], ...]) -> tuple[str, int]:
    if name == "default":
        from soul_runtime.embedding.minilm import MiniLMEmbedder
        return MiniLMEmbedder.embedder_id, MiniLMEmbedder.dim
    if name == "fast":
        from soul_runtime.embedding.fast import FastEmbedder
        return FastEmbedder.embedder_id, FastEmbedder.dim
    emb = make_embedder(name, args=dict(args))
    try:  # one text: the vectors must have the dimension the embedder declares
        emb.embed(["the dimension check of a new embedder"])
    except SoulError as e:
        raise ConfigError(f"embedder {name!r} failed its first text: {e}") from None
    return emb.embedder_id, emb.dim


def embedder_identity(name: str, args: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(embedder_id, dim) of the embedder ``name`` names, checked once per process: a user's embedder is made and
    embeds one text (its vectors must have its ``dim``). Built-ins are not loaded."""
    return _identity(name, tuple(sorted(_checked(name, args).items())))
