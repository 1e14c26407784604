"""How large a request the HTTP service reads: sized from the runtime's longest message, answered 413 above it.

The runtime accepts a message (a turn's text, an observed message) of up to ``TurnConfig.max_text_chars``
characters; its JSON body is larger than its characters (``\\uXXXX`` escapes: up to 12 bytes for a character
outside the Basic Multilingual Plane, sent as two escaped UTF-16 halves). The service reads a body of up to
:func:`max_body_bytes` bytes, enough for the longest message written in any characters beside the rest of a
request and never less than :data:`MIN_BODY` (an export being imported); a larger body is refused with 413,
``{"error": {"type": "InvalidInput", "message": ...}}`` naming both limits, before any of it is read when it
states its length, else as soon as it passes the limit. Nothing here is specific to a route.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

MIN_BODY = 64 * 2**20
"""The smallest limit: an import (``POST /v1/souls/{id}/import``) carries a whole soul's export."""
BYTES_PER_CHAR = 12
"""The most bytes JSON takes for one character of a text (a non-BMP character as two ``\\uXXXX`` escapes)."""
ENVELOPE = 2**20
"""Room for the rest of a request beside its longest message (other fields, other messages)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def max_body_bytes(max_text_chars: int, min_body: int = MIN_BODY) -> int:
    """The body limit for a runtime whose longest message is ``max_text_chars`` characters."""
    return max(min_body, BYTES_PER_CHAR * int(max_text_chars) + ENVELOPE)


def too_large(size: int | None, limit: int, max_text_chars: int) -> dict[str, Any]:
    """The 413 answer's body."""
    what = f"a request body of {size} bytes" if size is not None else "a request body"
    return {"error": {"type": "InvalidInput", "message": (
        f"{what} is over this service's limit of {limit} bytes (a message of up to {max_text_chars} characters, "
        "the runtime's max_text_chars, fits in any characters); send less at once")}}


class BodyLimit:
    """ASGI middleware: 413 for a request body over ``max_body_bytes(max_text_chars())``; ``max_text_chars`` is
    asked per request (the runtime's configured value once it is known)."""

    def __init__(self, app: ASGIApp, max_text_chars: Callable[[], int], min_body: int = MIN_BODY) -> None:
        self.app = app
        self.max_text_chars = max_text_chars
        self.min_body = min_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chars = int(self.max_text_chars())
        limit = max_body_bytes(chars, self.min_body)
        headers = dict(scope.get("headers") or [])
        stated = headers.get(b"content-length")
        if stated is not None:
            try:
                size: int | None = int(stated)
            except ValueError:
                size = None
            if size is not None and size > limit:
                await _answer(send, too_large(size, limit, chars))
                return
            await self.app(scope, receive, send)  # the server reads no more than the stated length
            return
        # no stated length (chunked): read it here, up to the limit, then hand it on
        chunks: list[Message] = []
        seen = 0
        while True:
            message = await receive()
            chunks.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > limit:
                await _answer(send, too_large(None, limit, chars))
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return chunks.pop(0) if chunks else await receive()
        await self.app(scope, replay, send)


async def _answer(send: Send, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": raw})
