"""A local stand-in for the Anthropic Messages API (stdlib only), for tests and ``soul bench claude``.

``POST /v1/messages`` answers from a queue of :class:`Scripted` responses (status,
JSON body, headers, delay) — or, when the queue is empty and a ``responder`` is set, from
``responder(request body)`` — and records every request it receives, so tests and benchmarks
run the real ``anthropic`` SDK over real HTTP against ``http://127.0.0.1:PORT``.

With ``count_tokens=True`` the server fills in ``usage`` itself, the way the API reports it:
input tokens are characters / 4 of the request's tools, system and messages; a prefix that
ends at a ``cache_control`` mark and is at least ``cache_min_tokens`` long is written to the
cache the first time (``cache_creation_input_tokens``) and read from it afterwards
(``cache_read_input_tokens``); the rest is ``input_tokens``.

    with MessagesApiServer() as api:
        api.push(text_message("hello"))
        client = anthropic.Anthropic(api_key="k", base_url=api.base_url)
        ...
        assert api.requests[0].body["model"] == "..."
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

_ids = itertools.count(1)
S = TypeVar("S", bound="ScriptedApiServer")


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


def char_tokens(obj: Any) -> int:
    return (len(json.dumps(obj, sort_keys=True, ensure_ascii=False)) + 3) // 4 if obj else 0


def prompt_usage(body: dict[str, Any], cache: set[str], cache_min_tokens: int) -> dict[str, int]:
    """The input side of ``usage`` for a request, with the prompt cache emulated (``cache`` is updated).

    The prompt is tools, then system blocks, then messages; the cached prefix ends at the last
    block carrying ``cache_control`` among tools and system."""
    tools = list(body.get("tools") or [])
    system = body.get("system") or []
    blocks = [{"type": "text", "text": system}] if isinstance(system, str) else list(system)
    marks = [i for i, b in enumerate(tools) if isinstance(b, dict) and b.get("cache_control")]
    smarks = [i for i, b in enumerate(blocks) if isinstance(b, dict) and b.get("cache_control")]
    prefix: list[Any] = []
    if smarks:
        prefix = tools + blocks[: smarks[-1] + 1]
    elif marks:
        prefix = tools[: marks[-1] + 1]
    total = char_tokens(tools) + char_tokens(blocks) + char_tokens(body.get("messages"))
    n = char_tokens(prefix)
    if not prefix or n < cache_min_tokens:
        return {"input_tokens": total, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
    key = hashlib.sha256((str(body.get("model")) + json.dumps(prefix, sort_keys=True)).encode()).hexdigest()
    hit = key in cache
    cache.add(key)
    return {"input_tokens": max(0, total - n), "cache_read_input_tokens": n if hit else 0,
            "cache_creation_input_tokens": 0 if hit else n}


class _Server(ThreadingHTTPServer):
    """A thread per connection (daemon threads: a request asleep in its delay never holds up the exit), and a
    listen backlog for a thousand clients connecting at once (the default is 5)."""

    daemon_threads = True
    request_queue_size = 4096


class ScriptedApiServer:
    """A threaded HTTP server on an ephemeral 127.0.0.1 port answering ``POST`` on one route from a script;
    use as a context manager. The Messages API and the chat-completions stand-ins
    (:mod:`soul_apps.bench.chat_api`) are this server with their route, usage and error bodies.

    ``delay_s`` delays every answer (a model's latency); ``responder`` answers when the
    script queue is empty; ``count_tokens`` fills in ``usage`` (:meth:`fill_usage`). ``port``: the port to
    listen on (0: an ephemeral one); ``record=False`` keeps only the count of requests (``received``), not
    the requests themselves (a long benchmark). ``in_flight``: requests on the route being answered now.
    ``GET`` on any path and ``POST`` off the route go to :meth:`control` (404 unless a subclass answers)."""

    route = "/v1/messages"
    name = "messages-api-server"

    def __init__(self, *, responder: Callable[[dict[str, Any]], Scripted] | None = None, delay_s: float = 0.0,
                 count_tokens: bool = False, cache_min_tokens: int = 1024, port: int = 0,
                 record: bool = True) -> None:
        self.requests: list[Received] = []
        self.record = record
        self.received = 0
        self.in_flight = 0
        self.responder = responder
        self.delay_s = delay_s
        self.count_tokens = count_tokens
        self.cache_min_tokens = cache_min_tokens
        self.cache: set[str] = set()
        self._queue: deque[Scripted] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body go out in two writes: with Nagle on, the body would wait for the client's
            # delayed ACK of the headers (about 40 ms on Linux) on every answer of a busy keep-alive connection
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                self._answer(server.control("GET", self.path, {}) or server.error(404, "not_found_error",
                                                                                  f"no route {self.path}"))

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_raw": raw.decode("utf-8", "replace")}
                routed = self.path.split("?")[0] == server.route
                if not routed:
                    answer = server.control("POST", self.path, body)
                    if answer is not None:
                        self._answer(answer)
                        return
                with server._lock:
                    server.received += 1
                    if server.record:
                        server.requests.append(Received("POST", self.path,
                                                        {k.lower(): v for k, v in self.headers.items()}, body))
                    scripted = server._queue.popleft() if server._queue else None
                    if routed:
                        server.in_flight += 1
                try:
                    self._routed(routed, scripted, body)
                finally:
                    if routed:
                        with server._lock:
                            server.in_flight -= 1

            def _routed(self, routed: bool, scripted: Scripted | None, body: dict[str, Any]) -> None:
                if scripted is None and server.responder is not None and routed:
                    scripted = server.responder(body)
                if scripted is not None and server.count_tokens and scripted.status == 200 and "usage" in scripted.body:
                    with server._lock:
                        scripted = replace(scripted, body={**scripted.body,
                                                           "usage": server.fill_usage(body, scripted.body["usage"])})
                if scripted is not None and server.delay_s:
                    scripted = replace(scripted, delay_s=scripted.delay_s + server.delay_s)
                if not routed:
                    scripted = server.error(404, "not_found_error", f"no route {self.path}")
                elif scripted is None:
                    scripted = server.error(500, "api_error", "test server: no scripted response left",
                                            headers={"x-should-retry": "false"})
                if scripted.delay_s and server._stopping.wait(scripted.delay_s):
                    return
                self._answer(scripted)

            def _answer(self, scripted: Scripted) -> None:
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

        self._httpd = _Server(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=self.name, daemon=True)

    def control(self, method: str, path: str, body: dict[str, Any]) -> Scripted | None:
        """The answer to a request off the route (``GET`` anywhere, ``POST`` elsewhere), sent at once; None: 404."""
        return None

    def fill_usage(self, body: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
        """``usage`` with the input side counted from the request ``body`` (under the server's lock)."""
        return {**usage, **prompt_usage(body, self.cache, self.cache_min_tokens)}

    def error(self, status: int, etype: str, msg: str = "", *, headers: dict[str, str] | None = None) -> Scripted:
        return error(status, etype, msg, headers=headers)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def push(self, *responses: Scripted) -> None:
        with self._lock:
            self._queue.extend(responses)

    def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies received so far, in order."""
        with self._lock:
            return [r.body for r in self.requests]

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def __enter__(self: S) -> S:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class MessagesApiServer(ScriptedApiServer):
    """The Messages API stand-in (``POST /v1/messages``)."""
