"""soul-runtime: long-term memory for LLM agents ("souls"), hosted on Ray.

The core (this package) never imports Ray; :func:`connect` loads the Ray layer
(package ``actors``) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from soul_runtime.config import MemoryConfig, SoulConfig, TurnConfig
from soul_runtime.errors import (
    AuthError,
    ConfigError,
    EmbedderError,
    InvalidInput,
    ModelError,
    ModelTimeout,
    NotFound,
    OutOfOrder,
    RuntimeBusy,
    RuntimeUnavailable,
    SoulError,
    StaleOwner,
    StorageError,
    TurnFailed,
)
from soul_runtime.records import Episode, Fact, FactVersion, MemoryWrite, Procedure, RecalledItem

if TYPE_CHECKING:
    from actors.runtime import AsyncSoulHandle, Runtime, SoulHandle
    from actors.settings import RuntimeConfig
    from soul_runtime.loop.soul import TurnResult
    from soul_runtime.loop.trace import TurnTrace

__version__ = "0.1.0"


def connect(address: str | None = None, **kwargs: Any) -> Runtime:
    """Connect to soul-runtime on Ray; see :func:`actors.runtime.connect`."""
    from actors.runtime import connect as _connect
    return _connect(address, **kwargs)


_LAZY = {"RuntimeConfig": "actors.settings", "Runtime": "actors.runtime", "SoulHandle": "actors.runtime",
         "AsyncSoulHandle": "actors.runtime", "TurnResult": "soul_runtime.loop.soul",
         "TurnTrace": "soul_runtime.loop.trace"}


def __getattr__(name: str) -> Any:  # heavier or Ray-side names load on first use; the core stays light
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(module), name)


__all__ = ["connect", "Runtime", "SoulHandle", "AsyncSoulHandle", "RuntimeConfig", "MemoryConfig", "SoulConfig",
           "TurnConfig", "TurnResult", "TurnTrace", "RecalledItem", "MemoryWrite", "Fact", "FactVersion", "Episode",
           "Procedure", "SoulError", "InvalidInput", "ConfigError", "NotFound", "StorageError", "ModelError",
           "ModelTimeout", "EmbedderError", "TurnFailed", "OutOfOrder", "StaleOwner", "RuntimeUnavailable", "RuntimeBusy",
           "AuthError"]
