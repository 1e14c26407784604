"""AnthropicModel against a real local HTTP server speaking the Messages API, through the real SDK."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from soul_apps.bench.messages_api import (
    MessagesApiServer,
    Scripted,
    delayed,
    error,
    message,
    text_message,
    tool_message,
)
from soul_runtime.errors import ConfigError, InvalidInput, ModelError, ModelTimeout
from soul_runtime.models.base import ChatMessage, Exchange, ReplyRequest, Usage
from soul_runtime.models.claude import DEFAULT_MEMORY_MODEL_ID, DEFAULT_MODEL_ID, AnthropicModel, model_from_env
from soul_runtime.records import FactCandidate, TaskReport

MODEL = "claude-test-20250101"
KEY = "sk-ant-test-key"


@pytest.fixture
def api() -> Iterator[MessagesApiServer]:
    with MessagesApiServer() as server:
        yield server


def make(api: MessagesApiServer, **kw: object) -> AnthropicModel:
    opts: dict[str, object] = {"model_id": MODEL, "api_key": KEY, "base_url": api.base_url, "timeout_s": 5.0,
                               "max_retries": 2, "retry_base_delay_s": 0.01}
    opts.update(kw)
    return AnthropicModel(**opts)  # type: ignore[arg-type]


def exchange(**kw: object) -> Exchange:
    opts: dict[str, object] = {
        "user_text": "My favourite colour is green now, not blue. Also I deployed the blog: built it, then ran rsync.",
        "reply_text": "Noted, green it is. Glad the deploy worked.",
        "speaker": "Ana", "message_ids": ("m1", "m2"), "at": 1_700_000_000.0,
        "persona": "You are Sol, a calm assistant.", "recalled": ("f:ana:favorite_color: blue",),
    }
    opts.update(kw)
    return Exchange(**opts)  # type: ignore[arg-type]


def request(**kw: object) -> ReplyRequest:
    opts: dict[str, object] = {"system": "You are Sol.", "memory_lines": ("f1: Ana likes tea", "e7: Ana moved to Oslo"),
                               "history": (ChatMessage("user", "hi"), ChatMessage("assistant", "hello Ana")),
                               "user_text": "what do I drink?", "user": "Ana", "max_tokens": 300}
    opts.update(kw)
    return ReplyRequest(**opts)  # type: ignore[arg-type]


def key_sent(headers: dict[str, str]) -> bool:
    # this SDK sends the key as a bearer token; older ones used x-api-key
    return headers.get("x-api-key") == KEY or headers.get("authorization") == f"Bearer {KEY}"


GOOD_EXTRACTION = {
    "facts": [
        {"entity": "Ana", "attribute": "Favorite Color", "value": "green", "kind": "corrected"},
        {"entity": "ana", "attribute": "blog_host", "value": "rsync target", "kind": "stated"},
    ],
    "episode": "Ana switched her favourite colour to green and deployed her blog.",
    "event": True,
    "entities": ["Ana", "blog", "Ana"],
    "task": {"task_class": "deploy_blog", "steps": ["build the site", "run rsync"], "outcome": "success",
             "save_requested": False},
}


# ---- reply -------------------------------------------------------------------

def test_reply_sends_context_and_records_usage(api: MessagesApiServer) -> None:
    api.push(text_message("You drink tea.", input_tokens=42, output_tokens=7))
    model = make(api)
    out = model.reply(request())
    assert out.text == "You drink tea."
    assert out.usage == Usage(42, 7, 1) and model.usage_total == Usage(42, 7, 1)
    (req,) = api.requests
    assert req.path == "/v1/messages" and key_sent(req.headers) and req.headers.get("anthropic-version")
    body = req.body
    assert body["model"] == MODEL and body["max_tokens"] == 300
    assert body["system"] == [  # the persona first (static per soul: the cacheable prefix), then the memories
        {"type": "text", "text": "You are Sol."},
        {"type": "text", "text": "Relevant memories:\n- f1: Ana likes tea\n- e7: Ana moved to Oslo"}]
    assert body["thinking"] == {"type": "disabled"}
    assert body["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello Ana"},
                                {"role": "user", "content": "what do I drink?"}]
    assert "tools" not in body and "tool_choice" not in body


def test_an_instant_stand_in_answers_with_nagle_off_on_a_kept_alive_connection() -> None:
    # an instant stand-in is the baseline of the model benchmarks: its answers must not wait for the
    # client's delayed ACK (about 40 ms a call on Linux when headers and body leave in two writes under Nagle),
    # so every connection it accepts has TCP_NODELAY set (the latency itself is measured by the benchmarks)
    with MessagesApiServer(responder=lambda body: text_message("ok")) as server:
        handler = server._httpd.RequestHandlerClass
        nodelay: list[int] = []
        setup = handler.setup

        def recording_setup(self: Any) -> None:
            setup(self)
            nodelay.append(self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        handler.setup = recording_setup  # type: ignore[method-assign]
        model = make(server)
        for _ in range(3):
            assert model.reply(request()).text == "ok"
        assert len(nodelay) == 1 and nodelay[0] != 0  # one kept-alive connection, Nagle off


def test_reply_without_memories_and_running_total(api: MessagesApiServer) -> None:
    api.push(text_message("one", input_tokens=3, output_tokens=1), text_message("two", input_tokens=5, output_tokens=2))
    model = make(api)
    model.reply(request(memory_lines=(), history=()))
    model.reply(request(memory_lines=(), history=(), max_tokens=0))
    assert api.requests[0].body["system"] == [{"type": "text", "text": "You are Sol."}]
    assert api.requests[1].body["max_tokens"] == model.max_tokens == 1024
    assert model.usage_total == Usage(8, 3, 2)
    api.push(text_message("three"))
    model.reply(request(system=" ", memory_lines=()))
    assert "system" not in api.requests[2].body  # an empty system prompt is left out


def test_reply_rejects_bad_input_and_empty_answer(api: MessagesApiServer) -> None:
    model = make(api)
    with pytest.raises(InvalidInput):
        model.reply(request(user_text="  "))
    with pytest.raises(InvalidInput):
        model.reply(request(history=(ChatMessage("system", "x"),)))
    assert api.requests == []
    api.push(tool_message("whatever", {}))
    with pytest.raises(ModelError, match="no text"):
        model.reply(request())


@pytest.mark.parametrize("body", [{"content": "just text", "stop_reason": "end_turn"}, {"content": [7]},
                                  ["not", "an", "object"], {"usage": {}}, {"content": [{"type": "text", "text": 7}]}])
def test_an_answer_of_another_shape_is_a_model_error(api: MessagesApiServer, body: object) -> None:
    refuses_the_shape(make(api, max_retries=0), api, body)


def refuses_the_shape(model: Any, api: Any, body: object) -> None:
    """A 200 answer of ``body`` is a one-line ModelError for a reply and for an async memory decision."""
    api.push(Scripted(200, body), Scripted(200, body))  # type: ignore[arg-type]
    with pytest.raises(ModelError) as info:
        model.reply(request())
    assert "\n" not in str(info.value)
    with pytest.raises(ModelError):
        asyncio.run(model.asynchronous().decide(exchange()))


def test_odd_usage_counts_are_read_as_zero(api: MessagesApiServer) -> None:
    body = message([{"type": "text", "text": "fine"}])
    body["usage"] = {"input_tokens": "12", "output_tokens": True, "cache_read_input_tokens": None}
    api.push(Scripted(200, body))
    model = make(api)
    assert model.reply(request()).usage == Usage(calls=1)


# ---- structured output through tool use --------------------------------------

def test_decide_parses_one_tool_call_into_decision_and_extraction(api: MessagesApiServer) -> None:
    api.push(tool_message("record_memory", {"persist": True, "categories": ["Preference", "gossip", "fact", "fact"],
                                            "reason": "states a preference\nand a fact", **GOOD_EXTRACTION},
                          preamble="Let me record that.", input_tokens=200, output_tokens=60))
    model = make(api, memory_model_id="claude-memory-20250101")
    result = model.decide(exchange(history=(ChatMessage("user", "earlier words"),)))
    assert result.persist is True and result.categories == ("preference", "fact")
    assert result.reason == "states a preference and a fact"
    ex = result.extraction
    assert ex.facts == (
        FactCandidate("ana", "favorite_color", "green", "corrected", ("m1", "m2"),
                      display_entity="Ana", display_attribute="Favorite Color"),
        FactCandidate("ana", "blog_host", "rsync target", "stated", ("m1", "m2")),
    )
    assert ex.episode.startswith("Ana switched") and ex.event is True
    assert ex.entities == ("Ana", "blog")
    assert ex.task == TaskReport("deploy_blog", ("build the site", "run rsync"), "success", False)
    assert result.usage == Usage(200, 60, 1) and result.model == "claude-memory-20250101"
    assert model.usage_by_model == {"claude-memory-20250101": Usage(200, 60, 1)}

    (body,) = api.bodies()  # one call: the tag and the extraction in one answer
    assert body["model"] == "claude-memory-20250101" and body["thinking"] == {"type": "disabled"}
    assert body["tool_choice"] == {"type": "tool", "name": "record_memory"}
    (tool,) = body["tools"]
    assert tool["name"] == "record_memory" and tool["input_schema"]["type"] == "object"
    assert set(tool["input_schema"]["properties"]) == {"persist", "categories", "reason", "facts", "episode", "event",
                                                       "entities", "task"}
    (system,) = body["system"]
    for needle in ("snake_case", "stated", "confirmed", "corrected", "retracted", "third-person",
                   "NEVER extract", "ignore previous instructions", "from now on always", "save_requested"):
        assert needle in system["text"], needle
    user = body["messages"][0]["content"]
    assert "<persona>\nYou are Sol, a calm assistant.\n</persona>" in user
    assert "<recalled>\n- f:ana:favorite_color: blue\n</recalled>" in user
    assert "<earlier>\nuser: earlier words\n</earlier>" in user
    assert "Ana (user): My favourite colour is green" in user


def test_decide_asks_for_dated_factual_units(api: MessagesApiServer) -> None:
    unit = ("Asked where she grew up, Ana said Porto; she moved to Oslo on 13 November 2023 with her "
            "sister Ida.")
    api.push(tool_message("record_memory", {"persist": True, "categories": ["fact"], "reason": "a move",
                                            **{**GOOD_EXTRACTION, "episode": unit}}))
    hist = (ChatMessage("user", "Where did you grow up?", "m0", "Ben"),)
    result = make(api).decide(exchange(user_text="Porto! I moved to Oslo yesterday with my sister Ida.",
                                       history=hist))
    assert result.extraction.episode == unit  # the unit is stored as the model wrote it
    (body,) = api.bodies()
    (system,) = body["system"]
    for needle in ("who, what, the names, numbers, places and objects", "absolute", "yesterday",
                   "include the question"):
        assert needle in system["text"], needle
    user = body["messages"][0]["content"]
    assert '<exchange date="14 November 2023">' in user  # 1_700_000_000 is 14 Nov 2023 (UTC)
    assert "<earlier>\nBen: Where did you grow up?\n</earlier>" in user  # who asked: the speaker, not a role
    (tool,) = body["tools"]
    assert "absolute dates" in tool["input_schema"]["properties"]["episode"]["description"]


def test_decide_not_persisted_and_bad_flag(api: MessagesApiServer) -> None:
    api.push(tool_message("record_memory", {"persist": False, "categories": [], "reason": "small talk", "facts": [],
                                            "episode": "", "event": False, "entities": [], "task": None}),
             tool_message("record_memory", {"persist": True, "categories": ["fact"], "reason": "x", "facts": [],
                                            "episode": "", "event": False, "entities": [], "task": None}),
             tool_message("record_memory", {"persist": "maybe", "categories": []}))
    model = make(api)
    first = model.decide(exchange(persona="", recalled=()))
    assert first.persist is False and first.reason == "small talk" and first.extraction.episode == ""
    user = api.requests[0].body["messages"][0]["content"]
    assert "<persona>" not in user and "<recalled>" not in user
    second = model.decide(exchange())  # "persist" with nothing in it keeps nothing
    assert second.persist is False and "nothing extracted" in second.reason
    with pytest.raises(ModelError, match="persist"):
        model.decide(exchange())


def test_decide_drops_malformed_items(api: MessagesApiServer) -> None:
    api.push(tool_message("record_memory", {
        "persist": True, "categories": ["fact"], "reason": "facts",
        "facts": [
            {"entity": "Ana", "attribute": "pet", "value": "cat", "kind": "stated"},
            {"entity": "Ana", "attribute": "pet", "value": "dog", "kind": "guessed"},  # bad kind
            {"entity": "", "attribute": "pet", "value": "dog", "kind": "stated"},  # empty entity
            {"attribute": "age", "value": "3", "kind": "stated"},  # no entity
            {"entity": "Ana", "attribute": "!!!", "value": "x", "kind": "stated"},  # attribute empties out
            {"entity": "Ana", "attribute": "age", "value": True, "kind": "stated"},  # bool value
            {"entity": "Ana", "attribute": "age", "value": 34, "kind": "confirmed"},  # number: kept as text
            {"entity": "Ana", "attribute": "employer", "value": "", "kind": "retracted"},  # retraction w/o value
            {"entity": "Ana", "attribute": "city", "value": "", "kind": "stated"},  # empty value
            "Ana likes cats",
            None,
        ],
        "episode": 17,
        "event": "yes",
        "entities": ["Ana", 3, "", None],
        "task": {"task_class": "Deploy Blog", "steps": ["build", 5, ""], "outcome": "maybe", "save_requested": "y"},
    }))
    ex = make(api).decide(exchange()).extraction
    assert [(f.attribute, f.value, f.kind) for f in ex.facts] == [
        ("pet", "cat", "stated"), ("age", "34", "confirmed"), ("employer", "", "retracted")]
    assert ex.episode == "" and ex.event is False and ex.entities == ("Ana",)
    assert ex.task == TaskReport("deploy_blog", ("build",), "", False)


def test_decide_accepts_json_encoded_nested_fields(api: MessagesApiServer) -> None:
    encoded = dict(GOOD_EXTRACTION, persist=True, categories=["fact"], reason="r",
                   facts=json.dumps(GOOD_EXTRACTION["facts"]), task=json.dumps(GOOD_EXTRACTION["task"]))
    api.push(tool_message("record_memory", encoded))
    ex = make(api).decide(exchange()).extraction
    assert len(ex.facts) == 2 and ex.task is not None and ex.task.task_class == "deploy_blog"


@pytest.mark.parametrize("scripted", [
    tool_message("record_memory", {"persist": True, "something": "else"}),
    tool_message("record_memory", ["not", "an", "object"]),
    tool_message("another_tool", GOOD_EXTRACTION),
    text_message("I'd rather answer in prose."),
])
def test_decide_wholly_invalid_is_model_error(api: MessagesApiServer, scripted: object) -> None:
    api.push(scripted)  # type: ignore[arg-type]
    with pytest.raises(ModelError):
        make(api).decide(exchange())
    assert len(api.requests) == 1  # a bad answer is not retried


def test_classify_task(api: MessagesApiServer) -> None:
    known = ("deploy_blog", "write_report")
    api.push(tool_message("record_task_class", {"task_class": "deploy_blog", "confidence": 1.7}),
             tool_message("record_task_class", {"task_class": "bake_bread", "confidence": 0.9}),
             tool_message("record_task_class", {"task_class": None, "confidence": 0.2}),
             tool_message("record_task_class", {"confidence": 0.2}))
    model = make(api)
    first = model.classify_task("please ship my blog", known)
    assert first.task_class == "deploy_blog" and first.confidence == 1.0 and first.usage.calls == 1
    assert "- deploy_blog\n- write_report" in api.requests[0].body["messages"][0]["content"]
    assert model.classify_task("bake something", known).task_class is None  # not a known class
    assert model.classify_task("hello", known).task_class is None
    with pytest.raises(ModelError):
        model.classify_task("hello", known)
    assert model.classify_task("anything", ()).task_class is None  # nothing to choose from: no call
    assert len(api.requests) == 4 and model.usage_total.calls == 4


# ---- retries, timeouts and errors --------------------------------------------

def test_overloaded_then_success(api: MessagesApiServer) -> None:
    api.push(error(529, "overloaded_error", "Overloaded"), text_message("fine now"))
    model = make(api)
    assert model.reply(request()).text == "fine now"
    assert len(api.requests) == 2 and api.requests[0].body == api.requests[1].body
    assert model.usage_total.calls == 1


def test_rate_limit_honours_retry_after(api: MessagesApiServer) -> None:
    api.push(error(429, "rate_limit_error", headers={"retry-after": "0.3"}), text_message("ok"))
    model = make(api, retry_base_delay_s=0.0)
    start = time.monotonic()
    assert model.reply(request()).text == "ok"
    assert time.monotonic() - start >= 0.3
    assert len(api.requests) == 2


def test_retry_delays_follow_headers_then_backoff(api: MessagesApiServer) -> None:
    slept: list[float] = []
    api.push(error(429, "rate_limit_error", headers={"retry-after-ms": "1500"}),
             error(429, "rate_limit_error", headers={"retry-after": "2"}),
             error(503, "api_error"), error(500, "api_error"), text_message("ok"))
    model = make(api, max_retries=4, retry_base_delay_s=1.0, sleep=slept.append)
    assert model.reply(request()).text == "ok"
    assert slept[:2] == [1.5, 2.0]
    assert 0.75 * 4 <= slept[2] <= 4 and 0.75 * 8 <= slept[3] <= 8  # 1 s * 2**attempt, with jitter
    assert len(api.requests) == 5


def test_retries_exhausted_is_model_error(api: MessagesApiServer) -> None:
    api.push(*[error(500, "api_error", "Internal server error")] * 3)
    with pytest.raises(ModelError, match=r"^Anthropic API error 500 api_error after 3 attempts") as info:
        make(api, max_retries=2).reply(request())
    assert "\n" not in str(info.value)
    assert len(api.requests) == 3 and api.pending == 0


def test_bad_request_is_not_retried(api: MessagesApiServer) -> None:
    api.push(error(400, "invalid_request_error", "messages: roles must alternate\nbetween user and assistant"),
             text_message("never sent"))
    with pytest.raises(ModelError) as info:
        make(api).reply(request())
    assert str(info.value) == ("Anthropic API error 400 invalid_request_error: messages: roles must alternate "
                               "between user and assistant")
    assert not isinstance(info.value, ModelTimeout)
    assert len(api.requests) == 1


def test_server_retry_verdict_wins(api: MessagesApiServer) -> None:
    api.push(error(503, "api_error", headers={"x-should-retry": "false"}),
             error(400, "invalid_request_error", headers={"x-should-retry": "true"}), text_message("ok"))
    model = make(api)
    with pytest.raises(ModelError, match="503"):
        model.reply(request())
    assert model.reply(request()).text == "ok" and len(api.requests) == 3


def test_rejected_key(api: MessagesApiServer) -> None:
    api.push(error(401, "authentication_error", "invalid x-api-key"))
    with pytest.raises(ModelError, match="rejected the API key"):
        make(api).decide(exchange())
    assert len(api.requests) == 1


def test_timeout_is_model_timeout(api: MessagesApiServer) -> None:
    api.push(delayed(text_message("too late"), 60.0))
    model = make(api, timeout_s=0.5, max_retries=0)
    with pytest.raises(ModelTimeout, match="within 0.5s"):
        model.reply(request())
    assert api.in_flight == 1  # given up while the server still holds its answer
    assert len(api.requests) == 1 and model.usage_total == Usage()


def test_timeout_then_success_is_retried(api: MessagesApiServer) -> None:
    api.push(delayed(text_message("too late"), 3.0), text_message("in time"))
    assert make(api, timeout_s=0.5, max_retries=1).reply(request()).text == "in time"
    assert len(api.requests) == 2


def test_unreachable_server_is_model_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = AnthropicModel(model_id=MODEL, api_key=KEY, base_url=f"http://127.0.0.1:{port}", max_retries=1,
                           retry_base_delay_s=0.01, timeout_s=2.0)
    with pytest.raises(ModelError, match="cannot reach") as info:
        model.reply(request())
    assert not isinstance(info.value, ModelTimeout)


def test_an_injected_async_client_serves_the_blocking_methods_and_the_async_view(api: MessagesApiServer) -> None:
    serves_both_ways(lambda: AnthropicModel(model_id=MODEL, client=anthropic.AsyncAnthropic(api_key=KEY,
                                                                                          base_url=api.base_url),
                                            max_retries=0), api, text_message)


def serves_both_ways(make: Callable[[], Any], api: Any, answer: Callable[[str], Any]) -> None:
    """Models made by ``make`` (each with an async client of its own: it is bound to the event loop that first
    uses it) answer through the blocking methods and through the asynchronous view."""
    api.push(*(answer(t) for t in ("blocking 1", "blocking 2", "awaited 1", "awaited 2")))
    blocking = make()
    assert [blocking.reply(request()).text for _ in range(2)] == ["blocking 1", "blocking 2"]
    awaited = make()

    async def two() -> list[str]:
        view = awaited.asynchronous()
        return [(await view.reply(request())).text for _ in range(2)]
    assert asyncio.run(two()) == ["awaited 1", "awaited 2"]
    assert len(api.requests) == 4 and blocking.usage_total.calls == awaited.usage_total.calls == 2


def test_injected_client_retries_are_ours(api: MessagesApiServer) -> None:
    client = anthropic.Anthropic(api_key=KEY, base_url=api.base_url, max_retries=5)
    api.push(error(529, "overloaded_error"), text_message("unused"))
    model = AnthropicModel(model_id=MODEL, client=client, max_retries=0, deadline_s=0)
    with pytest.raises(ModelError, match="529 overloaded_error"):
        model.reply(request())
    assert len(api.requests) == 1  # the SDK's own retries are off
    assert model.reply(request()).text == "unused" and key_sent(api.requests[1].headers)


# ---- configuration -----------------------------------------------------------

@pytest.mark.parametrize("model_id", ["", "   ", " claude-x-20250101", "claude-3-5-sonnet-latest", None, 7])
def test_model_id_must_be_pinned(model_id: object) -> None:
    with pytest.raises(ConfigError):
        AnthropicModel(model_id=model_id, api_key=KEY)  # type: ignore[arg-type]


@pytest.mark.parametrize("kw", [{"timeout_s": 0}, {"timeout_s": float("nan")}, {"max_retries": -1},
                                {"max_retries": 1.5}, {"max_tokens": 0}, {"max_tokens": True},
                                {"retry_base_delay_s": -1}])
def test_numeric_options_are_validated(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        AnthropicModel(model_id=MODEL, api_key=KEY, **kw)  # type: ignore[arg-type]


def test_missing_key_is_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE", "ANTHROPIC_IDENTITY_TOKEN",
                 "ANTHROPIC_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="API key"):
        AnthropicModel(model_id=MODEL)


def test_model_from_env(api: MessagesApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    assert model_from_env({}) is None
    assert model_from_env({"ANTHROPIC_API_KEY": "  ", "SOUL_ANTHROPIC_MODEL": MODEL}) is None
    default = model_from_env({"ANTHROPIC_API_KEY": KEY})
    assert isinstance(default, AnthropicModel) and default.model_id == DEFAULT_MODEL_ID == "claude-sonnet-5-5"
    assert default.memory_model_id == DEFAULT_MEMORY_MODEL_ID == "claude-haiku-5-5"
    assert default.offline is False and default.label == DEFAULT_MODEL_ID
    assert str(default._client.base_url).startswith("https://api.anthropic.com")
    with pytest.raises(ConfigError):
        model_from_env({"ANTHROPIC_API_KEY": KEY, "SOUL_ANTHROPIC_MODEL": "claude-sonnet-latest"})
    with pytest.raises(ConfigError, match="memory_model_id"):
        model_from_env({"ANTHROPIC_API_KEY": KEY, "SOUL_ANTHROPIC_MEMORY_MODEL": "claude-haiku-latest"})
    assert model_from_env({"ANTHROPIC_API_KEY": KEY, "SOUL_ANTHROPIC_MEMORY_MODEL": "claude-m-1"}).memory_model_id == (
        "claude-m-1")

    model = model_from_env({"ANTHROPIC_API_KEY": KEY, "SOUL_ANTHROPIC_MODEL": MODEL, "ANTHROPIC_BASE_URL": api.base_url})
    assert isinstance(model, AnthropicModel) and model.model_id == MODEL
    api.push(text_message("via env"))
    assert model.reply(request()).text == "via env"
    assert api.requests[0].body["model"] == MODEL and key_sent(api.requests[0].headers)
