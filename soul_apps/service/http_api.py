"""The JSON API under ``/v1`` (FastAPI), ``/healthz``, and the MCP endpoint mounted at ``/mcp/``.

Every ``/v1`` route and ``/mcp/`` needs ``Authorization: Bearer KEY``; the key names the tenant, and every soul
id in a path is that tenant's. Errors are ``{"error": {"type", "message"}}`` (see :mod:`.souls_api`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as Asgi

from actors.quotas import Quotas, usage_row
from actors.tenant_usage import usage_book
from soul_apps.service.idempotency import Ledger, digest
from soul_apps.service.tenants import Limits, Scope, TenantTable
from soul_runtime import limits
from soul_runtime.errors import InvalidInput, SoulError
from soul_runtime.records import Store

from .contract import (
    ERROR_STATUSES,
    ErrorOut,
    ForgetId,
    Id,
    Name,
    QueryText,
    QueryTime,
    Text,
    Time,
    document,
    refusal,
    seconds,
)
from .request_spans import add_request_spans
from .souls_api import TenantSouls, Unauthorized, error_body, status_of

SoulId = Annotated[str, Path(description="the soul's id: letters, digits, '_.:@-', starting with a letter or digit",
                             min_length=1, max_length=limits.SOUL_ID_MAX, pattern=limits.SOUL_ID_PATTERN)]
KeyHeader = Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=limits.KEY_MAX,
                                         pattern=limits.KEY_PATTERN,
                                         description="the same key with the same body is answered once (the first "
                                                     "answer again), with another body refused (422)")]
Stores = Annotated[list[Store] | None, Query(max_length=len(Store), description="these layers only (repeatable)")]
ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": ErrorOut} for c in ERROR_STATUSES}
"""The error answers, for a route's ``responses`` (the document declares them on every operation anyway)."""
log = logging.getLogger("soul_runtime.service")
MAX_BODY = 64 * 2**20
RETRY_AFTER = "1"
"""Seconds a client told ``429`` (the soul's host admits no more turns now) or ``503`` (the service is starting, or
cannot reach the runtime now) waits before it sends again."""


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TurnIn(_In):
    text: Text
    user: Id | None = Field(None, description="who speaks (an id; default: user)")
    at: Time | None = Field(None, description="epoch seconds, or an RFC 3339 date-time (default: now)")
    wait_writes: StrictBool = True


class Message(_In):
    speaker: Name
    text: Text
    id: Id = Field(description="the message's id, unique within the call")
    at: Time | None = None


class ObserveIn(_In):
    messages: list[Message] = Field(min_length=1, max_length=limits.MESSAGES_MAX,
                                    description="the messages, each id once")
    at: Time | None = None
    session: Id | None = None

    @model_validator(mode="after")
    def _ids_once(self) -> ObserveIn:
        ids = [m.id for m in self.messages]
        if len(set(ids)) != len(ids):
            raise InvalidInput("messages: each message id must appear once")
        return self


class ForgetIn(_In):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [
        {"required": ["ids"], "properties": {"ids": {"type": "array", "minItems": 1}}},
        {"required": ["query"], "properties": {"query": {"type": "string"}}}]})
    ids: list[ForgetId] | None = Field(
        None, max_length=limits.FORGET_IDS_MAX, description="memory ids: ep-3, entity:attribute, task@v2")
    query: QueryText | None = Field(None, description="every memory whose text holds this phrase")

    @model_validator(mode="after")
    def _something(self) -> ForgetIn:
        if not self.ids and self.query is None:
            raise InvalidInput("forget needs ids or a query")
        return self


class TurnOut(BaseModel):
    reply: str
    turn_id: str
    seq: int
    recalled: list[dict[str, Any]]
    writes: list[dict[str, Any]]
    writes_pending: bool
    model: str = Field(description="the model that answered")
    offline: bool = Field(description="the answer came from the offline model")


class ForgetOut(TurnOut):
    deleted: list[str]




