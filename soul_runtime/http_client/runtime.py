"""The runtime over HTTP: a connection to ``soul serve`` whose soul handles have the API of the handles over Ray
(:class:`~soul_runtime.soul_api.SoulApi`: the same methods, arguments, records and errors)."""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import httpx

from soul_runtime import soul_args
from soul_runtime.clock import to_timestamp
from soul_runtime.errors import ConfigError, NotFound
from soul_runtime.records import Digest, Episode, Fact, FactVersion, Procedure, RecalledItem, TurnResult, TurnTrace
from soul_runtime.soul_api import AsyncSoulApi, Plan, SoulApi
from soul_runtime.text import check_id

from . import wire
from .transport import AsyncSender, Call, Retries, Sender

T = TypeVar("T")
API_KEY_ENV = "SOUL_API_KEY"
TIMEOUT = httpx.Timeout(600.0, connect=10.0)
"""A turn waits for its answer as long as a handle over Ray does (600 s); a connection is given 10 s."""


def _param(name: str, value: Any) -> list[tuple[str, str]]:
    """A query parameter, none when the value is None (floats as their exact repr)."""
    return [] if value is None else [(name, repr(value) if isinstance(value, float) else str(value))]


def _message(m: Any) -> Any:
    """A message of ``observe`` as JSON carries it: its time as epoch seconds."""
    if isinstance(m, dict) and m.get("at") is not None and not isinstance(m["at"], (str, int, float)):
        return {**m, "at": to_timestamp(m["at"])}
    return m


class _Plans:
    """The soul's calls over HTTP (the routes under ``/v1/souls/{soul_id}``)."""

    def __init__(self, soul_id: str) -> None:
        self.soul_id = soul_id
        self.base = f"/v1/souls/{soul_id}"

    def turn(self, text: str, user: str | None, at: Any, request_id: str | None, wait_writes: bool
             ) -> Plan[TurnResult]:
        body = soul_args.turn(text, user, at, wait_writes)
        return Plan(Call("POST", self.base + "/turns", json=body, key=soul_args.request_id(request_id)),
                    wire.turn_result)

    def observe(self, messages: Sequence[dict[str, Any]], at: Any, session: str | None,
                request_id: str | None) -> Plan[TurnResult]:
        body = soul_args.observe(messages, at, session)
        body["messages"] = [_message(m) for m in body["messages"]]
        return Plan(Call("POST", self.base + "/observe", json=body, key=soul_args.request_id(request_id)),
                    wire.turn_result)

    def recall(self, query: str, k: int, at: Any, stores: Iterable[str] | None) -> Plan[list[RecalledItem]]:
        query, k, when, layers = soul_args.recall(query, k, at, stores)
        params = [("q", query), ("k", str(k)), *_param("at", when), *[("store", s.value) for s in layers or ()]]
        return Plan(Call("GET", self.base + "/recall", params=params), lambda d: wire.recalled(d["items"]))

    def facts(self, entity: str | None) -> Plan[list[Fact]]:
        return Plan(Call("GET", self.base + "/facts", params=_param("entity", entity)),
                    lambda d: [wire.fact(f) for f in d["facts"]])

    def fact_history(self, entity: str, attribute: str) -> Plan[list[FactVersion]]:
        entity, attribute = soul_args.fact_history(entity, attribute)
        path = f"{self.base}/facts/{quote(entity, safe='')}/{quote(attribute, safe='')}/history"
        return Plan(Call("GET", path), lambda d: [wire.fact_version(v) for v in d["versions"]])

    def procedures(self, task_class: str | None) -> Plan[list[Procedure]]:
        return Plan(Call("GET", self.base + "/procedures", params=_param("task", task_class)),
                    lambda d: [wire.procedure(p) for p in d["procedures"]])

    def episodes(self, since: Any, until: Any, session: str | None, sessions_ago: int | None) -> Plan[list[Episode]]:
        args = soul_args.episodes(since, until, session, sessions_ago)
        params = [p for name, value in args.items() for p in _param(name, value)]
        return Plan(Call("GET", self.base + "/episodes", params=params),
                    lambda d: [wire.episode(e) for e in d["episodes"]])

    def digests(self) -> Plan[list[Digest]]:
        return Plan(Call("GET", self.base + "/digests"), lambda d: [wire.digest(g) for g in d["digests"]])

    def trace(self, turn_id: str) -> Plan[TurnTrace]:
        soul, _, seq = str(turn_id).rpartition("/")
        if soul != self.soul_id or not seq.isdigit() or int(seq) < 1:
            raise NotFound(f"no trace of turn {turn_id!r} in soul {self.soul_id!r}")
        return Plan(Call("GET", f"{self.base}/traces/{int(seq)}"), wire.trace)

    def traces(self, last: int) -> Plan[list[TurnTrace]]:
        return Plan(Call("GET", self.base + "/traces", params=_param("last", soul_args.traces(last))),
                    lambda d: [wire.trace(t) for t in d["traces"]])

    def forget(self, stores: Iterable[str] | None) -> Plan[dict[str, int]]:
        layers = soul_args.stores(stores)
        params = [("store", s.value) for s in layers or ()]
        return Plan(Call("DELETE", self.base, params=params),
                    lambda d: {str(k): int(v) for k, v in d["erased"].items()})

    def forget_where(self, ids: Iterable[str] | None, query: str | None, request_id: str | None
                     ) -> Plan[TurnResult]:
        ids_, phrase = soul_args.forget_where(ids, query)
        return Plan(Call("POST", self.base + "/forget", json={"ids": ids_, "query": phrase},
                         key=soul_args.request_id(request_id)), wire.turn_result)

    def stats(self) -> Plan[dict[str, Any]]:
        return Plan(Call("GET", self.base + "/stats"), dict)

    def export(self) -> Plan[bytes]:
        return Plan(Call("GET", self.base + "/export", binary=True), bytes)

    def import_(self, blob: bytes) -> Plan[None]:
        return Plan(Call("POST", self.base + "/import", content=soul_args.import_blob(blob)), lambda d: None)


