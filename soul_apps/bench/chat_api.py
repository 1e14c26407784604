"""A local stand-in for OpenAI-compatible chat completions (stdlib only), for tests and benchmarks.

``POST /v1/chat/completions`` is answered the way :class:`~soul_apps.bench.messages_api.MessagesApiServer`
answers the Messages API (the same server: a queue of :class:`Scripted` responses, else a ``responder``,
every request recorded), so tests run the real ``openai`` SDK over real HTTP against
``http://127.0.0.1:PORT/v1``.

With ``count_tokens=True`` the server fills in ``usage`` as such servers report it: ``prompt_tokens`` are
characters / 4 of the request's tools and messages; the prefix of tools and the leading system message, when
at least ``cache_min_tokens`` long, is cached automatically (no marks, as OpenAI and vLLM's prefix cache do):
seen before, it is reported as ``prompt_tokens_details.cached_tokens``.

:func:`from_messages` serves chat completions with a responder written for the Messages API (such as
:func:`soul_apps.bench.claude_path.keep_everything`): the request is shown to it in the Messages API's
shape and its answer is sent back as a chat completion.

    with ChatCompletionsServer() as api:
        api.push(chat_text("hello"))
        client = openai.OpenAI(api_key="k", base_url=api.base_url + "/v1")
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable
from typing import Any

from soul_apps.bench.messages_api import Scripted, ScriptedApiServer, char_tokens

_ids = itertools.count(1)
_FINISH = {"end_turn": "stop", "max_tokens": "length", "tool_use": "tool_calls", "stop_sequence": "stop"}


def completion(message: dict[str, Any], *, model: str = "chat-test-1", finish_reason: str = "stop",
               prompt_tokens: int = 10, completion_tokens: int = 5, cached_tokens: int = 0) -> dict[str, Any]:
    """A response body shaped exactly like the API's ``ChatCompletion``."""
    return {"id": f"chatcmpl-{next(_ids):020d}", "object": "chat.completion", "created": 1_780_000_000,
            "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish_reason,
                                         "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens,
                      "prompt_tokens_details": {"cached_tokens": cached_tokens}}}


def chat_text(text: str | None, **kw: Any) -> Scripted:
    return Scripted(200, completion({"role": "assistant", "content": text}, **kw))


def chat_tool(name: str, arguments: Any, *, raw: str | None = None, content: str | None = None,
              finish_reason: str = "tool_calls", **kw: Any) -> Scripted:
    """A forced tool call; ``raw`` sends the arguments string as it is (e.g. JSON cut off)."""
    call = {"id": f"call_{next(_ids):020d}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments) if raw is None else raw}}
    return Scripted(200, completion({"role": "assistant", "content": content, "tool_calls": [call]},
                                    finish_reason=finish_reason, **kw))


def chat_error(status: int, etype: str, msg: str = "", *, headers: dict[str, str] | None = None,
               delay_s: float = 0.0) -> Scripted:
    body = {"error": {"message": msg or etype.replace("_", " "), "type": etype, "param": None, "code": None}}
    return Scripted(status, body, dict(headers or {}), delay_s)


def chat_usage(body: dict[str, Any], cache: set[str], cache_min_tokens: int) -> dict[str, Any]:
    """The input side of ``usage`` for a request, with automatic prefix caching emulated (``cache`` is updated)."""
    tools = list(body.get("tools") or [])
    messages = list(body.get("messages") or [])
    lead = messages[:1] if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system" else []
    prefix = tools + lead
    total = char_tokens(tools) + char_tokens(messages)
    n = char_tokens(prefix)
    cached = 0
    if prefix and n >= cache_min_tokens:
        key = hashlib.sha256((str(body.get("model")) + json.dumps(prefix, sort_keys=True)).encode()).hexdigest()
        cached = n if key in cache else 0
        cache.add(key)
    return {"prompt_tokens": total, "prompt_tokens_details": {"cached_tokens": cached}}


class ChatCompletionsServer(ScriptedApiServer):
    """The chat-completions stand-in (``POST /v1/chat/completions``; the SDK's ``base_url`` is ``base_url + "/v1"``)."""

    route = "/v1/chat/completions"
    name = "chat-api-server"

    def fill_usage(self, body: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
        out = {**usage, **chat_usage(body, self.cache, self.cache_min_tokens)}
        out["total_tokens"] = out["prompt_tokens"] + int(out.get("completion_tokens") or 0)
        return out

    def error(self, status: int, etype: str, msg: str = "", *, headers: dict[str, str] | None = None) -> Scripted:
        return chat_error(status, etype, msg, headers=headers)

    @property
    def api_url(self) -> str:
        """The SDK's ``base_url``."""
        return self.base_url + "/v1"


def messages_request(body: dict[str, Any]) -> dict[str, Any]:
    """A chat-completions request in the Messages API's shape (system apart, tools and the forced choice)."""
    msgs = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    out: dict[str, Any] = {"model": body.get("model"), "max_tokens": body.get("max_tokens"),
                           "system": "\n\n".join(str(m.get("content") or "") for m in msgs if m.get("role") == "system"),
                           "messages": [{"role": m.get("role"), "content": m.get("content")} for m in msgs
                                        if m.get("role") != "system"]}
    tools = [t["function"] for t in body.get("tools") or [] if isinstance(t, dict) and "function" in t]
    if tools:
        out["tools"] = [{"name": f.get("name"), "description": f.get("description"),
                         "input_schema": f.get("parameters")} for f in tools]
    forced = ((body.get("tool_choice") or {}).get("function") or {}).get("name") \
        if isinstance(body.get("tool_choice"), dict) else None
    if forced:
        out["tool_choice"] = {"type": "tool", "name": forced}
    return out


def chat_answer(scripted: Scripted) -> Scripted:
    """A Messages API answer (a ``Message`` or an error) as the chat-completions answer that means the same."""
    body = scripted.body
    if scripted.status != 200:
        found = body.get("error")
        err: dict[str, Any] = found if isinstance(found, dict) else {}
        return chat_error(scripted.status, str(err.get("type") or "api_error"), str(err.get("message") or ""),
                          headers=scripted.headers, delay_s=scripted.delay_s)
    text = "".join(b.get("text", "") for b in body.get("content", []) if b.get("type") == "text")
    calls = [{"id": f"call_{next(_ids):020d}", "type": "function",
              "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input"))}}
             for b in body.get("content", []) if b.get("type") == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    usage = body.get("usage") or {}
    chat = completion(message, model=str(body.get("model") or "chat-test-1"),
                      finish_reason=_FINISH.get(str(body.get("stop_reason")), "stop"),
                      prompt_tokens=int(usage.get("input_tokens") or 0),
                      completion_tokens=int(usage.get("output_tokens") or 0))
    return Scripted(200, chat, dict(scripted.headers), scripted.delay_s)


def from_messages(responder: Callable[[dict[str, Any]], Scripted]) -> Callable[[dict[str, Any]], Scripted]:
    """A chat-completions responder that asks the Messages API ``responder`` and translates both ways."""
    return lambda body: chat_answer(responder(messages_request(body)))
