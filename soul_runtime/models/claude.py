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
* Retries, timeouts and usage sums: :class:`~soul_runtime.models.remote.RemoteModel` (529 overloaded is a
  5xx: retried).
* ``client=``: any client of the ``anthropic`` SDK — ``anthropic.AnthropicBedrock``,
  ``anthropic.AnthropicVertex``, a client with custom HTTP settings; it keeps its own credentials.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import anthropic
from anthropic.types import MessageParam, TextBlockParam, ToolChoiceToolParam, ToolParam

from soul_runtime.errors import ConfigError, InvalidInput, ModelError
from soul_runtime.models.base import ChatMessage, LanguageModel, ModelReply, ReplyRequest, Usage, usage_count
from soul_runtime.models.remote import (
    Ops,
    RemoteModel,
    SdkErrors,
    check_model_id,
    number_setting,
    setting,
)
from soul_runtime.models.text import one_line

DEFAULT_MODEL_ID = "claude-sonnet-5-5"
"""The pinned reply model used when ``SOUL_ANTHROPIC_MODEL`` is not set."""
DEFAULT_MEMORY_MODEL_ID = "claude-haiku-5-5"
"""The pinned memory model used when ``SOUL_ANTHROPIC_MEMORY_MODEL`` is not set."""

_EPHEMERAL = {"type": "ephemeral"}
_NO_THINKING = {"type": "disabled"}
_ERRORS = SdkErrors("Anthropic API", anthropic.APIStatusError, anthropic.APITimeoutError,
                    anthropic.APIConnectionError, anthropic.AnthropicError)

# Minimum cacheable prefix (tokens) by model-id prefix, from Anthropic's prompt-caching docs; the
# first match wins. Below the minimum the API silently does not cache, so unknown ids use 1024.
_CACHE_MIN = (("claude-haiku-4-5", 4096), ("claude-opus-4-5", 4096), ("claude-opus-4-6", 4096),
              ("claude-opus-4-7", 4096), ("claude-sonnet-4-6", 2048), ("claude-3-haiku", 2048),
              ("claude-3-5-haiku", 2048), ("claude-sonnet-4", 1024), ("claude-opus-4", 1024))


def cache_min_tokens(model_id: str) -> int:
    """The shortest prefix (tokens) worth a ``cache_control`` mark for ``model_id``."""
    return next((n for prefix, n in _CACHE_MIN if model_id.startswith(prefix)), 1024)


def _usage_of(msg: dict[str, Any]) -> Usage:
    raw = msg.get("usage")
    n = raw.get if isinstance(raw, dict) else {}.get
    return Usage(input_tokens=usage_count(n("input_tokens")), output_tokens=usage_count(n("output_tokens")), calls=1,
                 cache_read_tokens=usage_count(n("cache_read_input_tokens")),
                 cache_write_tokens=usage_count(n("cache_creation_input_tokens")))


def _blocks(msg: dict[str, Any], model: str) -> list[dict[str, Any]]:
    """The content blocks of a Messages API answer (JSON), or ModelError for an answer of another shape."""
    content = msg.get("content")
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise ModelError(f"{model} answer has no list of content blocks: {one_line(msg, 120)}")
    return content


