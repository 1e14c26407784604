"""A :class:`~soul_runtime.models.base.LanguageModel` for OpenAI-compatible chat completions.

The protocol vLLM, Ollama, llama.cpp's server, LiteLLM and most gateways speak (and OpenAI itself),
through the official ``openai`` SDK (``pip install 'soul-runtime[openai]'``): the SDK is the one client
every such server is tested against, and its errors have the same shape as the ``anthropic`` SDK's, so
retries, timeouts and usage sums are :class:`~soul_runtime.models.remote.RemoteModel`'s, shared with the
Anthropic adapter.

* Two pinned model ids: ``model_id`` writes the replies, ``memory_model_id`` (by default the same) makes
  the memory decisions; ids ending in ``-latest`` or ``:latest`` are refused.
* A reply is one call: one system message (the persona, then the recalled memories), the history, the
  user's text.
* A memory decision is one forced tool call (``tool_choice`` naming the function) with the same tools and
  instructions as the Anthropic adapter (:mod:`soul_runtime.models.claude_tools`); the instruction and
  the tool come first and never change, so a server's automatic prefix cache can hold them. An answer cut
  off at the token limit (``finish_reason: length``) is retried as two half windows.
* Usage per call from the response's ``usage``: ``prompt_tokens`` less the cached ones is the uncached
  input, ``prompt_tokens_details.cached_tokens`` the cache reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import openai
from anthropic.types import ToolParam

from soul_runtime.errors import ConfigError, InvalidInput, ModelError
from soul_runtime.models.base import ModelReply, ReplyRequest, Usage, usage_count
from soul_runtime.models.claude import check_history, memory_block
from soul_runtime.models.remote import Ops, RemoteModel, SdkErrors, check_model_id, number_setting, setting
from soul_runtime.models.text import one_line

TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")
_ERRORS = SdkErrors("OpenAI-compatible API", openai.APIStatusError, openai.APITimeoutError,
                    openai.APIConnectionError, openai.OpenAIError)
_NO_KEY = "no-key"
"""Sent when a server needs no key (a local vLLM, Ollama or llama.cpp server): the SDK insists on one."""


def function_tool(tool: ToolParam) -> dict[str, Any]:
    """An Anthropic tool definition as a chat-completions function tool."""
    return {"type": "function", "function": {"name": tool["name"], "description": tool.get("description", ""),
                                             "parameters": tool["input_schema"]}}


def _usage_of(answer: dict[str, Any]) -> Usage:
    raw = answer.get("usage")
    n = raw.get if isinstance(raw, dict) else {}.get
    details = n("prompt_tokens_details")
    prompt = usage_count(n("prompt_tokens"))
    cached = usage_count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Usage(input_tokens=max(0, prompt - cached), output_tokens=usage_count(n("completion_tokens")), calls=1,
                 cache_read_tokens=min(cached, prompt))


class OpenAIChatModel(RemoteModel):
    """A model behind ``/v1/chat/completions``. Thread-safe; ``usage_total`` / ``usage_by_model`` are running sums.

    ``client``: an ``openai.OpenAI`` (or ``openai.AzureOpenAI``) client of your own; it keeps its credentials,
    the timeout and retries are ours. ``token_field``: ``max_tokens`` (what compatible servers read) or
    ``max_completion_tokens`` (OpenAI's reasoning models)."""

    errors = _ERRORS
    sdk = openai
    async_client_class = "AsyncOpenAI"

    def __init__(self, *, model_id: str, memory_model_id: str | None = None, api_key: str | None = None,
                 base_url: str | None = None, timeout_s: float = 60.0, max_retries: int = 4, max_tokens: int = 1024,
                 memory_max_tokens: int = 4096, client: Any = None, retry_base_delay_s: float = 0.5,
                 token_field: str = "max_tokens", sleep: Callable[[float], None] = time.sleep,
                 deadline_s: float = 120.0, max_concurrency: int = 1024) -> None:
        self.model_id = check_model_id("model_id", model_id, "llama-3.1-8b-instruct")
        self._memory_model_id = check_model_id("memory_model_id", memory_model_id or model_id,
                                               "llama-3.1-8b-instruct")
        super().__init__(timeout_s=timeout_s, max_retries=max_retries, max_tokens=max_tokens,
                         memory_max_tokens=memory_max_tokens, retry_base_delay_s=retry_base_delay_s, sleep=sleep,
                         deadline_s=deadline_s, max_concurrency=max_concurrency)
        if token_field not in TOKEN_FIELDS:
            raise ConfigError(f"token_field must be one of {', '.join(TOKEN_FIELDS)}, got {token_field!r}")
        self.token_field = token_field
        if client is None:
            if base_url is not None and not api_key:
                api_key = _NO_KEY
            self._settings = {"api_key": api_key, "base_url": base_url}
            try:
                client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=self.timeout_s, max_retries=0)
            except (openai.OpenAIError, ValueError) as e:
                raise ConfigError(f"cannot configure the OpenAI client (pass api_key= or set OPENAI_API_KEY, or "
                                  f"base_url= for a server that needs no key): {one_line(e)}") from e
        else:
            self._settings = None
            client = self._injected(client)
        self._client = client

    def _reply(self, request: ReplyRequest) -> Ops[ModelReply]:
        if not request.user_text.strip():
            raise InvalidInput("reply needs a non-empty user text")
        system = "\n\n".join(p for p in (request.system.strip(),
                                         memory_block(request.memory_lines) if request.memory_lines else "") if p)
        messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        messages += [{"role": m.role, "content": m.content} for m in check_history(request.history)]
        messages.append({"role": "user", "content": request.user_text})
        answer, usage = yield from self._create(self.model_id, messages,
                                                request.max_tokens if request.max_tokens > 0 else self.max_tokens)
        choice, message = self._choice(self.model_id, answer)
        content = message.get("content")
        text = content.strip() if isinstance(content, str) else ""
        if not text:
            raise ModelError(f"{self.model_id} returned no text (finish_reason={choice.get('finish_reason')})")
        return ModelReply(text=text, usage=usage, model=self.model_id)

    def _tool_call(self, system: str, prompt: str, tool: ToolParam, max_tokens: int | None = None
                   ) -> Ops[tuple[dict[str, Any], Usage, bool]]:
        model, name = self.memory_model_id, tool["name"]
        answer, usage = yield from self._create(model, [{"role": "system", "content": system},
                                                        {"role": "user", "content": prompt}],
                                                max_tokens or self.max_tokens, tools=[function_tool(tool)],
                                                tool_choice={"type": "function", "function": {"name": name}})
        choice, message = self._choice(model, answer)
        cut = choice.get("finish_reason") == "length"
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or fn.get("name") != name:
                continue
            raw = fn.get("arguments")
            try:
                data = raw if isinstance(raw, dict) else json.loads(raw or "")
            except (TypeError, ValueError):
                data = None
            if not isinstance(data, dict):
                if cut:
                    return {}, usage, True
                raise ModelError(f"{name} arguments are not a JSON object: {one_line(raw, 120)}")
            return data, usage, cut
        if cut:
            return {}, usage, True
        raise ModelError(f"{model} did not call {name} (finish_reason={choice.get('finish_reason')})")

    def _choice(self, model: str, answer: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The first choice of a completion (JSON) and its message, or ModelError."""
        choices = answer.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ModelError(f"{model} answered without a choice")
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise ModelError(f"{model} answered with a choice of another shape: {one_line(choice, 120)}")
        return choice, message

    def _create(self, model: str, messages: list[dict[str, str]], max_tokens: int, **kw: Any
                ) -> Ops[tuple[dict[str, Any], Usage]]:
        """One chat-completions call with our retries; returns the completion as JSON
        (:func:`~soul_runtime.models.remote.json_answer`) and its (recorded) usage."""
        kw[self.token_field] = max_tokens
        return (yield from self._send(model, {"model": model, "messages": messages, **kw}, _usage_of))

    def _raw_create(self, client: Any) -> Any:
        return client.chat.completions.with_raw_response.create


def model_from_settings(env: Mapping[str, str], args: Mapping[str, str] | None = None) -> OpenAIChatModel:
    """An :class:`OpenAIChatModel` from ``args`` (``model_args``) first, else the environment: ``base_url``
    (``OPENAI_BASE_URL``), ``api_key`` (``OPENAI_API_KEY``; not needed with a ``base_url``), ``model``
    (``SOUL_OPENAI_MODEL``, required), ``memory_model`` (``SOUL_OPENAI_MEMORY_MODEL``, default: ``model``),
    ``timeout_s`` / ``max_retries`` (``SOUL_OPENAI_TIMEOUT_S`` / ``SOUL_OPENAI_MAX_RETRIES``), ``token_field``
    (``SOUL_OPENAI_TOKEN_FIELD``)."""
    args = dict(args or {})
    unknown = set(args) - {"api_key", "model", "memory_model", "base_url", "timeout_s", "max_retries", "token_field"}
    if unknown:
        raise ConfigError(f"model 'openai' does not take model_args {sorted(unknown)}")
    model = setting(args, "model", env, "SOUL_OPENAI_MODEL")
    if not model:
        raise ConfigError("model 'openai' needs a pinned model id: SOUL_OPENAI_MODEL in the environment or model in "
                          "model_args (with OPENAI_BASE_URL / base_url for a server other than OpenAI's)")
    return OpenAIChatModel(
        model_id=model, memory_model_id=setting(args, "memory_model", env, "SOUL_OPENAI_MEMORY_MODEL"),
        api_key=setting(args, "api_key", env, "OPENAI_API_KEY"), base_url=setting(args, "base_url", env, "OPENAI_BASE_URL"),
        timeout_s=number_setting(setting(args, "timeout_s", env, "SOUL_OPENAI_TIMEOUT_S"), "timeout_s", float, 60.0),
        max_retries=number_setting(setting(args, "max_retries", env, "SOUL_OPENAI_MAX_RETRIES"), "max_retries", int, 4),
        token_field=setting(args, "token_field", env, "SOUL_OPENAI_TOKEN_FIELD") or "max_tokens")
