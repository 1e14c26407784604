"""soul-runtime: long-term memory for LLM agents ("souls"), hosted on Ray.

This package is the core (foundation, ``embedding``, ``models``, ``memory``, ``loop``, the handles' API, the HTTP
client) and this front door: it imports neither Ray nor the Ray layer (``actors``) nor the applications
(``soul_apps``); the bands and the layering rule are stated in docs/architecture.md and checked by
tests/test_layout.py. :func:`connect` opens the Ray runtime named by the entry point ``ray`` of the group
``soul_runtime.runtimes`` on first use, or the HTTP client (:mod:`soul_runtime.http_client`) for the address of
a ``soul serve``.
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
    from soul_runtime.soul_api import RayRuntimeApi, RuntimeApi

__version__ = "0.1.0"


HTTP_SCHEMES = ("http://", "https://")
RUNTIMES_GROUP = "soul_runtime.runtimes"
"""The entry-point group that names the Ray runtime's ``connect`` (``ray``, this package's ``actors.runtime``)."""
RAY_RUNTIME = "actors.runtime:connect"
"""The Ray runtime of a checkout that is not installed (on ``PYTHONPATH``), which has no entry points."""


@overload
def connect(address: None = None, **kwargs: Any) -> RayRuntimeApi: ...


@overload
def connect(address: str, **kwargs: Any) -> RuntimeApi: ...


def connect(address: str | None = None, **kwargs: Any) -> RuntimeApi:
    """Connect to soul-runtime.

    ``"http://host:port"`` or ``"https://…"``: the HTTP service (``soul serve``) as the tenant of ``api_key=``
    (default: ``SOUL_API_KEY``), see :func:`soul_runtime.http_client.connect_http`; its soul handles have the same
    methods, arguments, records and errors as over Ray. Anything else (``None``, ``"auto"``, ``"ray://…"``,
    ``"host:port"``): Ray, see ``actors.runtime.connect`` (found as the entry point ``ray`` of the group
    ``soul_runtime.runtimes``).
    """
    if isinstance(address, str) and address.lower().startswith(HTTP_SCHEMES):
        from soul_runtime.http_client import connect_http
        return connect_http(address, **kwargs)
    result: RayRuntimeApi = _ray_runtime()[0](address, **kwargs)
    return result


def _ray_runtime() -> tuple[Any, Any]:
    """The Ray runtime's ``connect`` and its module (loaded on first use)."""
    import importlib
    import importlib.metadata

    found = list(importlib.metadata.entry_points(group=RUNTIMES_GROUP, name="ray"))
    module_name, _, attr = (found[0].value if found else RAY_RUNTIME).partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr), module


_RAY_NAMES = ("RuntimeConfig", "Runtime", "SoulHandle", "AsyncSoulHandle")


def __getattr__(name: str) -> Any:  # heavier or Ray-side names load on first use; the core stays light
    if name in _RAY_NAMES:
        return getattr(_ray_runtime()[1], name)
    if name == "HttpRuntime":
        from soul_runtime.http_client import HttpRuntime
        return HttpRuntime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["connect", "Runtime", "HttpRuntime", "SoulHandle", "AsyncSoulHandle", "RuntimeConfig", "MemoryConfig", "SoulConfig",
           "TurnConfig", "TurnResult", "TurnTrace", "RecalledItem", "MemoryWrite", "Fact", "FactVersion", "Episode",
           "Procedure", "SoulError", "InvalidInput", "ConfigError", "NotFound", "StorageError", "ModelError",
           "ModelTimeout", "EmbedderError", "TurnFailed", "OutOfOrder", "StaleOwner", "RuntimeUnavailable", "RuntimeBusy",
           "AuthError", "Unauthorized", "IdempotencyConflict", "Moved"]
