"""What the adapters of remote model APIs share: pinned model ids, option checks, retries and usage sums.

:class:`RemoteModel` is the base of :class:`~soul_runtime.models.claude.AnthropicModel` and
:class:`~soul_runtime.models.openai_chat.OpenAIChatModel`. Both SDKs raise the same kinds of errors (a
status error with the response's headers and body, a timeout, a connection error, a base error), named by
an :class:`SdkErrors`. Retries are ours, not the SDK's (its client runs with ``max_retries=0``): 429,
408/409, 5xx, connection errors and timeouts are retried ``max_retries`` times with exponential backoff,
honouring the server's ``retry-after-ms`` / ``retry-after`` and ``x-should-retry`` headers; a busy API (429, 503,
529) is waited for until ``deadline_s`` has passed since the call began, however many tries that takes. A final
timeout is :class:`ModelTimeout`; every other failure is a one-line :class:`ModelError`.

Each operation is written once, as steps (:mod:`soul_runtime.steps`) that yield the API request, a
:class:`~soul_runtime.steps.Call` of the SDK client's ``create`` (target :data:`CLIENT`), and the pauses between
tries (:class:`~soul_runtime.steps.Pause`), run by the one pair of drivers of :mod:`soul_runtime.steps`: the
blocking methods send them with the SDK's client; the model's
:meth:`~RemoteModel.asynchronous` view awaits them with the SDK's async client (a turn waiting for the API holds
no thread), at most ``max_concurrency`` requests at a time per event loop, spread over async clients of at most
:data:`POOL_CONNECTIONS` connections each (an HTTP client's CPU per request grows with the size of its pool).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import random
import threading
import time
import weakref
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from anthropic.types import ToolParam

from soul_runtime.errors import ConfigError, ModelError, ModelTimeout
from soul_runtime.models.base import (
    AsyncLanguageModel,
    ChatMessage,
    Exchange,
    LanguageModel,
    MemoryDecision,
    ModelReply,
    ObserveWindow,
    ReplyRequest,
    TaskClassification,
    Usage,
    WindowDecision,
)
from soul_runtime.models.claude_tools import (
    CLASSIFY_SYSTEM,
    CLASSIFY_TOOL,
    MEMORY_SYSTEM,
    MEMORY_TOOL,
    WINDOW_SYSTEM,
    WINDOW_TOOL,
    exchange_prompt,
    parse_decision,
    parse_window,
    window_prompt,
)
from soul_runtime.models.text import one_line
from soul_runtime.steps import Call, Pause, run, run_steps, run_steps_async

R = TypeVar("R")
RETRY_STATUSES = frozenset({408, 409, 429})
BUSY_STATUSES = frozenset({429, 503, 529})
"""The API is busy: tried again until the call's deadline, not only ``max_retries`` times."""
MAX_BACKOFF_S = 8.0
MAX_RETRY_AFTER_S = 60.0


def check_model_id(name: str, model_id: object, example: str) -> str:
    """A pinned model id: non-empty, no surrounding spaces, not a moving ``latest`` alias or tag."""
    if not isinstance(model_id, str) or not model_id.strip() or model_id != model_id.strip():
        raise ConfigError(f"{name} must be a non-empty pinned model id, got {model_id!r}")
    if model_id.endswith(("-latest", ":latest")):
        raise ConfigError(f"{name} {model_id!r} is a moving alias; pin a model such as {example!r}")
    return model_id


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """The server's ``retry-after-ms`` / ``retry-after`` in seconds (at most MAX_RETRY_AFTER_S), or None."""
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            seconds = float(raw) * scale
        except ValueError:
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return min(seconds, MAX_RETRY_AFTER_S)
    return None


def setting(args: Mapping[str, str], name: str, env: Mapping[str, str], var: str) -> str | None:
    """A setting from ``args[name]``, else the environment variable ``var``; None when neither is set."""
    raw = args.get(name)
    if raw is None:
        raw = env.get(var)
    return raw.strip() or None if raw is not None else None


def number_setting(value: str | None, name: str, kind: type[int] | type[float], default: float) -> Any:
    if value is None:
        return default
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"{name} must be a {'whole number' if kind is int else 'number'}, got {value!r}") from None


def error_detail(body: object) -> tuple[str, str]:
    """(type, message) of an API error body, whether the SDK kept the envelope (``{"error": {...}}``) or not."""
    err: Any = body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
    if not isinstance(err, dict):
        return "unknown_error", ""
    etype = err.get("type") or err.get("code") or "unknown_error"
    return str(etype), one_line(err.get("message") or "", 160)


