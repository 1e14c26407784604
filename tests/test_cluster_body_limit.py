"""The HTTP service's body limit: sized from the runtime's longest message, 413 naming it above (no Ray; a real
ASGI app and HTTP client, the limit's floor set low so the bodies stay small)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request

from soul_apps.service.body_limit import BYTES_PER_CHAR, MIN_BODY, BodyLimit, max_body_bytes
from soul_runtime.config import TurnConfig

CHARS = 1000


def _app(seen: list[int]) -> Any:
    app = FastAPI()

    @app.post("/turns")
    async def turn(request: Request) -> dict[str, int]:
        text = (await request.json())["text"]
        seen.append(len(text))
        return {"chars": len(text)}
    return BodyLimit(app, lambda: CHARS, min_body=0)


def _post(app: Any, content: bytes | AsyncIterator[bytes]) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.post("/turns", content=content, headers={"content-type": "application/json"})
    return asyncio.run(go())


def test_the_longest_message_in_any_characters_fits_and_more_is_413() -> None:
    seen: list[int] = []
    app = _app(seen)
    limit = max_body_bytes(CHARS, 0)
    widest = json.dumps({"text": "\U0001f600" * CHARS}).encode()  # ensure_ascii: 12 bytes a character
    assert len(widest) >= BYTES_PER_CHAR * CHARS
    r = _post(app, widest)
    assert r.status_code == 200 and r.json() == {"chars": CHARS}

    over = json.dumps({"text": "x" * (limit + 1)}).encode()
    r = _post(app, over)
    assert r.status_code == 413 and r.json()["error"]["type"] == "InvalidInput"
    msg = r.json()["error"]["message"]
    assert f"{len(over)} bytes" in msg and f"limit of {limit} bytes" in msg and f"{CHARS} characters" in msg
    assert seen == [CHARS]  # the route never saw the large body


def test_a_body_without_a_stated_length_is_counted() -> None:
    seen: list[int] = []
    app = _app(seen)
    limit = max_body_bytes(CHARS, 0)

    def chunks(total: int) -> AsyncIterator[bytes]:
        async def gen() -> AsyncIterator[bytes]:
            body = json.dumps({"text": "y" * total}).encode()
            for i in range(0, len(body), 65536):
                yield body[i:i + 65536]
        return gen()
    r = _post(app, chunks(CHARS))
    assert r.status_code == 200 and r.json() == {"chars": CHARS}
    r = _post(app, chunks(limit))
    assert r.status_code == 413 and f"limit of {limit} bytes" in r.json()["error"]["message"]
    assert seen == [CHARS]


def test_the_limit_follows_the_runtimes_message_limit() -> None:
    chars = TurnConfig().max_text_chars  # whatever the runtime accepts today
    assert max_body_bytes(chars) >= BYTES_PER_CHAR * chars and max_body_bytes(chars) >= MIN_BODY
    assert max_body_bytes(10 * MIN_BODY) == BYTES_PER_CHAR * 10 * MIN_BODY + 2**20  # grows with it