class AnthropicModel(RemoteModel):
    """Claude through the Messages API. Thread-safe; ``usage_total`` / ``usage_by_model`` are running sums."""

    errors = _ERRORS
    sdk = anthropic
    async_client_class = "AsyncAnthropic"
    async_transport = "aiohttp"

    def __init__(self, *, model_id: str, memory_model_id: str | None = None, api_key: str | None = None,
                 base_url: str | None = None, timeout_s: float = 60.0, max_retries: int = 4, max_tokens: int = 1024,
                 memory_max_tokens: int = 4096, client: Any = None,
                 retry_base_delay_s: float = 0.5, cache_min: int | None = None,
                 sleep: Callable[[float], None] = time.sleep, deadline_s: float = 120.0,
                 max_concurrency: int = 1024) -> None:
        self.model_id = check_model_id("model_id", model_id, DEFAULT_MODEL_ID)
        self._memory_model_id = check_model_id("memory_model_id", memory_model_id or DEFAULT_MEMORY_MODEL_ID,
                                               DEFAULT_MEMORY_MODEL_ID)
        super().__init__(timeout_s=timeout_s, max_retries=max_retries, max_tokens=max_tokens,
                         memory_max_tokens=memory_max_tokens, retry_base_delay_s=retry_base_delay_s, sleep=sleep,
                         deadline_s=deadline_s, max_concurrency=max_concurrency)
        self._settings = {"api_key": api_key, "base_url": base_url} if client is None else None
        if cache_min is not None and (isinstance(cache_min, bool) or not isinstance(cache_min, int) or cache_min < 1):
            raise ConfigError(f"cache_min must be a whole number >= 1, got {cache_min!r}")
        self.cache_min = cache_min
        if client is None:
            try:
                client = anthropic.Anthropic(api_key=api_key, base_url=base_url, timeout=self.timeout_s,
                                             max_retries=0)
            except (anthropic.AnthropicError, ValueError) as e:
                hint = " (no API key: pass api_key= or set ANTHROPIC_API_KEY)" if api_key is None else ""
                raise ConfigError(f"cannot configure the Anthropic client{hint}: {one_line(e)}") from e
            if not (getattr(client, "api_key", None) or getattr(client, "auth_token", None)
                    or getattr(client, "credentials", None)):
                raise ConfigError("no Anthropic API key: pass api_key= or set ANTHROPIC_API_KEY")
        else:
            client = self._injected(client)
        self._client = client

    def _cacheable(self, model: str, *parts: str) -> bool:
        """Is the prefix long enough to be cached? Counted as characters / 3 (Claude's tokenizers give more
        tokens than our characters / 4 on JSON and prose); a mark on a shorter prefix costs nothing, the API
        just does not cache it."""
        need = self.cache_min if self.cache_min is not None else cache_min_tokens(model)
        return sum(len(p) for p in parts) // 3 >= need

    def _reply(self, request: ReplyRequest) -> Ops[ModelReply]:
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
            system.append({"type": "text", "text": memory_block(request.memory_lines)})
        messages = [*_history_params(request.history), _user(request.user_text)]
        max_tokens = request.max_tokens if request.max_tokens > 0 else self.max_tokens
        msg, usage = yield from self._create(self.model_id, messages=messages, max_tokens=max_tokens,
                                             **({"system": system} if system else {}))
        text = "".join(t for b in _blocks(msg, self.model_id)
                       if b.get("type") == "text" and isinstance(t := b.get("text"), str)).strip()
        if not text:
            raise ModelError(f"{self.model_id} returned no text (stop_reason={msg.get('stop_reason')})")
        return ModelReply(text=text, usage=usage, model=self.model_id)

    def _tool_call(self, system: str, prompt: str, tool: ToolParam, max_tokens: int | None = None
                   ) -> Ops[tuple[dict[str, Any], Usage, bool]]:
        model = self.memory_model_id
        block: TextBlockParam = {"type": "text", "text": system}
        if self._cacheable(model, system, json.dumps(tool)):  # tools + system: the same on every call
            block["cache_control"] = cast(Any, _EPHEMERAL)
        choice: ToolChoiceToolParam = {"type": "tool", "name": tool["name"]}
        msg, usage = yield from self._create(model, system=[block], messages=[_user(prompt)],
                                             max_tokens=max_tokens or self.max_tokens, tools=[tool],
                                             tool_choice=choice)
        cut = msg.get("stop_reason") == "max_tokens"
        for b in _blocks(msg, model):
            if b.get("type") == "tool_use" and b.get("name") == tool["name"]:
                data = b.get("input")
                if not isinstance(data, dict):
                    if cut:
                        return {}, usage, True
                    raise ModelError(f"{tool['name']} input is not an object: {one_line(data, 120)}")
                return data, usage, cut
        if cut:
            return {}, usage, True
        raise ModelError(f"{model} did not call {tool['name']} (stop_reason={msg.get('stop_reason')})")

    def _create(self, model: str, **kwargs: Any) -> Ops[tuple[dict[str, Any], Usage]]:
        """One Messages API call with our retries; returns the message as JSON (:func:`~soul_runtime.models.remote.
        json_answer`) and its (recorded) usage."""
        return (yield from self._send(model, {"model": model, "thinking": _NO_THINKING, **kwargs}, _usage_of))

    def _raw_create(self, client: Any) -> Any:
        return client.messages.with_raw_response.create