class HttpSoulHandle(SoulApi):
    """A soul of the service. Every method blocks until its answer is there."""

    def __init__(self, rt: HttpRuntime, soul_id: str) -> None:
        self.id = soul_id
        self._p = _Plans(soul_id)
        self._sender = rt.sender

    def _run(self, plan: Plan[T]) -> T:
        return plan.then(self._sender.send(plan.call))


class AsyncHttpSoulHandle(AsyncSoulApi):
    """The same API as :class:`HttpSoulHandle`, as coroutines (for asyncio servers)."""

    def __init__(self, rt: HttpRuntime, soul_id: str) -> None:
        self.id = soul_id
        self._p = _Plans(soul_id)
        self._rt = rt

    async def _run(self, plan: Plan[T]) -> T:
        return plan.then(await self._rt.async_sender().send(plan.call))


class HttpRuntime:
    """A connection to soul-runtime's HTTP service (``soul serve``) as one tenant (its API key). Use as a context
    manager, or call :meth:`close` (and ``await`` :meth:`aclose` where async handles were used)."""

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float | httpx.Timeout | None = None,
                 retries: int = 3, retry_for_s: float = 60.0, max_connections: int = 100, transport: httpx.BaseTransport | None = None,
                 async_transport: httpx.AsyncBaseTransport | None = None) -> None:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"the service's address must be http(s)://host[:port], got {url!r}")
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV, "").strip()
        if not isinstance(key, str) or not key:
            raise ConfigError(f"the service needs an API key: connect(url, api_key=...) or {API_KEY_ENV}")
        self.url = url.rstrip("/")
        if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= 99:
            raise ConfigError(f"retries must be an int in 0..99, got {retries!r}")
        self.retries = Retries(attempts=retries + 1, within_s=retry_for_s)
        self._options: dict[str, Any] = {
            "base_url": self.url, "headers": {"Authorization": f"Bearer {key}"},
            "timeout": TIMEOUT if timeout is None else timeout,
            "limits": httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)}
        self.sender = Sender(httpx.Client(transport=transport, **self._options), self.retries)
        self._async_transport = async_transport
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncSender] = weakref.WeakKeyDictionary()

    def async_sender(self) -> AsyncSender:
        """The sender of the running event loop (an httpx async client keeps its connections on one loop)."""
        loop = asyncio.get_running_loop()
        sender = self._async.get(loop)
        if sender is None:
            sender = AsyncSender(httpx.AsyncClient(transport=self._async_transport, **self._options), self.retries)
            self._async[loop] = sender
        return sender

    def soul(self, soul_id: str) -> HttpSoulHandle:
        return HttpSoulHandle(self, check_id(soul_id, what="soul id"))

    def async_soul(self, soul_id: str) -> AsyncHttpSoulHandle:
        return AsyncHttpSoulHandle(self, check_id(soul_id, what="soul id"))

    def souls(self) -> list[str]:
        """Ids of the tenant's souls (those with data)."""
        return list(self.sender.send(Call("GET", "/v1/souls"))["souls"])

    def close(self) -> None:
        self.sender.client.close()

    async def aclose(self) -> None:
        """Close the running loop's async connections, and the blocking ones."""
        loop = asyncio.get_running_loop()
        sender = self._async.pop(loop, None)
        if sender is not None:
            await sender.client.aclose()
        self.close()

    def __enter__(self) -> HttpRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> HttpRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