@dataclass(frozen=True)
class SdkErrors:
    """An SDK's error classes, as :meth:`RemoteModel._send` tells them apart."""

    api: str  # how messages name the API: "Anthropic API", "OpenAI-compatible API"
    status: type[Exception]  # .status_code, .response.headers, .body
    timeout: type[Exception]
    connection: type[Exception]
    base: type[Exception]


CLIENT = "client"
"""The target of a remote model's API request: ``Call(CLIENT, "create", (), kwargs)`` is one request, the SDK
client's ``with_raw_response`` create (:meth:`RemoteModel._raw_create`) with ``kwargs`` (an awaitable with its
async client)."""

Ops = Generator[Any, Any, R]
"""An operation of a remote model as steps: yields API requests (:data:`CLIENT` calls) and pauses, returns the
answer."""


async def _awaited(answer: Any) -> Any:
    return await answer


class RemoteModel(LanguageModel):
    """A model behind an HTTP API: validated options, our retry loop, running usage sums (thread-safe), and
    the memory operations as one forced tool call each (:mod:`soul_runtime.models.claude_tools`). An adapter
    implements ``_reply`` and ``_tool_call`` as steps, and ``_async_client`` (see the module's doc)."""

    offline = False
    errors: SdkErrors
    async_transport = "httpx"
    """The HTTP client of the async requests (:func:`http_client`)."""
    _memory_model_id: str
    _client: Any

    def __init__(self, *, timeout_s: float, max_retries: int, max_tokens: int, memory_max_tokens: int,
                 retry_base_delay_s: float, sleep: Callable[[float], None], deadline_s: float = 120.0,
                 max_concurrency: int = 1024) -> None:
        for name, num in (("timeout_s", timeout_s), ("retry_base_delay_s", retry_base_delay_s),
                          ("deadline_s", deadline_s)):
            if isinstance(num, bool) or not isinstance(num, (int, float)) or not math.isfinite(num) or num < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {num!r}")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s!r}")
        for name, n, low in (("max_retries", max_retries, 0), ("max_tokens", max_tokens, 1),
                             ("memory_max_tokens", memory_max_tokens, 64), ("max_concurrency", max_concurrency, 1)):
            if isinstance(n, bool) or not isinstance(n, int) or n < low:
                raise ConfigError(f"{name} must be a whole number >= {low}, got {n!r}")
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.max_tokens = max_tokens
        self.memory_max_tokens = memory_max_tokens
        self.retry_base_delay_s = float(retry_base_delay_s)
        self.deadline_s = float(deadline_s)
        self.max_concurrency = max_concurrency
        self._sleep = sleep
        self._view: AsyncRemoteModel | None = None
        self._lock = threading.Lock()
        self.usage_total = Usage()
        self.usage_by_model: dict[str, Usage] = {}

    @property
    def memory_model_id(self) -> str:
        return self._memory_model_id

    # ---- the memory operations ---------------------------------------------------------

    # ---- the four calls, blocking (the asynchronous view awaits the same steps) ----------------

    def reply(self, request: ReplyRequest) -> ModelReply:
        return self._run(self._reply(request))

    def decide(self, exchange: Exchange) -> MemoryDecision:
        return self._run(self._decide(exchange))

    def decide_window(self, window: ObserveWindow) -> WindowDecision:
        """One call for the window; an answer cut off at ``memory_max_tokens`` is retried as two half windows."""
        return self._run(self._decide_window(window))

    def classify_task(self, text: str, known: tuple[str, ...]) -> TaskClassification:
        return self._run(self._classify_task(text, known))

    def asynchronous(self) -> AsyncRemoteModel:
        """This model with coroutine methods (the same retries, usage sums and client settings)."""
        with self._lock:
            if self._view is None:
                self._view = AsyncRemoteModel(self)
            return self._view

    def _run(self, ops: Ops[R]) -> R:
        return run_steps(ops, self._perform)  # a request's error goes into the retry loop

    def _perform(self, step: Call | Pause) -> Any:
        if isinstance(step, Pause):
            return self._sleep(step.seconds)
        answer = self._raw_create(self._client)(**step.kwargs)
        return run(_awaited(answer)) if inspect.isawaitable(answer) else answer

    sdk: Any
    """The SDK's module (``anthropic``, ``openai``): its async client class, HTTP client and connection limits."""
    async_client_class: str
    _settings: dict[str, Any] | None
    """What the model's own client was made with (None: an injected client)."""

    def _raw_create(self, client: Any) -> Any:
        """The client's ``with_raw_response`` create method (a coroutine function on an async client)."""
        raise NotImplementedError

    def _injected(self, client: Any) -> Any:
        """A client given to the model (it keeps its credentials; the retry loop and the timeout are ours), or
        ConfigError when it is not a client of this model's SDK."""
        try:
            ok = callable(self._raw_create(client))
        except AttributeError:
            ok = False
        if not ok:
            raise ConfigError(f"client must be an {self.sdk.__name__} SDK client (with a with_raw_response create), "
                              f"got {type(client).__name__}")
        return client.with_options(timeout=self.timeout_s, max_retries=0) \
            if callable(getattr(client, "with_options", None)) else client

    def _async_client(self) -> Any:
        """An SDK async client for this model's settings, on a pool of at most :data:`POOL_CONNECTIONS`
        connections; an injected async client as it is; None for an injected blocking client (sent on a thread)."""
        if inspect.iscoroutinefunction(self._raw_create(self._client)):  # an SDK async client
            return self._client
        if self._settings is None:
            return None
        limits = self.sdk.DEFAULT_CONNECTION_LIMITS  # the SDK's own HTTP library's type
        size = min(POOL_CONNECTIONS, self.max_concurrency)
        pool = type(limits)(max_connections=size, max_keepalive_connections=size,
                            keepalive_expiry=limits.keepalive_expiry)
        return getattr(self.sdk, self.async_client_class)(**self._settings, timeout=self.timeout_s, max_retries=0,
                                                          http_client=http_client(self.sdk, pool, self.async_transport))

    # ---- the operations, as steps ------------------------------------------------------

    def _reply(self, request: ReplyRequest) -> Ops[ModelReply]:
        raise NotImplementedError

    def _decide(self, exchange: Exchange) -> Ops[MemoryDecision]:
        data, usage, _ = yield from self._tool_call(MEMORY_SYSTEM, exchange_prompt(exchange), MEMORY_TOOL)
        d = parse_decision(data, tuple(exchange.message_ids))
        return MemoryDecision(d.persist, d.categories, d.reason, d.extraction, usage, self.memory_model_id)

    def _decide_window(self, window: ObserveWindow) -> Ops[WindowDecision]:
        if not any(m.judge for m in window.messages):
            return WindowDecision(tuple(MemoryDecision(False, reason="context only") for _ in window.messages),
                                  Usage(), self.memory_model_id)
        data, usage, cut = yield from self._tool_call(WINDOW_SYSTEM, window_prompt(window), WINDOW_TOOL,
                                                      self.memory_max_tokens)
        if cut and len(window.messages) > 1:  # the answer did not fit: judge the halves apart
            half = len(window.messages) // 2
            first = ObserveWindow(window.messages[:half], window.earlier, window.persona, window.history)
            earlier = (*window.earlier, *(ChatMessage("user", m.text, m.id, m.speaker) for m in first.messages))
            second = ObserveWindow(window.messages[half:], earlier, window.persona, window.history)
            a = yield from self._decide_window(first)
            b = yield from self._decide_window(second)
            return WindowDecision(a.decisions + b.decisions, usage + a.usage + b.usage, self.memory_model_id)
        if cut:
            raise ModelError(f"{self.memory_model_id} answer for one message exceeded memory_max_tokens="
                             f"{self.memory_max_tokens}")
        return WindowDecision(tuple(parse_window(data, window)), usage, self.memory_model_id)

    def _classify_task(self, text: str, known: tuple[str, ...]) -> Ops[TaskClassification]:
        if not known or not text.strip():
            return TaskClassification(None, 0.0)
        prompt = ("Known task classes:\n" + "\n".join(f"- {k}" for k in known)
                  + f"\n\n<request>\n{text}\n</request>")
        data, usage, _ = yield from self._tool_call(CLASSIFY_SYSTEM, prompt, CLASSIFY_TOOL)
        if "task_class" not in data:
            raise ModelError(f"classification tool input has no 'task_class': {one_line(data, 120)}")
        raw, conf = data.get("task_class"), data.get("confidence")
        task_class = raw.strip() if isinstance(raw, str) and raw.strip() in known else None
        if task_class is None:
            return TaskClassification(None, 0.0, usage=usage)
        if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not math.isfinite(conf):
            conf = 0.5
        return TaskClassification(task_class, min(1.0, max(0.0, float(conf))), usage=usage)

    def _tool_call(self, system: str, prompt: str, tool: ToolParam, max_tokens: int | None = None
                   ) -> Ops[tuple[dict[str, Any], Usage, bool]]:
        """One forced tool call on the memory model: (tool input, usage, answer cut off at max_tokens)."""
        raise NotImplementedError

    # ---- transport ---------------------------------------------------------------------

    def _where(self) -> str:
        """Where the API is (for "cannot reach" messages)."""
        return str(getattr(getattr(self, "_client", None), "base_url", "") or "its endpoint")

    def _send(self, model: str, request: Mapping[str, Any], usage_of: Callable[[dict[str, Any]], Usage]
              ) -> Ops[tuple[dict[str, Any], Usage]]:
        """One API request (the client's ``with_raw_response`` create with ``request``) with our retries; returns its
        answer as JSON (:func:`json_answer`) and its (recorded) usage."""
        errors = self.errors
        attempt = 0
        began = time.monotonic()
        while True:
            try:
                answer = yield Call(CLIENT, "create", (), request)
                break
            except errors.status as e:
                response = getattr(e, "response", None)
                headers = response.headers if response is not None else None
                hint = headers.get("x-should-retry") if headers else None  # the API's own verdict wins
                status = int(getattr(e, "status_code", 0))
                retryable = status in RETRY_STATUSES or status >= 500
                pause = self._backoff(attempt, retry_after(headers))
                busy = status in BUSY_STATUSES and time.monotonic() - began + pause <= self.deadline_s
                if (attempt >= self.max_retries and not busy) or hint == "false" or not (retryable or hint == "true"):
                    raise self._status_error(status, getattr(e, "body", None), attempt) from e
                yield Pause(pause)
            except errors.timeout as e:
                if attempt >= self.max_retries:
                    raise ModelTimeout(f"{model} did not answer within {self.timeout_s:g}s "
                                       f"({attempt + 1} attempt{'s' if attempt else ''})") from e
                yield Pause(self._backoff(attempt, None))
            except errors.connection as e:
                if attempt >= self.max_retries:
                    raise ModelError(f"cannot reach the {errors.api} at {self._where()} "
                                     f"({attempt + 1} attempts): {one_line(e)}") from e
                yield Pause(self._backoff(attempt, None))
            except errors.base as e:  # response validation, credentials, ...
                raise ModelError(f"{errors.api} SDK error: {type(e).__name__}: {one_line(e)}") from e
            attempt += 1
        answer = json_answer(answer, model)
        usage = usage_of(answer)
        with self._lock:
            self.usage_total = self.usage_total + usage
            self.usage_by_model[model] = self.usage_by_model.get(model, Usage()) + usage
        return answer, usage

    def _backoff(self, attempt: int, after: float | None) -> float:
        if after is not None:
            return after
        return min(self.retry_base_delay_s * 2.0 ** min(attempt, 16), MAX_BACKOFF_S) * (1.0 - 0.25 * random.random())

    def _status_error(self, status: int, body: object, retries: int) -> ModelError:
        etype, detail = error_detail(body)
        after = f" after {retries + 1} attempts" if retries else ""
        if status == 401:
            return ModelError(f"{self.errors.api} rejected the API key (401 {etype}){after}")
        return ModelError(f"{self.errors.api} error {status} {etype}{after}" + (f": {detail}" if detail else ""))