def memory_block(lines: Iterable[str]) -> str:
    """The recalled memories as the reply model is shown them: a list, an episode of the same day as the one
    before it nested under it."""
    return "Relevant memories:\n" + "\n".join(f"  - {line.strip()}" if line[:1].isspace() else f"- {line}"
                                               for line in lines)


def _user(text: str) -> MessageParam:
    return {"role": "user", "content": text}


def check_history(history: Iterable[ChatMessage]) -> list[ChatMessage]:
    """The history messages with text, or InvalidInput for a role other than user / assistant."""
    out = []
    for m in history:
        if m.role not in ("user", "assistant"):
            raise InvalidInput(f"history message role must be 'user' or 'assistant', got {m.role!r}")
        if m.content.strip():
            out.append(m)
    return out


def _history_params(history: Iterable[ChatMessage]) -> list[MessageParam]:
    return [cast(MessageParam, {"role": m.role, "content": m.content}) for m in check_history(history)]


def model_from_env(env: Mapping[str, str], args: Mapping[str, str] | None = None) -> LanguageModel | None:
    """An :class:`AnthropicModel` when an API key is set, else None (use the offline model).

    Each setting comes from ``args`` (``model_args``) first, else the environment: ``api_key``
    (``ANTHROPIC_API_KEY``), ``model`` / ``memory_model`` (``SOUL_ANTHROPIC_MODEL`` /
    ``SOUL_ANTHROPIC_MEMORY_MODEL``, pinned ids), ``base_url`` (``ANTHROPIC_BASE_URL``), ``timeout_s`` /
    ``max_retries`` (``SOUL_ANTHROPIC_TIMEOUT_S`` / ``SOUL_ANTHROPIC_MAX_RETRIES``), ``max_concurrency``
    (``SOUL_MODEL_MAX_CONCURRENCY``: requests at a time per event loop, default 1024) and ``deadline_s``
    (``SOUL_MODEL_DEADLINE_S``: how long a busy API, 429/529, is waited for, default 120).
    """
    args = dict(args or {})
    unknown = set(args) - {"api_key", "model", "memory_model", "base_url", "timeout_s", "max_retries",
                           "max_concurrency", "deadline_s"}
    if unknown:
        raise ConfigError(f"model 'anthropic' does not take model_args {sorted(unknown)}")
    key = setting(args, "api_key", env, "ANTHROPIC_API_KEY")
    if not key:
        return None
    return AnthropicModel(
        model_id=setting(args, "model", env, "SOUL_ANTHROPIC_MODEL") or DEFAULT_MODEL_ID,
        memory_model_id=setting(args, "memory_model", env, "SOUL_ANTHROPIC_MEMORY_MODEL") or DEFAULT_MEMORY_MODEL_ID,
        api_key=key, base_url=setting(args, "base_url", env, "ANTHROPIC_BASE_URL"),
        timeout_s=number_setting(setting(args, "timeout_s", env, "SOUL_ANTHROPIC_TIMEOUT_S"), "timeout_s", float, 60.0),
        max_retries=number_setting(setting(args, "max_retries", env, "SOUL_ANTHROPIC_MAX_RETRIES"), "max_retries",
                                   int, 4),
        max_concurrency=number_setting(setting(args, "max_concurrency", env, "SOUL_MODEL_MAX_CONCURRENCY"),
                                       "max_concurrency", int, 1024),
        deadline_s=number_setting(setting(args, "deadline_s", env, "SOUL_MODEL_DEADLINE_S"), "deadline_s", float,
                                  120.0))
