"""The JSON API under ``/v1`` (FastAPI), ``/healthz``, and the MCP endpoint mounted at ``/mcp/``.

Every ``/v1`` route and ``/mcp/`` needs ``Authorization: Bearer KEY``; the key names the tenant, and every soul
id in a path is that tenant's. Errors are ``{"error": {"type", "message"}}`` (see :mod:`.souls_api`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from starlette.exceptions import HTTPException as StarletteHTTPException

from soul_runtime.clock import time_arg
from soul_runtime.errors import InvalidInput, SoulError
from soul_runtime.idempotency import Ledger, digest
from soul_runtime.tenants import Scope, TenantTable

from .souls_api import TenantSouls, Unauthorized, error_body, status_of

Time = StrictFloat | StrictInt | StrictStr
SoulId = Annotated[str, Path(description="the soul's id (letters, digits, '_.:@-'; at most 95 characters)")]
KeyHeader = Annotated[str | None, Header(alias="Idempotency-Key", description="at most 200 characters; the same "
                                                                                "key with the same body is answered "
                                                                                "once, with another body refused")]
MAX_BODY = 64 * 2**20


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TurnIn(_In):
    text: StrictStr
    user: StrictStr | None = None
    at: Time | None = Field(None, description="ISO-8601 or epoch seconds (default: now)")
    wait_writes: StrictBool = True


class Message(_In):
    speaker: StrictStr
    text: StrictStr
    id: StrictStr
    at: Time | None = None


class ObserveIn(_In):
    messages: list[Message]
    at: Time | None = None
    session: StrictStr | None = None


class ForgetIn(_In):
    ids: list[StrictStr] | None = None
    query: StrictStr | None = None


class TurnOut(BaseModel):
    reply: str
    turn_id: str
    seq: int
    recalled: list[dict[str, Any]]
    writes: list[dict[str, Any]]
    writes_pending: bool


class ForgetOut(BaseModel):
    turn_id: str
    seq: int
    deleted: list[str]
    writes: list[dict[str, Any]]


class ErrorOut(BaseModel):
    error: dict[str, str]


ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": ErrorOut} for c in (400, 401, 404, 422, 429, 502, 503)}


class Backend:
    """What the routes need: the runtime (connected lazily), the key table and the idempotency ledger."""

    def __init__(self, data_dir: str, connect: Callable[[], Any]) -> None:
        self.data_dir = data_dir
        self.tenants = TenantTable(data_dir)
        self._connect = connect
        self._rt: Any = None
        self._ledger: Ledger | None = None
        self._lock = asyncio.Lock()

    async def runtime(self) -> Any:
        if self._rt is None:
            async with self._lock:
                if self._rt is None:
                    self._ledger = await asyncio.to_thread(Ledger, self.data_dir)
                    self._rt = await asyncio.to_thread(self._connect)
        return self._rt

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
        tenant = self.tenant_of(request.headers.get("authorization"))
        request.state.scope = Scope(tenant)
        rt = await self.runtime()
        return TenantSouls(rt, tenant, self.ledger, souls=rt.souls)


def _canon(model: BaseModel) -> str:
    return digest(json.dumps(model.model_dump(), sort_keys=True, separators=(",", ":")))


def build_app(backend: Backend, mcp_app: Callable[..., Awaitable[None]] | None = None,
              lifespan: Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]] | None = None) -> FastAPI:
    app = FastAPI(title="soul-runtime", version="1", lifespan=lifespan,
                  description="Long-term memory for LLM agents: turns, observations, recall and the three memory "
                              "layers of each soul, per tenant (Authorization: Bearer KEY).")

    def fail(request: Request, e: BaseException) -> JSONResponse:
        scope = getattr(request.state, "scope", None)
        code = status_of(e)
        headers = {"WWW-Authenticate": "Bearer"} if code == 401 else None
        return JSONResponse(error_body(e, scope, backend.data_dir), status_code=code, headers=headers)

    @app.exception_handler(SoulError)
    async def soul_error(request: Request, e: SoulError) -> JSONResponse:
        return fail(request, e)

    @app.exception_handler(RequestValidationError)
    async def schema_error(request: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        if any(x.get("type") == "json_invalid" for x in errs):
            return JSONResponse({"error": {"type": "InvalidInput", "message": "the body is not valid JSON"}}, 400)
        first = errs[0] if errs else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        msg = f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg", "invalid request"))
        scope = getattr(request.state, "scope", None)
        return JSONResponse({"error": {"type": "InvalidInput", "message": scope.text(msg) if scope else msg}}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = {404: "NotFound", 405: "MethodNotAllowed", 401: "Unauthorized"}.get(e.status_code, "HTTPError")
        return JSONResponse({"error": {"type": kind, "message": str(e.detail)}}, e.status_code)

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception) -> JSONResponse:
        return fail(request, e)

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, str]:
        await backend.runtime()
        return {"status": "ok"}

    v1 = "/v1/souls"

    @app.get(v1, tags=["souls"], responses=ERRORS)
    async def list_souls(request: Request) -> dict[str, list[str]]:
        """The tenant's own souls (those with data)."""
        s = await backend.souls(request)
        return {"souls": await asyncio.to_thread(s.souls)}

    @app.post(v1 + "/{soul_id}/turns", tags=["souls"], responses=ERRORS)
    async def turn(soul_id: SoulId, body: TurnIn, request: Request, idempotency_key: KeyHeader = None) -> TurnOut:
        """One turn: recall, the model's reply, and the memory writes (unless ``wait_writes`` is false)."""
        s = await backend.souls(request)
        out = await s.turn(soul_id, body.text, body.user, body.at, body.wait_writes, idempotency_key, _canon(body))
        return TurnOut(**out)

    @app.post(v1 + "/{soul_id}/observe", tags=["souls"], responses=ERRORS)
    async def observe(soul_id: SoulId, body: ObserveIn, request: Request, idempotency_key: KeyHeader = None
                      ) -> TurnOut:
        """Ingest a conversation the soul was not part of (messages of ``{speaker, text, id, at?}``)."""
        s = await backend.souls(request)
        msgs = [m.model_dump(exclude_none=True) for m in body.messages]
        return TurnOut(**await s.observe(soul_id, msgs, body.at, body.session, idempotency_key, _canon(body)))

    @app.get(v1 + "/{soul_id}/recall", tags=["souls"], responses=ERRORS)
    async def recall(soul_id: SoulId, request: Request, q: Annotated[str, Query(min_length=1)],
                     k: Annotated[int, Query(ge=1, le=1000)] = 10,
                     store: Annotated[list[str] | None, Query()] = None) -> dict[str, list[dict[str, Any]]]:
        """What memory returns for a query (``store`` repeatable: episodic, semantic, procedural)."""
        s = await backend.souls(request)
        return {"items": await s.recall(soul_id, q, k, None, store)}

    @app.get(v1 + "/{soul_id}/facts", tags=["souls"], responses=ERRORS)
    async def facts(soul_id: SoulId, request: Request, entity: str | None = None) -> dict[str, list[Any]]:
        s = await backend.souls(request)
        return {"facts": await s.facts(soul_id, entity)}

    @app.get(v1 + "/{soul_id}/facts/{entity}/{attribute}/history", tags=["souls"], responses=ERRORS)
    async def history(soul_id: SoulId, entity: str, attribute: str, request: Request) -> dict[str, list[Any]]:
        s = await backend.souls(request)
        return {"versions": await s.fact_history(soul_id, entity, attribute)}

    @app.get(v1 + "/{soul_id}/episodes", tags=["souls"], responses=ERRORS)
    async def episodes(soul_id: SoulId, request: Request, since: str | None = None, until: str | None = None,
                       session: str | None = None, sessions_ago: Annotated[int | None, Query(ge=0)] = None
                       ) -> dict[str, list[Any]]:
        s = await backend.souls(request)
        return {"episodes": await s.episodes(soul_id, time_arg(since), time_arg(until), session, sessions_ago)}

    @app.get(v1 + "/{soul_id}/procedures", tags=["souls"], responses=ERRORS)
    async def procedures(soul_id: SoulId, request: Request, task: str | None = None) -> dict[str, list[Any]]:
        s = await backend.souls(request)
        return {"procedures": await s.procedures(soul_id, task)}

    @app.get(v1 + "/{soul_id}/traces", tags=["souls"], responses=ERRORS)
    async def traces(soul_id: SoulId, request: Request, last: Annotated[int, Query(ge=1, le=10_000)] = 10
                     ) -> dict[str, list[Any]]:
        """The last ``last`` turn traces, oldest first."""
        s = await backend.souls(request)
        return {"traces": await s.traces(soul_id, last)}

    @app.get(v1 + "/{soul_id}/traces/{seq}", tags=["souls"], responses=ERRORS)
    async def trace(soul_id: SoulId, seq: Annotated[int, Path(ge=1)], request: Request) -> dict[str, Any]:
        """One turn's trace by its number (the ``seq`` of its result; its turn id is ``SOUL/SEQ``)."""
        s = await backend.souls(request)
        return await s.trace(soul_id, seq)

    @app.get(v1 + "/{soul_id}/stats", tags=["souls"], responses=ERRORS)
    async def stats(soul_id: SoulId, request: Request) -> dict[str, Any]:
        s = await backend.souls(request)
        return await s.stats(soul_id)

    @app.get(v1 + "/{soul_id}/export", tags=["souls"], response_class=Response,
             responses={200: {"content": {"application/octet-stream": {}}}, **ERRORS})
    async def export(soul_id: SoulId, request: Request) -> Response:
        """The soul's whole memory as msgpack bytes (import them into a new soul)."""
        s = await backend.souls(request)
        return Response(await s.export(soul_id), media_type="application/octet-stream")

    @app.post(v1 + "/{soul_id}/import", tags=["souls"], status_code=201,
              openapi_extra={"requestBody": {"required": True,
                                             "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                                 "format": "binary"}}}}},
              responses=ERRORS)
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

    @app.delete(v1 + "/{soul_id}", tags=["souls"], responses=ERRORS)
    async def forget_all(soul_id: SoulId, request: Request) -> dict[str, Any]:
        """Erase the soul's memory for good: every layer, its traces and buffer; its files are unlinked."""
        s = await backend.souls(request)
        return {"erased": await s.forget_all(soul_id)}

    @app.post(v1 + "/{soul_id}/forget", tags=["souls"], responses=ERRORS)
    async def forget(soul_id: SoulId, body: ForgetIn, request: Request, idempotency_key: KeyHeader = None
                     ) -> ForgetOut:
        """Delete single memories: by id (``ep-3``, ``entity:attribute``, ``task@v2``) and/or every memory whose
        text contains ``query``; traces that held them are redacted."""
        s = await backend.souls(request)
        return ForgetOut(**await s.forget_where(soul_id, body.ids, body.query, idempotency_key, _canon(body)))

    if mcp_app is not None:
        app.mount("/mcp", mcp_app)
    return app




@contextlib.asynccontextmanager
async def no_lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
