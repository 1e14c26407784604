"""Cross-origin requests: which web pages on other origins may call the service from a browser.

None by default: the inspector at ``/ui/`` is served from the service's own origin and needs no CORS, and a
server-side client (Python, Node) sends no ``Origin``. A page on another origin (a web app calling the service with
the TypeScript client) is allowed only when its origin is named (``soul serve --cors-origin URL``, repeated, or the
env ``SOUL_CORS_ORIGINS``; ``cors_origins`` in a Serve config file's ``args``). The key still goes in
``Authorization`` on every request: no cookie is used, so credentials are never allowed. A request from an origin
that is not named gets no CORS header, and the browser keeps its answer from the page.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from fastapi import FastAPI
from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import PlainTextResponse, Response
from starlette.types import Message, Send

from soul_runtime.errors import InvalidInput

ENV = "SOUL_CORS_ORIGINS"
"""``soul serve``'s default for ``--cors-origin``: origins separated by commas or spaces."""
ANY = "*"
"""Every origin (any page may send requests; each still needs a tenant's key)."""
METHODS = ("GET", "POST", "DELETE")
"""The methods of the routes (``/v1``, ``/mcp/``)."""
ALLOW_HEADERS = ("Authorization", "Content-Type", "Idempotency-Key", "Mcp-Session-Id", "Mcp-Protocol-Version",
                 "Last-Event-ID", "traceparent", "tracestate")
"""What a page may send beyond the headers a browser always allows: the key, a JSON or binary body, the retry key,
MCP's session headers, and a trace context."""
EXPOSE_HEADERS = ("Retry-After", "Mcp-Session-Id", "WWW-Authenticate")
"""What a page may read beyond the always-readable ones: how long to wait after a 429, MCP's session id."""
MAX_AGE_S = 600
"""How long a browser may reuse a preflight's answer."""
_ORIGIN = re.compile(r"https?://(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(:([0-9]{1,5}))?", re.IGNORECASE)


def check_origins(origins: Iterable[str]) -> tuple[str, ...]:
    """The origins in the form a browser sends them (``scheme://host[:port]``, lower-cased scheme and host, no
    path), each once; ``*`` for every origin. InvalidInput names the first that is not an origin."""
    out: list[str] = []
    for raw in origins:
        o = raw.strip()
        if o != ANY:
            m = _ORIGIN.fullmatch(o.rstrip("/"))
            if m is None or int(m.group(3) or 0) > 65535:
                raise InvalidInput(f"not an origin: {raw!r} (scheme://host[:port], e.g. https://app.example.com, "
                                   "or * for every origin)")
            scheme, rest = o.rstrip("/").split("://", 1)
            o = f"{scheme.lower()}://{rest.lower()}"
        if o not in out:
            out.append(o)
    return tuple(out)


def parse_env(value: str | None) -> tuple[str, ...]:
    """The origins of :data:`ENV`'s value (commas or spaces between them), checked."""
    return check_origins(o for o in re.split(r"[,\s]+", value or "") if o)


class NamedOrigins(CORSMiddleware):
    """Starlette's CORS middleware, except that an origin it does not allow gets no ``Access-Control-*`` header at
    all, only ``Vary: Origin`` (Starlette sends such an origin the exposed headers and, on a preflight, the methods and
    headers the API takes: nothing a browser acts on without an allowed origin, and nothing that page needs)."""

    async def send(self, message: Message, send: Send, request_headers: Headers) -> None:
        origin = request_headers.get("Origin")
        if message["type"] == "http.response.start" and origin is not None and not self.is_allowed_origin(origin):
            message.setdefault("headers", [])
            MutableHeaders(scope=message).add_vary_header("Origin")
            await send(message)
            return
        await super().send(message, send, request_headers)

    def preflight_response(self, request_headers: Headers) -> Response:
        if not self.is_allowed_origin(request_headers["origin"]):
            return PlainTextResponse("Disallowed CORS origin", status_code=400, headers={"Vary": "Origin"})
        return super().preflight_response(request_headers)


def add_cors(app: FastAPI, origins: Iterable[str]) -> None:
    """Put Starlette's CORS middleware for ``origins`` (checked) around everything ``app`` has so far (added last,
    it runs first: a preflight is answered before any key is asked for, and every answer of the app, an error's
    too, carries the headers); nothing when there are none."""
    allowed = check_origins(origins)
    if allowed:
        app.add_middleware(NamedOrigins, allow_origins=list(allowed), allow_methods=list(METHODS),
                           allow_headers=list(ALLOW_HEADERS), expose_headers=list(EXPOSE_HEADERS),
                           allow_credentials=False, max_age=MAX_AGE_S)
