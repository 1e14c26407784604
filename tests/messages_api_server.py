"""A scripted local stand-in for the Anthropic Messages API (stdlib only).

``POST /v1/messages`` answers from a queue of :class:`Scripted` responses (status,
JSON body, headers, delay) and records every request it receives, so tests run the
real ``anthropic`` SDK over real HTTP against ``http://127.0.0.1:PORT``.

    with MessagesApiServer() as api:
        api.push(text_message("hello"))
        client = anthropic.Anthropic(api_key="k", base_url=api.base_url)
        ...
        assert api.requests[0].body["model"] == "..."
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ids = itertools.count(1)


@dataclass(frozen=True)
class Scripted:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: dict[str, Any]


def message(content: list[dict[str, Any]], *, model: str = "claude-test-20250101", stop_reason: str = "end_turn",
            input_tokens: int = 10, output_tokens: int = 5) -> dict[str, Any]:
    """A response body shaped exactly like the real API's ``Message``."""
    return {"id": f"msg_{next(_ids):024d}", "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop_reason, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}


def text_message(text: str, **kw: Any) -> Scripted:
    return Scripted(200, message([{"type": "text", "text": text}], **kw))


def tool_message(name: str, tool_input: Any, *, preamble: str = "", **kw: Any) -> Scripted:
    content: list[dict[str, Any]] = [{"type": "text", "text": preamble}] if preamble else []
    content.append({"type": "tool_use", "id": f"toolu_{next(_ids):024d}", "name": name, "input": tool_input})
    return Scripted(200, message(content, stop_reason="tool_use", **kw))


def delayed(scripted: Scripted, delay_s: float) -> Scripted:
    """The same response, sent only after ``delay_s`` seconds."""
    return replace(scripted, delay_s=delay_s)


def error(status: int, etype: str, msg: str = "", *, headers: dict[str, str] | None = None,
          delay_s: float = 0.0) -> Scripted:
    body = {"type": "error", "error": {"type": etype, "message": msg or etype.replace("_", " ")},
            "request_id": f"req_{next(_ids):024d}"}
    return Scripted(status, body, dict(headers or {}), delay_s)


class MessagesApiServer:
    """A threaded HTTP server on an ephemeral 127.0.0.1 port; use as a context manager."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._queue: deque[Scripted] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_raw": raw.decode("utf-8", "replace")}
                with server._lock:
                    server.requests.append(Received("POST", self.path, {k.lower(): v for k, v in self.headers.items()},
                                                    body))
                    scripted = server._queue.popleft() if server._queue else None
                if self.path.split("?")[0] != "/v1/messages":
                    scripted = error(404, "not_found_error", f"no route {self.path}")
                elif scripted is None:
                    scripted = error(500, "api_error", "test server: no scripted response left",
                                     headers={"x-should-retry": "false"})
                if scripted.delay_s and server._stopping.wait(scripted.delay_s):
                    return
                payload = json.dumps(scripted.body).encode()
                try:
                    self.send_response(scripted.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.send_header("request-id", str(scripted.body.get("request_id") or f"req_{next(_ids)}"))
                    for k, v in scripted.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    self.close_connection = True

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="messages-api-server", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def push(self, *responses: Scripted) -> None:
        with self._lock:
            self._queue.extend(responses)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def __enter__(self) -> MessagesApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
