"""What the adapters of remote model APIs share: pinned model ids, option checks, retries and usage sums.

:class:`RemoteModel` is the base of :class:`~soul_runtime.models.claude.AnthropicModel` and
:class:`~soul_runtime.models.openai_chat.OpenAIChatModel`. Both SDKs raise the same kinds of errors (a
status error with the response's headers and body, a timeout, a connection error, a base error), named by
an :class:`SdkErrors`. Retries are ours, not the SDK's (its client runs with ``max_retries=0``): 429,
408/409, 5xx, connection errors and timeouts are retried ``max_retries`` times with exponential backoff,
honouring the server's ``retry-after-ms`` / ``retry-after`` and ``x-should-retry`` headers. A final timeout
is :class:`ModelTimeout`; every other failure is a one-line :class:`ModelError`.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from anthropic.types import ToolParam

from soul_runtime.errors import ConfigError, ModelError, ModelTimeout
from soul_runtime.models.base import (
    ChatMessage,
    Exchange,
    LanguageModel,
    MemoryDecision,
    ObserveWindow,
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

R = TypeVar("R")
RETRY_STATUSES = frozenset({408, 409, 429})
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


class RemoteModel(LanguageModel):
    """A model behind an HTTP API: validated options, our retry loop, running usage sums (thread-safe), and
    the memory operations as one forced tool call each (:mod:`soul_runtime.models.claude_tools`). An adapter
    implements :meth:`reply` and :meth:`_tool_call`."""

    offline = False
    errors: SdkErrors
    _memory_model_id: str

    def __init__(self, *, timeout_s: float, max_retries: int, max_tokens: int, memory_max_tokens: int,
                 retry_base_delay_s: float, sleep: Callable[[float], None]) -> None:
        for name, num in (("timeout_s", timeout_s), ("retry_base_delay_s", retry_base_delay_s)):
            if isinstance(num, bool) or not isinstance(num, (int, float)) or not math.isfinite(num) or num < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {num!r}")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s!r}")
        for name, n, low in (("max_retries", max_retries, 0), ("max_tokens", max_tokens, 1),
                             ("memory_max_tokens", memory_max_tokens, 64)):
            if isinstance(n, bool) or not isinstance(n, int) or n < low:
                raise ConfigError(f"{name} must be a whole number >= {low}, got {n!r}")
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.max_tokens = max_tokens
        self.memory_max_tokens = memory_max_tokens
        self.retry_base_delay_s = float(retry_base_delay_s)
        self._sleep = sleep
        self._lock = threading.Lock()
        self.usage_total = Usage()
        self.usage_by_model: dict[str, Usage] = {}

    @property
    def memory_model_id(self) -> str:
        return self._memory_model_id

    # ---- the memory operations ---------------------------------------------------------

    def decide(self, exchange: Exchange) -> MemoryDecision:
        data, usage, _ = self._tool_call(MEMORY_SYSTEM, exchange_prompt(exchange), MEMORY_TOOL)
        d = parse_decision(data, tuple(exchange.message_ids))
        return MemoryDecision(d.persist, d.categories, d.reason, d.extraction, usage, self.memory_model_id)

    def decide_window(self, window: ObserveWindow) -> WindowDecision:
        """One call for the window; an answer cut off at ``memory_max_tokens`` is retried as two half windows."""
        if not any(m.judge for m in window.messages):
            return WindowDecision(tuple(MemoryDecision(False, reason="context only") for _ in window.messages),
                                  Usage(), self.memory_model_id)
        data, usage, cut = self._tool_call(WINDOW_SYSTEM, window_prompt(window), WINDOW_TOOL,
                                           self.memory_max_tokens)
        if cut and len(window.messages) > 1:  # the answer did not fit: judge the halves apart
            half = len(window.messages) // 2
            first = ObserveWindow(window.messages[:half], window.earlier, window.persona, window.history)
            earlier = (*window.earlier, *(ChatMessage("user", m.text, m.id, m.speaker) for m in first.messages))
            second = ObserveWindow(window.messages[half:], earlier, window.persona, window.history)
            a, b = self.decide_window(first), self.decide_window(second)
            return WindowDecision(a.decisions + b.decisions, usage + a.usage + b.usage, self.memory_model_id)
        if cut:
            raise ModelError(f"{self.memory_model_id} answer for one message exceeded memory_max_tokens="
                             f"{self.memory_max_tokens}")
        return WindowDecision(tuple(parse_window(data, window)), usage, self.memory_model_id)

    def classify_task(self, text: str, known: tuple[str, ...]) -> TaskClassification:
        if not known or not text.strip():
            return TaskClassification(None, 0.0)
        prompt = ("Known task classes:\n" + "\n".join(f"- {k}" for k in known)
                  + f"\n\n<request>\n{text}\n</request>")
        data, usage, _ = self._tool_call(CLASSIFY_SYSTEM, prompt, CLASSIFY_TOOL)
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
                   ) -> tuple[dict[str, Any], Usage, bool]:
        """One forced tool call on the memory model: (tool input, usage, answer cut off at max_tokens)."""
        raise NotImplementedError

    # ---- transport ---------------------------------------------------------------------

    def _where(self) -> str:
        """Where the API is (for "cannot reach" messages)."""
        return str(getattr(getattr(self, "_client", None), "base_url", "") or "its endpoint")

    def _send(self, model: str, call: Callable[[], R], usage_of: Callable[[R], Usage]) -> tuple[R, Usage]:
        """``call()`` (one API request) with our retries; returns its answer and (recorded) usage."""
        errors = self.errors
        attempt = 0
        while True:
            try:
                answer = call()
                break
            except errors.status as e:
                response = getattr(e, "response", None)
                headers = response.headers if response is not None else None
                hint = headers.get("x-should-retry") if headers else None  # the API's own verdict wins
                status = int(getattr(e, "status_code", 0))
                retryable = status in RETRY_STATUSES or status >= 500
                if attempt >= self.max_retries or hint == "false" or not (retryable or hint == "true"):
                    raise self._status_error(status, getattr(e, "body", None), attempt) from e
                self._sleep(self._backoff(attempt, retry_after(headers)))
            except errors.timeout as e:
                if attempt >= self.max_retries:
                    raise ModelTimeout(f"{model} did not answer within {self.timeout_s:g}s "
                                       f"({attempt + 1} attempt{'s' if attempt else ''})") from e
                self._sleep(self._backoff(attempt, None))
            except errors.connection as e:
                if attempt >= self.max_retries:
                    raise ModelError(f"cannot reach the {errors.api} at {self._where()} "
                                     f"({attempt + 1} attempts): {one_line(e)}") from e
                self._sleep(self._backoff(attempt, None))
            except errors.base as e:  # response validation, credentials, ...
                raise ModelError(f"{errors.api} SDK error: {type(e).__name__}: {one_line(e)}") from e
            attempt += 1
        usage = usage_of(answer)
        with self._lock:
            self.usage_total = self.usage_total + usage
            self.usage_by_model[model] = self.usage_by_model.get(model, Usage()) + usage
        return answer, usage

    def _backoff(self, attempt: int, after: float | None) -> float:
        if after is not None:
            return after
        return min(self.retry_base_delay_s * 2.0 ** attempt, MAX_BACKOFF_S) * (1.0 - 0.25 * random.random())

    def _status_error(self, status: int, body: object, retries: int) -> ModelError:
        etype, detail = error_detail(body)
        after = f" after {retries + 1} attempts" if retries else ""
        if status == 401:
            return ModelError(f"{self.errors.api} rejected the API key (401 {etype}){after}")
        return ModelError(f"{self.errors.api} error {status} {etype}{after}" + (f": {detail}" if detail else ""))
