"""soul-runtime: long-term memory for LLM agents ("souls"), hosted on Ray.

This package holds the core (foundation, ``embedding``, ``models``, ``memory``, ``loop``: never imports Ray or
``actors``), this front door, and two applications that sit above ``actors``: the command line
(:mod:`soul_runtime.cli`) and the benchmarks (:mod:`soul_runtime.bench`); the layering rule is stated in
docs/architecture.md and checked by tests/test_layout.py. :func:`connect` loads the Ray layer (package
``actors``) on first use, or the HTTP client (:mod:`soul_runtime.http_client`, no Ray) for the address of a
``soul serve``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, overload

from soul_runtime.config import MemoryConfig, SoulConfig, TurnConfig
from soul_runtime.errors import (
    AuthError,
    ConfigError,
    EmbedderError,
    IdempotencyConflict,
    InvalidInput,
    ModelError,
    ModelTimeout,
    Moved,
    NotFound,
    OutOfOrder,
    RuntimeBusy,
    RuntimeUnavailable,
    SoulError,
    StaleOwner,
    StorageError,
    TurnFailed,
    Unauthorized,
)
from soul_runtime.records import Episode, Fact, FactVersion, MemoryWrite, Procedure, RecalledItem, TurnResult, TurnTrace

if TYPE_CHECKING:
    from actors.runtime import AsyncSoulHandle, Runtime, SoulHandle
    from actors.settings import RuntimeConfig
    from soul_runtime.http_client import HttpRuntime

__version__ = "0.1.0"


HTTP_SCHEMES = ("http://", "https://")


@overload
def connect(address: None = None, **kwargs: Any) -> Runtime: ...


@overload
def connect(address: str, **kwargs: Any) -> Runtime | HttpRuntime: ...


def connect(address: str | None = None, **kwargs: Any) -> Runtime | HttpRuntime:
    """Connect to soul-runtime.

    ``"http://host:port"`` or ``"https://…"``: the HTTP service (``soul serve``) as the tenant of ``api_key=``
    (default: ``SOUL_API_KEY``), see :func:`soul_runtime.http_client.connect_http`; its soul handles have the same
    methods, arguments, records and errors as over Ray. Anything else (``None``, ``"auto"``, ``"ray://…"``,
    ``"host:port"``): Ray, see :func:`actors.runtime.connect`.
    """
    if isinstance(address, str) and address.lower().startswith(HTTP_SCHEMES):
        from soul_runtime.http_client import connect_http
        return connect_http(address, **kwargs)
    from actors.runtime import connect as _connect
    return _connect(address, **kwargs)


_LAZY = {"RuntimeConfig": "actors.settings", "Runtime": "actors.runtime", "SoulHandle": "actors.runtime",
         "AsyncSoulHandle": "actors.runtime", "HttpRuntime": "soul_runtime.http_client"}


def __getattr__(name: str) -> Any:  # heavier or Ray-side names load on first use; the core stays light
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(module), name)


__all__ = ["connect", "Runtime", "HttpRuntime", "SoulHandle", "AsyncSoulHandle", "RuntimeConfig", "MemoryConfig", "SoulConfig",
           "TurnConfig", "TurnResult", "TurnTrace", "RecalledItem", "MemoryWrite", "Fact", "FactVersion", "Episode",
           "Procedure", "SoulError", "InvalidInput", "ConfigError", "NotFound", "StorageError", "ModelError",
           "ModelTimeout", "EmbedderError", "TurnFailed", "OutOfOrder", "StaleOwner", "RuntimeUnavailable", "RuntimeBusy",
           "AuthError", "Unauthorized", "IdempotencyConflict", "Moved"]
