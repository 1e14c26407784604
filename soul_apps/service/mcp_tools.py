"""The Model Context Protocol server: a soul's memory as tools an agent calls (official ``mcp`` SDK).

Served two ways: over streamable HTTP at ``/mcp/`` of the service (stateless, so any replica answers any
request; the bearer key names the tenant, as for ``/v1``), and over stdio by ``soul mcp --soul ID`` for
desktop clients (one soul, one tenant or none).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings

from soul_runtime.errors import InvalidInput

from .souls_api import TenantSouls, Unauthorized, error_body

INSTRUCTIONS = """Long-term memory for you, kept across conversations by soul-runtime. Each soul is one memory
(one agent, or one agent per user). Call `recall` before you answer anything that may depend on what was said
or decided before; call `remember` with what the user tells you that should outlast this conversation (facts
about people, projects and preferences, decisions, how a task was done); call `facts` to see what is known about
one entity; call `forget` when the user asks you to forget something."""

Resolve = Callable[[Context | None, str | None], Awaitable[tuple[TenantSouls, str]]]
"""(the request's context, the soul id asked for) -> (the tenant's souls, the soul id to use)."""


def _fail(e: BaseException, souls: TenantSouls | None, data_dir: str) -> ToolError:
    err = error_body(e, souls.scope if souls is not None else None, data_dir)["error"]
    return ToolError(f"{err['type']}: {err['message']}")


def build_mcp(resolve: Resolve, data_dir: str, *, soul_optional: bool = False) -> MCPServer:
    server = MCPServer(name="soul-runtime", instructions=INSTRUCTIONS, log_level="WARNING")
    sid_doc = ("the soul (memory) to use; leave out to use the soul this server was started for"
               if soul_optional else "the soul (memory) to use, e.g. the agent's or the user's name")

    async def call(ctx: Context | None, soul_id: str | None, fn: Callable[[TenantSouls, str], Awaitable[Any]]) -> Any:
        souls = None
        try:
            souls, sid = await resolve(ctx, soul_id)
            return await fn(souls, sid)
        except ToolError:
            raise
        except Exception as e:
            raise _fail(e, souls, data_dir) from None

    @server.tool(description=(
        "Store something in long-term memory. Call it with what the user said that should be remembered "
        "beyond this conversation: facts about people, projects, preferences and decisions, or how a task was "
        "done. Pass `text` for one statement (spoken by `speaker`, default 'user'), or `messages` "
        "([{speaker, text}]) for a stretch of conversation. Returns what was written. " + f"soul_id: {sid_doc}."))
    async def remember(ctx: Context, soul_id: str | None = None, text: str | None = None,
                       messages: list[dict[str, str]] | None = None, speaker: str = "user") -> dict[str, Any]:
        if (text is None) == (messages is None):
            raise ToolError("InvalidInput: give either text or messages")
        now = time.time()
        raw = [{"speaker": speaker, "text": text}] if text is not None else list(messages or [])
        msgs = []
        for i, m in enumerate(raw):
            if not isinstance(m, dict):
                raise ToolError(f"InvalidInput: message {i} must be an object with speaker and text")
            msgs.append({"speaker": m.get("speaker", speaker), "text": m.get("text"),
                         "id": m.get("id") or f"mcp-{uuid.uuid4().hex[:16]}", "at": m.get("at", now)})

        async def run(s: TenantSouls, sid: str) -> dict[str, Any]:
            res = await s.observe(sid, msgs, at=now)
            return {"turn_id": res["turn_id"], "writes": [{"store": w["store"], "op": w["op"], "key": w["key"]}
                                                          for w in res["writes"]]}
        return dict(await call(ctx, soul_id, run))

    @server.tool(description=(
        "Search long-term memory. Call it before answering anything that may depend on earlier conversations: "
        "what the user told you, decided, prefers, or how a task was done before. Returns the best `k` memories "
        "(episodes, facts, procedures) with their ids and sources. " + f"soul_id: {sid_doc}."))
    async def recall(ctx: Context, query: str, soul_id: str | None = None, k: int = 10) -> dict[str, Any]:
        async def run(s: TenantSouls, sid: str) -> dict[str, Any]:
            items = await s.recall(sid, query, k)
            return {"items": [{"id": i["id"], "store": i["store"], "text": i["text"], "score": i.get("score")}
                              for i in items]}
        return dict(await call(ctx, soul_id, run))

    @server.tool(description=(
        "The facts long-term memory holds now, about one entity (a person, project, system) or about all when "
        "`entity` is left out. Call it to check what is known before you state or change a fact. "
        + f"soul_id: {sid_doc}."))
    async def facts(ctx: Context, soul_id: str | None = None, entity: str | None = None) -> dict[str, Any]:
        async def run(s: TenantSouls, sid: str) -> dict[str, Any]:
            return {"facts": await s.facts(sid, entity)}
        return dict(await call(ctx, soul_id, run))

    @server.tool(description=(
        "Delete memories for good. Call it when the user asks you to forget something: pass `ids` (from recall "
        "or facts, e.g. 'ep-3' or 'maya:employer') and/or `query` (every memory whose text contains this "
        "phrase). Returns the ids deleted. " + f"soul_id: {sid_doc}."))
    async def forget(ctx: Context, soul_id: str | None = None, ids: list[str] | None = None,
                     query: str | None = None) -> dict[str, Any]:
        async def run(s: TenantSouls, sid: str) -> dict[str, Any]:
            res = await s.forget_where(sid, ids, query)
            return {"deleted": res["deleted"], "turn_id": res["turn_id"]}
        return dict(await call(ctx, soul_id, run))

    return server


def http_resolver(tenant_of: Callable[[str | None], str], souls_for: Callable[[str], Awaitable[TenantSouls]]
                  ) -> Resolve:
    """For ``/mcp/``: the tenant from the request's bearer key; ``soul_id`` is needed."""
    async def resolve(ctx: Context | None, soul_id: str | None) -> tuple[TenantSouls, str]:
        headers = ctx.headers if ctx is not None else None
        tenant = tenant_of((headers or {}).get("authorization"))
        if soul_id is None:
            raise InvalidInput("soul_id is needed")
        return await souls_for(tenant), soul_id
    return resolve


def fixed_resolver(souls: TenantSouls, soul_id: str) -> Resolve:
    """For ``soul mcp --soul ID``: that one soul."""
    async def resolve(ctx: Context | None, asked: str | None) -> tuple[TenantSouls, str]:
        if asked is not None and asked != soul_id:
            raise InvalidInput(f"this server serves soul '{soul_id}' only")
        return souls, soul_id
    return resolve


def http_endpoint(server: MCPServer, tenant_of: Callable[[str | None], str]) -> tuple[Any, Any]:
    """(the ASGI app to mount at ``/mcp``, the session manager to run in the app's lifespan). A request without
    a valid key is answered 401 before the MCP layer sees it."""
    server.streamable_http_app(stateless_http=True, json_response=True,
                               transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    manager = server.session_manager

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        auth = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"authorization"), None)
        try:
            tenant_of(auth)
        except Unauthorized as e:
            body = json.dumps({"error": {"type": "Unauthorized", "message": str(e)}}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": body})
            return
        await manager.handle_request(scope, receive, send)
    return app, manager