class Backend:
    """What the routes need: the runtime (connected lazily), the key table and the idempotency ledger."""

    def __init__(self, data_dir: str, connect: Callable[[], Any], storage: str | None = None, *, replicas: int = 1,
                 tenant_limits: dict[str, Any] | None = None) -> None:
        self.data_dir = data_dir
        self.storage = storage
        self.tenants = TenantTable(data_dir, storage)
        configured = Limits.from_dict(tenant_limits or {}).to_dict()
        self.quotas = Quotas(data_dir, lambda t: Limits.from_dict({**configured, **self.tenants.limits(t).to_dict()}),
                             replicas=replicas, storage=storage or "",
                             book=usage_book(data_dir, storage or "", f"service-{socket.gethostname()}-{os.getpid()}",
                                        resume=False))
        self._connect = connect
        self._rt: Any = None
        self._ledger: Ledger | None = None
        self._lock = asyncio.Lock()
        self._connecting: asyncio.Future[None] | None = None

    async def runtime(self) -> Any:
        if self._rt is None:
            async with self._lock:
                if self._rt is None:
                    self._ledger = await asyncio.to_thread(Ledger, self.data_dir, self.storage)
                    self._rt = await asyncio.to_thread(self._connect)
        return self._rt

    def ready(self) -> bool:
        """Whether the runtime is reached; if not, its connection is started (once) in the background."""
        if self._rt is not None:
            return True
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._connect_quietly())
        return False

    async def _connect_quietly(self) -> None:
        try:
            await self.runtime()
        except Exception as e:  # noqa: BLE001 - /healthz stays 503; a request names the error
            log.warning("the runtime cannot be reached yet: %s: %s", type(e).__name__, e)

    @property
    def ledger(self) -> Ledger | None:
        """The idempotency ledger, once :meth:`runtime` has opened it (off the event loop)."""
        return self._ledger

    def tenant_of(self, authorization: str | None) -> str:
        scheme, _, key = (authorization or "").partition(" ")
        tenant = self.tenants.authenticate(key.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise Unauthorized("a valid API key is needed: Authorization: Bearer KEY")
        return tenant

    async def souls(self, request: Request) -> TenantSouls:
        tenant = getattr(request.state, "tenant", None) or self.tenant_of(request.headers.get("authorization"))
        request.state.scope = Scope(tenant)
        rt = await self.runtime()
        return TenantSouls(rt, tenant, self.ledger, souls=rt.souls, quotas=self.quotas)


class KeyFirst:
    """The API key of a ``/v1`` request checked before anything else of it (its route, method, parameters): a
    request without a valid key is answered 401 whatever else is wrong with it."""

    def __init__(self, app: ASGIApp, backend: Backend) -> None:
        self.app = app
        self.backend = backend

    async def __call__(self, scope: Asgi, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["path"] == "/v1" or scope["path"].startswith("/v1/")):
            auth = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
            try:
                tenant = self.backend.tenant_of(auth)
            except Unauthorized as e:
                answer = JSONResponse(error_body(e, None, ""), 401, headers={"WWW-Authenticate": "Bearer"})
                await answer(scope, receive, send)
                return
            scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


def layers(stores: list[Store] | None) -> list[str] | None:
    """The layers named by a ``store`` parameter (None: all)."""
    return None if stores is None else [s.value for s in stores]


def _canon(model: BaseModel) -> str:
    return digest(json.dumps(model.model_dump(), sort_keys=True, separators=(",", ":")))


def build_app(backend: Backend, mcp_app: Callable[..., Awaitable[None]] | None = None,
              lifespan: Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]] | None = None) -> FastAPI:
    app = FastAPI(title="soul-runtime", version="1", lifespan=lifespan,
                  description="Long-term memory for LLM agents: turns, observations, recall and the three memory "
                              "layers of each soul, per tenant (Authorization: Bearer KEY).")

    app.add_middleware(KeyFirst, backend=backend)
    add_request_spans(app)  # when traces are on: outside KeyFirst, so a refused key is a span too

    def fail(request: Request, e: BaseException) -> JSONResponse:
        scope = getattr(request.state, "scope", None)
        code = status_of(e)
        wait = getattr(e, "retry_after", None)
        headers = {"WWW-Authenticate": "Bearer"} if code == 401 else \
            {"Retry-After": RETRY_AFTER if wait is None else str(max(1, math.ceil(wait)))} if code in (429, 503) else None
        return JSONResponse(error_body(e, scope, backend.data_dir), status_code=code, headers=headers)

    @app.exception_handler(SoulError)
    async def soul_error(request: Request, e: SoulError) -> JSONResponse:
        return fail(request, e)

    @app.exception_handler(RequestValidationError)
    async def schema_error(request: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        if any(x.get("type") == "json_invalid" for x in errs):
            return JSONResponse({"error": {"type": "InvalidInput", "message": "the body is not valid JSON"}}, 400)
        code, msg = refusal(errs)
        scope = getattr(request.state, "scope", None)
        return JSONResponse({"error": {"type": "InvalidInput", "message": scope.text(msg) if scope else msg}}, code)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = {404: "NotFound", 405: "MethodNotAllowed", 401: "Unauthorized", 429: "RuntimeBusy",
                503: "RuntimeUnavailable"}.get(e.status_code, "InvalidInput" if e.status_code < 500 else "InternalError")
        msg = "the body is not valid JSON (UTF-8, nested at most as deep as the parser allows)" \
            if e.status_code == 400 and "parsing the body" in str(e.detail) else str(e.detail)
        return JSONResponse({"error": {"type": kind, "message": msg}}, e.status_code,
                            headers=getattr(e, "headers", None))  # 405: Allow (RFC 9110)

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception) -> JSONResponse:
        return fail(request, e)

    @app.get("/healthz", tags=["service"], response_model=dict[str, str])
    async def healthz() -> Any:
        """``200 {"status": "ok"}`` once turns can be served (the replica reached the runtime); until then ``503``
        RuntimeUnavailable "not ready" with ``Retry-After`` (the first ask starts the connection)."""
        if not backend.ready():
            return JSONResponse({"error": {"type": "RuntimeUnavailable", "message": "not ready"}}, 503,
                                headers={"Retry-After": RETRY_AFTER})
        return {"status": "ok"}

    @app.get("/v1/usage", tags=["service"])
    async def usage(request: Request) -> dict[str, Any]:
        """What the tenant uses: its souls and their bytes on disk, its turns, model tokens (in all and today,
        UTC), turns refused over a limit (``throttled``), seconds its work waited in the hosts' fair queues
        (``queued_s``), and its limits in force (docs/service.md, "Tenants' limits")."""
        tenant = getattr(request.state, "tenant", None) or backend.tenant_of(request.headers.get("authorization"))
        request.state.scope = Scope(tenant)
        row = await asyncio.to_thread(usage_row, backend.data_dir, tenant, backend.quotas.limits(tenant), None,
                                      backend.storage or "")
        return {k: v for k, v in row.items() if k != "tenant"}

    v1 = "/v1/souls"

    @app.get(v1, tags=["souls"])
    async def list_souls(request: Request) -> dict[str, list[str]]:
        """The tenant's own souls (those with data)."""
        s = await backend.souls(request)
        return {"souls": await asyncio.to_thread(s.souls)}

    @app.post(v1 + "/{soul_id}/turns", tags=["souls"])
    async def turn(soul_id: SoulId, body: TurnIn, request: Request, idempotency_key: KeyHeader = None) -> TurnOut:
        """One turn: recall, the model's reply, and the memory writes (unless ``wait_writes`` is false)."""
        s = await backend.souls(request)
        out = await s.turn(soul_id, body.text, body.user, seconds(body.at), body.wait_writes, idempotency_key,
                           _canon(body))
        return TurnOut(**out)

    @app.post(v1 + "/{soul_id}/observe", tags=["souls"])
    async def observe(soul_id: SoulId, body: ObserveIn, request: Request, idempotency_key: KeyHeader = None
                      ) -> TurnOut:
        """Ingest a conversation the soul was not part of (messages of ``{speaker, text, id, at?}``)."""
        s = await backend.souls(request)
        msgs = [{**m.model_dump(exclude_none=True), **({} if m.at is None else {"at": seconds(m.at)})}
                for m in body.messages]
        return TurnOut(**await s.observe(soul_id, msgs, seconds(body.at), body.session, idempotency_key,
                                         _canon(body)))

    @app.get(v1 + "/{soul_id}/recall", tags=["souls"])
    async def recall(soul_id: SoulId, request: Request, q: Annotated[QueryText, Query()],
                     k: Annotated[int, Query(ge=1, le=limits.K_MAX)] = 10,
                     store: Stores = None,
                     at: Annotated[QueryTime | None, Query(description="recall as of this time: epoch seconds or an "
                                                                        "RFC 3339 date-time (default: now)")] = None
                     ) -> dict[str, list[dict[str, Any]]]:
        """What memory returns for a query (``store`` repeatable: episodic, semantic, procedural)."""
        s = await backend.souls(request)
        return {"items": await s.recall(soul_id, q, k, seconds(at), layers(store))}

    @app.get(v1 + "/{soul_id}/facts", tags=["souls"])
    async def facts(soul_id: SoulId, request: Request, entity: Annotated[Name | None, Query()] = None
                    ) -> dict[str, list[Any]]:
        s = await backend.souls(request)
        return {"facts": await s.facts(soul_id, entity)}

    @app.get(v1 + "/{soul_id}/facts/{entity}/{attribute}/history", tags=["souls"])
    async def history(soul_id: SoulId, entity: Annotated[Name, Path()], attribute: Annotated[Name, Path()],
                      request: Request) -> dict[str, list[Any]]:
        s = await backend.souls(request)
        return {"versions": await s.fact_history(soul_id, entity, attribute)}

    @app.get(v1 + "/{soul_id}/episodes", tags=["souls"])
    async def episodes(soul_id: SoulId, request: Request, since: Annotated[QueryTime | None, Query()] = None,
                       until: Annotated[QueryTime | None, Query()] = None,
                       session: Annotated[Id | None, Query()] = None,
                       sessions_ago: Annotated[int | None, Query(ge=0, le=limits.SESSIONS_AGO_MAX)] = None
                       ) -> dict[str, list[Any]]:
        s = await backend.souls(request)
        return {"episodes": await s.episodes(soul_id, seconds(since), seconds(until), session, sessions_ago)}

    @app.get(v1 + "/{soul_id}/digests", tags=["souls"])
    async def digests(soul_id: SoulId, request: Request) -> dict[str, list[Any]]:
        """The consolidated memory (digests of sessions and spans of sessions), brought up to date first, each with
        the episodes it was written from and the sources of what it quotes."""
        s = await backend.souls(request)
        return {"digests": await s.digests(soul_id)}

    @app.get(v1 + "/{soul_id}/procedures", tags=["souls"])
    async def procedures(soul_id: SoulId, request: Request, task: Annotated[Name | None, Query()] = None
                         ) -> dict[str, list[Any]]:
        s = await backend.souls(request)
        return {"procedures": await s.procedures(soul_id, task)}

    @app.get(v1 + "/{soul_id}/traces", tags=["souls"])
    async def traces(soul_id: SoulId, request: Request, last: Annotated[int, Query(ge=1, le=limits.LAST_MAX)] = 10
                     ) -> dict[str, list[Any]]:
        """The last ``last`` turn traces, oldest first."""
        s = await backend.souls(request)
        return {"traces": await s.traces(soul_id, last)}

    @app.get(v1 + "/{soul_id}/traces/{seq}", tags=["souls"])
    async def trace(soul_id: SoulId, seq: Annotated[int, Path(ge=1, le=limits.SEQ_MAX)], request: Request) -> dict[str, Any]:
        """One turn's trace by its number (the ``seq`` of its result; its turn id is ``SOUL/SEQ``)."""
        s = await backend.souls(request)
        return await s.trace(soul_id, seq)

    @app.get(v1 + "/{soul_id}/stats", tags=["souls"])
    async def stats(soul_id: SoulId, request: Request) -> dict[str, Any]:
        s = await backend.souls(request)
        return await s.stats(soul_id)

    @app.get(v1 + "/{soul_id}/export", tags=["souls"], response_class=Response,
             responses={200: {"content": {"application/octet-stream": {}}}})
    async def export(soul_id: SoulId, request: Request) -> Response:
        """The soul's whole memory as msgpack bytes (import them into a new soul)."""
        s = await backend.souls(request)
        return Response(await s.export(soul_id), media_type="application/octet-stream")

    @app.post(v1 + "/{soul_id}/import", tags=["souls"], status_code=201,
              openapi_extra={"requestBody": {"required": True,
                                             "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                                 "format": "binary"}}}}},
              )
    async def import_(soul_id: SoulId, request: Request) -> dict[str, Any]:
        """Load an export into a soul that has no memories yet (body: the export's bytes)."""
        s = await backend.souls(request)
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/octet-stream":
            raise InvalidInput("import takes the export's bytes as application/octet-stream")
        blob = await request.body()
        if len(blob) > MAX_BODY:
            raise InvalidInput(f"an export of more than {MAX_BODY} bytes is refused")
        return await s.import_(soul_id, blob)

    @app.delete(v1 + "/{soul_id}", tags=["souls"])
    async def forget_all(soul_id: SoulId, request: Request, store: Stores = None) -> dict[str, Any]:
        """Erase the soul's memory for good: every layer (or the ``store`` ones), its traces and buffer; its files
        are unlinked."""
        s = await backend.souls(request)
        return {"erased": await s.forget_all(soul_id, layers(store))}

    @app.post(v1 + "/{soul_id}/forget", tags=["souls"])
    async def forget(soul_id: SoulId, body: ForgetIn, request: Request, idempotency_key: KeyHeader = None
                     ) -> ForgetOut:
        """Delete single memories: by id (``ep-3``, ``entity:attribute``, ``task@v2``) and/or every memory whose
        text contains ``query``; traces that held them are redacted."""
        s = await backend.souls(request)
        return ForgetOut(**await s.forget_where(soul_id, body.ids, body.query, idempotency_key, _canon(body)))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    if mcp_app is not None:
        app.mount("/mcp", mcp_app)
    return app
