"""The Python API over HTTP: :func:`connect_http` (what ``soul_runtime.connect("https://…")`` returns) reaches
``soul serve`` with httpx; its soul handles have the methods, arguments, records and errors of the handles over
Ray. Needs no Ray."""

from __future__ import annotations

from typing import Any

from .runtime import API_KEY_ENV, AsyncHttpSoulHandle, HttpRuntime, HttpSoulHandle


def connect_http(url: str, api_key: str | None = None, **options: Any) -> HttpRuntime:
    """A runtime over the service at ``url`` (``http(s)://host[:port]``) as the tenant of ``api_key`` (default:
    ``SOUL_API_KEY``); ``options``: ``timeout``, ``retries``, ``max_connections``, ``transport``,
    ``async_transport`` (see :class:`HttpRuntime`)."""
    return HttpRuntime(url, api_key, **options)


__all__ = ["connect_http", "HttpRuntime", "HttpSoulHandle", "AsyncHttpSoulHandle", "API_KEY_ENV"]