def json_answer(raw: Any, model: str) -> dict[str, Any]:
    """An answer sent with the SDK's ``with_raw_response``, read as JSON (whatever its content type says, as the
    SDK reads it): the SDK's typed response models are not built for an answer read once (they are a quarter of
    its CPU per request). Anything but a JSON object is a :class:`ModelError`."""
    try:
        data = json.loads(raw.http_response.content)
    except (AttributeError, TypeError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        raise ModelError(f"{model} answered with something other than JSON: {one_line(e, 120)}") from e
    if not isinstance(data, dict):
        raise ModelError(f"{model} answered with something other than a JSON object: {one_line(data, 120)}")
    return data


def http_client(sdk: Any, limits: Any, transport: str) -> Any:
    """The SDK's HTTP client for async requests: ``aiohttp`` (the SDK's ``DefaultAioHttpClient``, from its aiohttp
    extra; httpx when that is not installed) or ``httpx``. httpx's pool probes the socket of every idle connection
    on each request; aiohttp's does not."""
    aio = getattr(sdk, "DefaultAioHttpClient", None) if transport == "aiohttp" else None
    if aio is not None:
        try:
            return aio(limits=limits)
        except RuntimeError:  # an SDK installed without its aiohttp extra
            pass
    return sdk.DefaultAsyncHttpxClient(limits=limits)


POOL_CONNECTIONS = 32
"""Connections per SDK async client. A process's requests are spread over as many such clients as its
``max_concurrency`` needs, each request on the first client with a free connection: an HTTP client's CPU per request
grows with the size of its pool (measured with 256 requests out at once: ~4.4 ms of CPU per request on one pool of
256 connections, ~2.5 ms on eight of 32)."""


class _Clients:
    """One event loop's async clients: at most ``cap`` requests out at a time, at most :data:`POOL_CONNECTIONS` per
    client; a new client is made only when every one has its pool busy. ``make`` returning ``injected`` (a client
    given to the model) or None (a blocking client, sent on a thread) gives one client for all requests."""

    def __init__(self, make: Callable[[], Any], cap: int, injected: Any) -> None:
        self.make = make
        self.gate = asyncio.Semaphore(cap)
        self.clients: list[Any] = [make()]
        self.busy: list[int] = [0]
        self.shared = self.clients[0] is None or self.clients[0] is injected

    def take(self) -> int:
        """A client with a free connection (counted busy until :meth:`give`): the first one, or a new one."""
        i = 0 if self.shared else next((i for i, n in enumerate(self.busy) if n < POOL_CONNECTIONS), len(self.busy))
        if i == len(self.clients):
            self.clients.append(self.make())
            self.busy.append(0)
        self.busy[i] += 1
        return i

    def give(self, i: int) -> None:
        self.busy[i] -= 1


class AsyncRemoteModel(AsyncLanguageModel):
    """A :class:`RemoteModel` with coroutine methods: the same steps, awaited with the SDK's async client (made
    for each event loop that calls it), at most ``max_concurrency`` requests at a time per loop, so a node
    with thousands of turns in flight opens a bounded number of connections. Without an async client (an
    injected blocking client) each request is sent on a thread."""

    def __init__(self, inner: RemoteModel) -> None:
        self.inner = inner
        self.model_id, self.offline = inner.model_id, inner.offline
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Clients] = weakref.WeakKeyDictionary()
        self.in_flight = 0
        """Requests being sent now (all loops)."""

    @property
    def memory_model_id(self) -> str:
        return self.inner.memory_model_id

    @property
    def label(self) -> str:
        return self.inner.label

    def __getattr__(self, name: str) -> Any:  # usage sums, settings: the model's own
        return getattr(self.inner, name)

    async def reply(self, request: ReplyRequest) -> ModelReply:
        return await self._run(self.inner._reply(request))

    async def decide(self, exchange: Exchange) -> MemoryDecision:
        return await self._run(self.inner._decide(exchange))

    async def decide_window(self, window: ObserveWindow) -> WindowDecision:
        return await self._run(self.inner._decide_window(window))

    async def classify_task(self, text: str, known: tuple[str, ...]) -> TaskClassification:
        return await self._run(self.inner._classify_task(text, known))

    async def aclose(self) -> None:
        """Close the async clients this view made for the running loop (not a client given to the model). For a
        loop that is done with the model: a request still out on it fails."""
        got = self._clients.pop(asyncio.get_running_loop(), None)
        if got is not None and not got.shared:
            for client in got.clients:
                await client.close()

    def _pools(self) -> _Clients:
        loop = asyncio.get_running_loop()
        got = self._clients.get(loop)
        if got is None:
            got = self._clients[loop] = _Clients(self.inner._async_client, self.inner.max_concurrency,
                                                       self.inner._client)
        return got

    async def _run(self, ops: Ops[R]) -> R:
        return await run_steps_async(ops, self._perform)  # a request's error goes into the retry loop

    async def _perform(self, step: Call | Pause) -> Any:
        if isinstance(step, Pause):
            if self.inner._sleep is time.sleep:
                await asyncio.sleep(step.seconds)
            else:  # a test's recording sleep
                self.inner._sleep(step.seconds)
            return None
        pools = self._pools()
        async with pools.gate:
            i = pools.take()
            client = pools.clients[i]
            self.in_flight += 1
            try:
                create = self.inner._raw_create
                if client is None:
                    return await asyncio.to_thread(lambda: create(self.inner._client)(**step.kwargs))
                return await create(client)(**step.kwargs)
            finally:
                pools.give(i)
                self.in_flight -= 1
