"""Each HTTP request as an OpenTelemetry span, when traces are on (:mod:`soul_runtime.telemetry`): a child of the
request's ``traceparent`` (W3C; a new trace without one), current while the request runs, so the runtime calls it
makes (``soul turn`` …) and, through them, the host's and the store shards' spans are in the same trace.

FastAPI makes these spans itself since it has ``fastapi.telemetry``; :class:`RequestSpans` does it on the versions
before."""

from __future__ import annotations

import importlib.util

from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from soul_runtime import telemetry


class RequestSpans:
    """ASGI middleware: a server span per HTTP request, named ``METHOD /route/{template}`` once routed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
        method = scope.get("method", "GET")
        status = [0]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        with telemetry.span(method, parent=telemetry.context_of(headers), kind="server",
                            attributes={"http.request.method": method, "url.path": scope.get("path", ""),
                                        "url.scheme": scope.get("scheme", "http")}) as span:
            try:
                await self.app(scope, receive, sending)
            finally:
                route = getattr(scope.get("route"), "path", None)  # the matched route's template (FastAPI)
                if span is not None:
                    if route:
                        span.update_name(f"{method} {route}")
                        span.set_attribute("http.route", route)
                    if status[0]:
                        span.set_attribute("http.response.status_code", status[0])
                        if status[0] >= 500:
                            from opentelemetry.trace import StatusCode
                            span.set_status(StatusCode.ERROR)


def add_request_spans(app: Starlette) -> bool:
    """When traces are on, set up this process's tracer (the global provider, from the variables) before the first
    request, and have each request be a span: FastAPI's own (``fastapi.telemetry``, which makes them with the global
    provider: the request, its route's operations) where the installed FastAPI has them, else :class:`RequestSpans`
    added to the app (outside the middleware added so far). True when added."""
    if telemetry.tracer() is None or importlib.util.find_spec("fastapi.telemetry") is not None:
        return False
    app.add_middleware(RequestSpans)
    return True
