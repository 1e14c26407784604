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
    RuntimeUnavailable,
    SoulError,
    StorageError,
    TurnFailed,
)

if TYPE_CHECKING:
    from actors.runtime import Runtime

__version__ = "0.1.0"


def connect(address: str | None = None, **kwargs: Any) -> Runtime:
    """Connect to soul-runtime on Ray; see :func:`actors.runtime.connect`."""
    from actors.runtime import connect as _connect
    return _connect(address, **kwargs)


__all__ = ["connect", "MemoryConfig", "SoulConfig", "TurnConfig", "SoulError", "InvalidInput", "ConfigError",
           "NotFound", "StorageError", "ModelError", "ModelTimeout", "EmbedderError", "TurnFailed", "OutOfOrder",
           "RuntimeUnavailable", "AuthError"]
