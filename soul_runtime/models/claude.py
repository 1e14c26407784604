"""A :class:`~soul_runtime.models.base.LanguageModel` backed by the ``anthropic`` SDK.

* Two pinned model ids: ``model_id`` writes the replies, ``memory_model_id`` (by default
  a Haiku-class model) makes the memory decisions and task classifications. ``...-latest``
  aliases are refused: a soul's memories should not change meaning when an alias moves.
* A memory decision is one forced tool call (:mod:`soul_runtime.models.claude_tools`):
  persist flag, categories and the extraction in the same answer. ``decide_window`` judges
  a window of observed messages in one call; an answer cut off at ``memory_max_tokens`` is
  retried as two half windows.
* Prompt caching: the static instruction + tool-schema prefix of the memory calls, and the
  persona block of the replies, carry ``cache_control`` when the prefix is at least the
  model's minimum cacheable length (:func:`cache_min_tokens`); usage reports uncached,
  cache-read and cache-write input tokens apart, per model (``usage_by_model``).
* Thinking is switched off (``thinking: {"type": "disabled"}``): forced tool use does not
  combine with it, and the reply path is latency-bound.
* Retries are ours, not the SDK's (the client runs with ``max_retries=0``): 429,
  408/409, 5xx (529 overloaded included), connection errors and timeouts are
  retried ``max_retries`` times with exponential backoff, honouring the server's
  ``retry-after-ms`` / ``retry-after`` and ``x-should-retry`` headers. A final timeout is
  :class:`ModelTimeout`; every other failure is a one-line :class:`ModelError`.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import anthropic
from anthropic.types import Message, MessageParam, TextBlockParam, ToolChoiceToolParam, ToolParam

from soul_runtime.errors import ConfigError, InvalidInput, ModelError, ModelTimeout
from soul_runtime.models.base import (
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
    one_line,
    parse_decision,
    parse_window,
    window_prompt,
)

DEFAULT_MODEL_ID = "claude-sonnet-5-5"
"""The pinned reply model used when ``SOUL_ANTHROPIC_MODEL`` is not set."""
DEFAULT_MEMORY_MODEL_ID = "claude-haiku-5-5"
"""The pinned memory model used when ``SOUL_ANTHROPIC_MEMORY_MODEL`` is not set."""

_RETRY_STATUSES = frozenset({408, 409, 429})
_MAX_BACKOFF_S = 8.0
_MAX_RETRY_AFTER_S = 60.0
_EPHEMERAL = {"type": "ephemeral"}
_NO_THINKING = {"type": "disabled"}

# Minimum cacheable prefix (tokens) by model-id prefix, from Anthropic's prompt-caching docs; the
# first match wins. Below the minimum the API silently does not cache, so unknown ids use 1024.
_CACHE_MIN = (("claude-haiku-4-5", 4096), ("claude-opus-4-5", 4096), ("claude-opus-4-6", 4096),
              ("claude-opus-4-7", 4096), ("claude-sonnet-4-6", 2048), ("claude-3-haiku", 2048),
              ("claude-3-5-haiku", 2048), ("claude-sonnet-4", 1024), ("claude-opus-4", 1024))


def cache_min_tokens(model_id: str) -> int:
    """The shortest prefix (tokens) worth a ``cache_control`` mark for ``model_id``."""
    return next((n for prefix, n in _CACHE_MIN if model_id.startswith(prefix)), 1024)


def _check_model_id(name: str, model_id: object) -> str:
    if not isinstance(model_id, str) or not model_id.strip() or model_id != model_id.strip():
        raise ConfigError(f"{name} must be a non-empty pinned model id, got {model_id!r}")
    if model_id.endswith("-latest"):
        raise ConfigError(f"{name} {model_id!r} is a moving alias; pin a model such as {DEFAULT_MODEL_ID!r}")
    return model_id


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
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
            return min(seconds, _MAX_RETRY_AFTER_S)
    return None


def _usage_of(msg: Message) -> Usage:
    raw = getattr(msg, "usage", None)

    def n(name: str) -> int:
        v = getattr(raw, name, 0)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0
    return Usage(input_tokens=n("input_tokens"), output_tokens=n("output_tokens"), calls=1,
                 cache_read_tokens=n("cache_read_input_tokens"), cache_write_tokens=n("cache_creation_input_tokens"))


class AnthropicModel(LanguageModel):
    """Claude through the Messages API. Thread-safe; ``usage_total`` / ``usage_by_model`` are running sums."""

    offline = False

    def __init__(self, *, model_id: str, memory_model_id: str | None = None, api_key: str | None = None,
                 base_url: str | None = None, timeout_s: float = 60.0, max_retries: int = 4, max_tokens: int = 1024,
                 memory_max_tokens: int = 4096, client: anthropic.Anthropic | None = None,
                 retry_base_delay_s: float = 0.5, cache_min: int | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.model_id = _check_model_id("model_id", model_id)
        self._memory_model_id = _check_model_id("memory_model_id", memory_model_id or DEFAULT_MEMORY_MODEL_ID)
        for name, num in (("timeout_s", timeout_s), ("retry_base_delay_s", retry_base_delay_s)):
            if isinstance(num, bool) or not isinstance(num, (int, float)) or not math.isfinite(num) or num < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {num!r}")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s!r}")
        for name, n, low in (("max_retries", max_retries, 0), ("max_tokens", max_tokens, 1),
                             ("memory_max_tokens", memory_max_tokens, 64), ("cache_min", cache_min, 1)):
            if name == "cache_min" and n is None:
                continue
            if isinstance(n, bool) or not isinstance(n, int) or n < low:
                raise ConfigError(f"{name} must be a whole number >= {low}, got {n!r}")
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.max_tokens = max_tokens
        self.memory_max_tokens = memory_max_tokens
        self.cache_min = cache_min
        self.retry_base_delay_s = float(retry_base_delay_s)
        self._sleep = sleep
        self._lock = threading.Lock()
        self.usage_total = Usage()
        self.usage_by_model: dict[str, Usage] = {}
        try:
            if client is None:
                client = anthropic.Anthropic(api_key=api_key, base_url=base_url, timeout=self.timeout_s,
                                             max_retries=0)
            else:  # the retry loop and the timeout are ours, whatever the injected client says
                client = client.with_options(timeout=self.timeout_s, max_retries=0)
        except (anthropic.AnthropicError, ValueError) as e:
            hint = " (no API key: pass api_key= or set ANTHROPIC_API_KEY)" if api_key is None else ""
            raise ConfigError(f"cannot configure the Anthropic client{hint}: {one_line(e)}") from e
        if not (getattr(client, "api_key", None) or getattr(client, "auth_token", None)
                or getattr(client, "credentials", None)):
            raise ConfigError("no Anthropic API key: pass api_key= or set ANTHROPIC_API_KEY")
        self._client = client

    @property
    def memory_model_id(self) -> str:
        return self._memory_model_id

    def _cacheable(self, model: str, *parts: str) -> bool:
        """Is the prefix long enough to be cached? Counted as characters / 3 (Claude's tokenizers give more
        tokens than our characters / 4 on JSON and prose); a mark on a shorter prefix costs nothing, the API
        just does not cache it."""
        need = self.cache_min if self.cache_min is not None else cache_min_tokens(model)
        return sum(len(p) for p in parts) // 3 >= need

    # ---- the operations ---------------------------------------------------------------

    def reply(self, request: ReplyRequest) -> ModelReply:
        if not request.user_text.strip():
            raise InvalidInput("reply needs a non-empty user text")
        system: list[TextBlockParam] = []
        persona = request.system.strip()
        if persona:  # static per soul: the cacheable prefix of every reply
            block: TextBlockParam = {"type": "text", "text": persona}
            if self._cacheable(self.model_id, persona):
                block["cache_control"] = cast(Any, _EPHEMERAL)
            system.append(block)
        if request.memory_lines:
            system.append({"type": "text", "text": "Relevant memories (id: text):\n"
                           + "\n".join(f"- {line}" for line in request.memory_lines)})
        messages = [*_history_params(request.history), _user(request.user_text)]
        max_tokens = request.max_tokens if request.max_tokens > 0 else self.max_tokens
        msg, usage = self._create(self.model_id, messages=messages, max_tokens=max_tokens,
                                  **({"system": system} if system else {}))
        text = "".join(getattr(b, "text", "") for b in msg.content if getattr(b, "type", "") == "text").strip()
        if not text:
            raise ModelError(f"{self.model_id} returned no text (stop_reason={msg.stop_reason})")
        return ModelReply(text=text, usage=usage, model=self.model_id)

    def decide(self, exchange: Exchange) -> MemoryDecision:
        data, usage, _ = self._tool_call(MEMORY_SYSTEM, exchange_prompt(exchange), MEMORY_TOOL)
        d = parse_decision(data, tuple(exchange.message_ids))
        return MemoryDecision(d.persist, d.categories, d.reason, d.extraction, usage, self.memory_model_id)

    def decide_window(self, window: ObserveWindow) -> WindowDecision:
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

    # ---- transport ------------------------------------------------------------

    def _tool_call(self, system: str, prompt: str, tool: ToolParam, max_tokens: int | None = None
                   ) -> tuple[dict[str, Any], Usage, bool]:
        """One forced tool call on the memory model: (tool input, usage, answer cut off at max_tokens)."""
        model = self.memory_model_id
        block: TextBlockParam = {"type": "text", "text": system}
        if self._cacheable(model, system, json.dumps(tool)):  # tools + system: the same on every call
            block["cache_control"] = cast(Any, _EPHEMERAL)
        choice: ToolChoiceToolParam = {"type": "tool", "name": tool["name"]}
        msg, usage = self._create(model, system=[block], messages=[_user(prompt)],
                                  max_tokens=max_tokens or self.max_tokens, tools=[tool], tool_choice=choice)
        cut = msg.stop_reason == "max_tokens"
        for b in msg.content:
            if getattr(b, "type", "") == "tool_use" and getattr(b, "name", "") == tool["name"]:
                data = getattr(b, "input", None)
                if not isinstance(data, dict):
                    if cut:
                        return {}, usage, True
                    raise ModelError(f"{tool['name']} input is not an object: {one_line(data, 120)}")
                return data, usage, cut
        if cut:
            return {}, usage, True
        raise ModelError(f"{model} did not call {tool['name']} (stop_reason={msg.stop_reason})")

    def _create(self, model: str, **kwargs: Any) -> tuple[Message, Usage]:
        """One Messages API call with our retries; returns the message and its (recorded) usage."""
        attempt = 0
        while True:
            try:
                msg = self._client.messages.create(model=model, thinking=cast(Any, _NO_THINKING), **kwargs)
                break
            except anthropic.APIStatusError as e:
                headers = e.response.headers if e.response is not None else None
                hint = headers.get("x-should-retry") if headers else None  # the API's own verdict wins
                retryable = e.status_code in _RETRY_STATUSES or e.status_code >= 500
                if attempt >= self.max_retries or hint == "false" or not (retryable or hint == "true"):
                    raise self._status_error(e, attempt) from e
                self._sleep(self._backoff(attempt, _retry_after(headers)))
            except anthropic.APITimeoutError as e:
                if attempt >= self.max_retries:
                    raise ModelTimeout(f"{model} did not answer within {self.timeout_s:g}s "
                                       f"({attempt + 1} attempt{'s' if attempt else ''})") from e
                self._sleep(self._backoff(attempt, None))
            except anthropic.APIConnectionError as e:
                if attempt >= self.max_retries:
                    raise ModelError(f"cannot reach the Anthropic API at {self._client.base_url} "
                                     f"({attempt + 1} attempts): {one_line(e)}") from e
                self._sleep(self._backoff(attempt, None))
            except anthropic.AnthropicError as e:  # response validation, credentials, ...
                raise ModelError(f"Anthropic SDK error: {type(e).__name__}: {one_line(e)}") from e
            attempt += 1
        usage = _usage_of(msg)
        with self._lock:
            self.usage_total = self.usage_total + usage
            self.usage_by_model[model] = self.usage_by_model.get(model, Usage()) + usage
        return msg, usage

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return retry_after
        return min(self.retry_base_delay_s * 2.0 ** attempt, _MAX_BACKOFF_S) * (1.0 - 0.25 * random.random())

    def _status_error(self, e: anthropic.APIStatusError, retries: int) -> ModelError:
        err: dict[str, Any] = {}
        if isinstance(e.body, dict) and isinstance(e.body.get("error"), dict):
            err = e.body["error"]
        etype = err.get("type") or "unknown_error"
        after = f" after {retries + 1} attempts" if retries else ""
        if e.status_code == 401:
            return ModelError(f"Anthropic API rejected the API key (401 {etype}){after}")
        detail = one_line(err.get("message") or "", 160)
        return ModelError(f"Anthropic API error {e.status_code} {etype}{after}" + (f": {detail}" if detail else ""))


def _user(text: str) -> MessageParam:
    return {"role": "user", "content": text}


def _history_params(history: Iterable[ChatMessage]) -> list[MessageParam]:
    for m in history:
        if m.role not in ("user", "assistant"):
            raise InvalidInput(f"history message role must be 'user' or 'assistant', got {m.role!r}")
    return [cast(MessageParam, {"role": m.role, "content": m.content}) for m in history if m.content.strip()]


def model_from_env(env: Mapping[str, str]) -> LanguageModel | None:
    """An :class:`AnthropicModel` when ``ANTHROPIC_API_KEY`` is set, else None (use the offline model).

    ``SOUL_ANTHROPIC_MODEL`` / ``SOUL_ANTHROPIC_MEMORY_MODEL`` override the pinned reply / memory model
    ids; ``ANTHROPIC_BASE_URL`` is honoured.
    """
    key = (env.get("ANTHROPIC_API_KEY") or "").strip()
    if not key:
        return None
    model_id = (env.get("SOUL_ANTHROPIC_MODEL") or "").strip() or DEFAULT_MODEL_ID
    memory_id = (env.get("SOUL_ANTHROPIC_MEMORY_MODEL") or "").strip() or DEFAULT_MEMORY_MODEL_ID
    base_url = (env.get("ANTHROPIC_BASE_URL") or "").strip() or None
    return AnthropicModel(model_id=model_id, memory_model_id=memory_id, api_key=key, base_url=base_url)
