"""OpenAIChatModel against a real local HTTP server speaking chat completions, through the real ``openai`` SDK;
and the Anthropic adapter with an injected client (as ``anthropic.AnthropicBedrock`` would be)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import openai
import pytest

from soul_apps.bench.chat_api import ChatCompletionsServer, chat_error, chat_text, chat_tool
from soul_apps.bench.messages_api import delayed
from soul_runtime.errors import ConfigError, InvalidInput, ModelError, ModelTimeout
from soul_runtime.models.base import ChatMessage, Exchange, Usage
from soul_runtime.models.choice import make_model
from soul_runtime.models.claude import AnthropicModel
from soul_runtime.models.openai_chat import OpenAIChatModel, model_from_settings
from soul_runtime.records import FactCandidate, TaskReport
from tests.test_anthropic_model import GOOD_EXTRACTION, exchange, refuses_the_shape, request, serves_both_ways

MODEL = "llama-test-3.1-8b"
KEY = "sk-test-key"


@pytest.fixture
def api() -> Iterator[ChatCompletionsServer]:
    with ChatCompletionsServer() as server:
        yield server


def make(api: ChatCompletionsServer, **kw: object) -> OpenAIChatModel:
    opts: dict[str, object] = {"model_id": MODEL, "api_key": KEY, "base_url": api.api_url, "timeout_s": 5.0,
                               "max_retries": 2, "retry_base_delay_s": 0.01}
    opts.update(kw)
    return OpenAIChatModel(**opts)  # type: ignore[arg-type]


def forced(body: dict[str, Any]) -> str | None:
    return ((body.get("tool_choice") or {}).get("function") or {}).get("name")


# ---- reply -------------------------------------------------------------------

def test_reply_sends_context_and_records_usage(api: ChatCompletionsServer) -> None:
    api.push(chat_text("You drink tea.", prompt_tokens=42, completion_tokens=7))
    model = make(api)
    out = model.reply(request())
    assert out.text == "You drink tea." and out.model == MODEL
    assert out.usage == Usage(42, 7, 1) and model.usage_total == Usage(42, 7, 1)
    (req,) = api.requests
    assert req.path == "/v1/chat/completions" and req.headers.get("authorization") == f"Bearer {KEY}"
    body = req.body
    assert body["model"] == MODEL and body["max_tokens"] == 300
    assert body["messages"] == [  # one system message: the persona (static per soul) first, then the memories
        {"role": "system", "content": "You are Sol.\n\nRelevant memories:\n- f1: Ana likes tea\n"
                                      "- e7: Ana moved to Oslo"},
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello Ana"},
        {"role": "user", "content": "what do I drink?"}]
    assert "tools" not in body and "tool_choice" not in body


def test_reply_without_memories_and_running_total(api: ChatCompletionsServer) -> None:
    api.push(chat_text("one", prompt_tokens=3, completion_tokens=1), chat_text("two", prompt_tokens=5,
                                                                               completion_tokens=2))
    model = make(api, token_field="max_completion_tokens")
    model.reply(request(memory_lines=(), history=()))
    model.reply(request(memory_lines=(), history=(), max_tokens=0))
    assert api.requests[0].body["messages"][0] == {"role": "system", "content": "You are Sol."}
    assert api.requests[1].body["max_completion_tokens"] == model.max_tokens == 1024
    assert "max_tokens" not in api.requests[1].body
    assert model.usage_total == Usage(8, 3, 2)
    api.push(chat_text("three"))
    model.reply(request(system=" ", memory_lines=()))
    assert [m["role"] for m in api.requests[2].body["messages"]] == ["user", "assistant", "user"]  # no empty system


def test_reply_rejects_bad_input_and_empty_answer(api: ChatCompletionsServer) -> None:
    model = make(api)
    with pytest.raises(InvalidInput):
        model.reply(request(user_text="  "))
    with pytest.raises(InvalidInput):
        model.reply(request(history=(ChatMessage("system", "x"),)))
    assert api.requests == []
    api.push(chat_text(None, finish_reason="content_filter"))
    with pytest.raises(ModelError, match="no text .*content_filter"):
        model.reply(request())


def test_cached_prompt_tokens_are_cache_reads(api: ChatCompletionsServer) -> None:
    api.push(chat_text("ok", prompt_tokens=1000, completion_tokens=4, cached_tokens=768))
    out = make(api).reply(request())
    assert out.usage == Usage(input_tokens=232, output_tokens=4, calls=1, cache_read_tokens=768)


@pytest.mark.parametrize("body", [{"choices": []}, {"choices": ["text"]}, {"choices": [{"message": "hi"}]},
                                  [1, 2], {"choices": [{"message": {"content": 7}}]},
                                  {"choices": [{"message": {"tool_calls": "record_memory"}}]}])
def test_an_answer_of_another_shape_is_a_model_error(api: ChatCompletionsServer, body: object) -> None:
    refuses_the_shape(make(api, max_retries=0), api, body)


# ---- structured output through one forced function call -------------------------------

def test_decide_parses_one_tool_call_into_decision_and_extraction(api: ChatCompletionsServer) -> None:
    api.push(chat_tool("record_memory", {"persist": True, "categories": ["Preference", "gossip", "fact", "fact"],
                                         "reason": "states a preference\nand a fact", **GOOD_EXTRACTION},
                       content="Let me record that.", prompt_tokens=200, completion_tokens=60))
    model = make(api, memory_model_id="qwen-memory-2.5-7b")
    result = model.decide(exchange(history=(ChatMessage("user", "earlier words"),)))
    assert result.persist is True and result.categories == ("preference", "fact")
    assert result.reason == "states a preference and a fact"
    ex = result.extraction
    assert ex.facts == (
        FactCandidate("ana", "favorite_color", "green", "corrected", ("m1", "m2"),
                      display_entity="Ana", display_attribute="Favorite Color"),
        FactCandidate("ana", "blog_host", "rsync target", "stated", ("m1", "m2")),
    )
    assert ex.episode.startswith("Ana switched") and ex.event is True and ex.entities == ("Ana", "blog")
    assert ex.task == TaskReport("deploy_blog", ("build the site", "run rsync"), "success", False)
    assert result.usage == Usage(200, 60, 1) and result.model == "qwen-memory-2.5-7b"
    assert model.usage_by_model == {"qwen-memory-2.5-7b": Usage(200, 60, 1)}

    (body,) = api.bodies()  # one call: the decision and the extraction in one answer
    assert body["model"] == "qwen-memory-2.5-7b"
    assert body["tool_choice"] == {"type": "function", "function": {"name": "record_memory"}}
    (tool,) = body["tools"]
    assert tool["type"] == "function" and tool["function"]["name"] == "record_memory"
    assert set(tool["function"]["parameters"]["properties"]) == {"persist", "categories", "reason", "facts",
                                                                 "episode", "event", "entities", "task"}
    system, user = body["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    for needle in ("snake_case", "stated", "confirmed", "corrected", "retracted", "third-person",
                   "NEVER extract", "ignore previous instructions", "from now on always", "save_requested"):
        assert needle in system["content"], needle
    assert "<persona>\nYou are Sol, a calm assistant.\n</persona>" in user["content"]
    assert "<recalled>\n- f:ana:favorite_color: blue\n</recalled>" in user["content"]
    assert "<earlier>\nuser: earlier words\n</earlier>" in user["content"]
    assert "Ana (user): My favourite colour is green" in user["content"]


def test_decide_not_persisted_and_bad_flag(api: ChatCompletionsServer) -> None:
    nothing = {"categories": [], "facts": [], "episode": "", "event": False, "entities": [], "task": None}
    api.push(chat_tool("record_memory", {"persist": False, "reason": "small talk", **nothing}),
             chat_tool("record_memory", {"persist": True, "reason": "x", **nothing}),
             chat_tool("record_memory", {"persist": "maybe", "categories": []}))
    model = make(api)
    first = model.decide(exchange(persona="", recalled=()))
    assert first.persist is False and first.reason == "small talk"
    second = model.decide(exchange())
    assert second.persist is False and "nothing extracted" in second.reason
    with pytest.raises(ModelError, match="persist"):
        model.decide(exchange())


def test_decide_accepts_json_encoded_nested_fields(api: ChatCompletionsServer) -> None:
    encoded = dict(GOOD_EXTRACTION, persist=True, categories=["fact"], reason="r",
                   facts=json.dumps(GOOD_EXTRACTION["facts"]), task=json.dumps(GOOD_EXTRACTION["task"]))
    api.push(chat_tool("record_memory", encoded))
    ex = make(api).decide(exchange()).extraction
    assert len(ex.facts) == 2 and ex.task is not None and ex.task.task_class == "deploy_blog"


@pytest.mark.parametrize("scripted", [
    chat_tool("record_memory", {"persist": True, "something": "else"}),
    chat_tool("record_memory", ["not", "an", "object"]),
    chat_tool("record_memory", None, raw='{"persist": tru'),
    chat_tool("another_tool", GOOD_EXTRACTION),
    chat_text("I'd rather answer in prose."),
])
def test_decide_wholly_invalid_is_model_error(api: ChatCompletionsServer, scripted: object) -> None:
    api.push(scripted)  # type: ignore[arg-type]
    with pytest.raises(ModelError):
        make(api).decide(exchange())
    assert len(api.requests) == 1  # a bad answer is not retried


def test_classify_task(api: ChatCompletionsServer) -> None:
    known = ("deploy_blog", "write_report")
    api.push(chat_tool("record_task_class", {"task_class": "deploy_blog", "confidence": 1.7}),
             chat_tool("record_task_class", {"task_class": "bake_bread", "confidence": 0.9}),
             chat_tool("record_task_class", {"confidence": 0.2}))
    model = make(api)
    first = model.classify_task("please ship my blog", known)
    assert first.task_class == "deploy_blog" and first.confidence == 1.0 and first.usage.calls == 1
    assert "- deploy_blog\n- write_report" in api.requests[0].body["messages"][1]["content"]
    assert forced(api.requests[0].body) == "record_task_class"
    assert model.classify_task("bake something", known).task_class is None
    with pytest.raises(ModelError):
        model.classify_task("hello", known)
    assert model.classify_task("anything", ()).task_class is None and len(api.requests) == 3


# ---- retries, timeouts and errors --------------------------------------------

def test_overloaded_then_success(api: ChatCompletionsServer) -> None:
    api.push(chat_error(503, "server_error", "overloaded"), chat_text("fine now"))
    model = make(api)
    assert model.reply(request()).text == "fine now"
    assert len(api.requests) == 2 and api.requests[0].body == api.requests[1].body
    assert model.usage_total.calls == 1


def test_retry_delays_follow_headers_then_backoff(api: ChatCompletionsServer) -> None:
    slept: list[float] = []
    api.push(chat_error(429, "rate_limit_exceeded", headers={"retry-after-ms": "1500"}),
             chat_error(429, "rate_limit_exceeded", headers={"retry-after": "2"}),
             chat_error(503, "server_error"), chat_error(500, "server_error"), chat_text("ok"))
    model = make(api, max_retries=4, retry_base_delay_s=1.0, sleep=slept.append)
    assert model.reply(request()).text == "ok"
    assert slept[:2] == [1.5, 2.0]
    assert 0.75 * 4 <= slept[2] <= 4 and 0.75 * 8 <= slept[3] <= 8
    assert len(api.requests) == 5


def test_retries_exhausted_bad_request_and_rejected_key(api: ChatCompletionsServer) -> None:
    api.push(*[chat_error(500, "server_error", "Internal server error")] * 3)
    with pytest.raises(ModelError, match=r"^OpenAI-compatible API error 500 server_error after 3 attempts") as info:
        make(api, max_retries=2).reply(request())
    assert "\n" not in str(info.value) and len(api.requests) == 3
    api.push(chat_error(400, "invalid_request_error", "tool_choice is not supported\nby this model"),
             chat_text("never sent"))
    with pytest.raises(ModelError) as bad:
        make(api).decide(exchange())
    assert str(bad.value) == ("OpenAI-compatible API error 400 invalid_request_error: tool_choice is not supported "
                              "by this model")
    assert len(api.requests) == 4 and api.pending == 1  # not retried
    assert make(api).reply(request()).text == "never sent"
    api.push(chat_error(401, "invalid_api_key", "Incorrect API key provided"))
    with pytest.raises(ModelError, match="rejected the API key"):
        make(api).reply(request())
    assert len(api.requests) == 6


def test_server_retry_verdict_wins(api: ChatCompletionsServer) -> None:
    api.push(chat_error(503, "server_error", headers={"x-should-retry": "false"}),
             chat_error(400, "invalid_request_error", headers={"x-should-retry": "true"}), chat_text("ok"))
    model = make(api)
    with pytest.raises(ModelError, match="503"):
        model.reply(request())
    assert model.reply(request()).text == "ok" and len(api.requests) == 3


def test_timeout_is_model_timeout_and_then_retried(api: ChatCompletionsServer) -> None:
    api.push(delayed(chat_text("too late"), 60.0))
    model = make(api, timeout_s=0.5, max_retries=0)
    with pytest.raises(ModelTimeout, match="within 0.5s"):
        model.reply(request())
    assert api.in_flight == 1 and model.usage_total == Usage()  # given up while the server still holds its answer
    api.push(delayed(chat_text("too late"), 3.0), chat_text("in time"))
    assert make(api, timeout_s=0.5, max_retries=1).reply(request()).text == "in time"


def test_unreachable_server_is_model_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = OpenAIChatModel(model_id=MODEL, base_url=f"http://127.0.0.1:{port}/v1", max_retries=1,
                            retry_base_delay_s=0.01, timeout_s=2.0)
    with pytest.raises(ModelError, match="cannot reach the OpenAI-compatible API at http://127.0.0.1") as info:
        model.reply(request())
    assert not isinstance(info.value, ModelTimeout)


def test_an_injected_async_client_serves_the_blocking_methods_and_the_async_view(api: ChatCompletionsServer) -> None:
    serves_both_ways(lambda: OpenAIChatModel(model_id=MODEL, client=openai.AsyncOpenAI(api_key=KEY, base_url=api.api_url),
                                             max_retries=0), api, chat_text)


def test_injected_client_retries_are_ours(api: ChatCompletionsServer) -> None:
    client = openai.OpenAI(api_key=KEY, base_url=api.api_url, max_retries=5)
    api.push(chat_error(503, "server_error"), chat_text("unused"))
    model = OpenAIChatModel(model_id=MODEL, client=client, max_retries=0, deadline_s=0)
    with pytest.raises(ModelError, match="503 server_error"):
        model.reply(request())
    assert len(api.requests) == 1  # the SDK's own retries are off
    assert model.reply(request()).text == "unused"


# ---- configuration -----------------------------------------------------------

@pytest.mark.parametrize("model_id", ["", "  ", " llama3", "gpt-4o-latest", "llama3:latest", None, 7])
def test_model_id_must_be_pinned(model_id: object) -> None:
    with pytest.raises(ConfigError):
        OpenAIChatModel(model_id=model_id, base_url="http://127.0.0.1:9/v1")  # type: ignore[arg-type]


@pytest.mark.parametrize("kw", [{"timeout_s": 0}, {"max_retries": -1}, {"max_tokens": True},
                                {"token_field": "max_output_tokens"}, {"client": object()}])
def test_options_are_validated(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        OpenAIChatModel(model_id=MODEL, base_url="http://127.0.0.1:9/v1", **kw)  # type: ignore[arg-type]


def test_settings_from_the_environment_and_model_args(api: ChatCompletionsServer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="SOUL_OPENAI_MODEL"):
        model_from_settings({"OPENAI_BASE_URL": api.api_url})
    with pytest.raises(ConfigError, match=r"does not take model_args \['temperature'\]"):
        model_from_settings({}, {"model": MODEL, "temperature": "0"})
    with pytest.raises(ConfigError, match="timeout_s must be a number"):
        model_from_settings({"SOUL_OPENAI_TIMEOUT_S": "soon"}, {"model": MODEL, "base_url": api.api_url})
    env = {"OPENAI_BASE_URL": api.api_url, "SOUL_OPENAI_MODEL": MODEL, "SOUL_OPENAI_MEMORY_MODEL": "mem-1",
           "SOUL_OPENAI_TIMEOUT_S": "7.5", "SOUL_OPENAI_MAX_RETRIES": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    m = make_model("openai")
    assert isinstance(m, OpenAIChatModel) and (m.model_id, m.memory_model_id, m.timeout_s, m.max_retries) == (
        MODEL, "mem-1", 7.5, 1)
    api.push(chat_text("via env"))
    assert m.reply(request()).text == "via env"
    assert api.requests[0].headers.get("authorization") == "Bearer no-key"  # a local server needs no key
    other = make_model("openai", args={"model": "other-2", "api_key": KEY})  # model_args win
    assert (other.model_id, other.memory_model_id) == ("other-2", "mem-1")
    api.push(chat_text("via args"))
    other.reply(request())
    assert api.requests[1].body["model"] == "other-2" and api.requests[1].headers["authorization"] == f"Bearer {KEY}"


# ---- the Anthropic adapter with an injected client (Bedrock, Vertex ...) ------------------------

class FakeBedrockClient:
    """What AnthropicModel uses of an SDK client (``messages.with_raw_response.create``), with its own (non-key)
    credentials as Bedrock's has."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers, self.calls = answers, []  # type: ignore[var-annotated]
        self.messages = SimpleNamespace(with_raw_response=SimpleNamespace(create=self._create))
        self.aws_region = "eu-west-1"
        self.options: list[dict[str, Any]] = []
        self.base_url = "https://bedrock-runtime.eu-west-1.amazonaws.com"

    def with_options(self, **kw: Any) -> FakeBedrockClient:
        self.options.append(kw)
        return self

    def _create(self, **kw: Any) -> Any:
        self.calls.append(kw)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return SimpleNamespace(http_response=SimpleNamespace(content=json.dumps(answer).encode()))


def _message(content: list[Any], stop: str = "end_turn") -> Any:
    return {"type": "message", "content": content, "stop_reason": stop,
            "usage": {"input_tokens": 11, "output_tokens": 4, "cache_read_input_tokens": 0,
                      "cache_creation_input_tokens": 0}}


def test_the_anthropic_adapter_takes_an_injected_client() -> None:
    import anthropic
    import httpx
    tool = {"type": "tool_use", "name": "record_memory",
            "input": {"persist": True, "categories": ["event"], "reason": "r", "facts": [],
                      "episode": "Ana deployed the blog.", "event": True, "entities": [], "task": None}}
    timeout = anthropic.APITimeoutError(request=httpx.Request("POST", "https://bedrock.example/model/invoke"))
    client = FakeBedrockClient([_message([{"type": "text", "text": "Hello from Bedrock."}]),
                                timeout, _message([tool], "tool_use")])
    model = AnthropicModel(model_id="anthropic.claude-test-v1:0", memory_model_id="anthropic.claude-mem-v1:0",
                           client=client, max_retries=1, retry_base_delay_s=0.0, timeout_s=9.0)
    assert client.options == [{"timeout": 9.0, "max_retries": 0}]  # no API key needed: the client has its own auth
    out = model.reply(request())
    assert out.text == "Hello from Bedrock." and out.usage == Usage(11, 4, 1)
    decision = model.decide(exchange())  # a timeout, then the answer: our retry loop around the client
    assert decision.persist and decision.extraction.episode == "Ana deployed the blog."
    first, second, third = client.calls
    assert first["model"] == "anthropic.claude-test-v1:0" and first["thinking"] == {"type": "disabled"}
    assert second == third and third["tool_choice"] == {"type": "tool", "name": "record_memory"}
    assert model.usage_by_model == {"anthropic.claude-test-v1:0": Usage(11, 4, 1),
                                    "anthropic.claude-mem-v1:0": Usage(11, 4, 1)}
    with pytest.raises(ConfigError, match="anthropic SDK client"):
        AnthropicModel(model_id="claude-x-1", client=object())
    with pytest.raises(ConfigError, match="openai SDK client"):
        OpenAIChatModel(model_id=MODEL, client=client)  # a client of the other SDK


def test_decide_asks_for_the_exchange_as_the_anthropic_adapter_does(api: ChatCompletionsServer) -> None:
    """The prompt and instructions are the same text for both adapters."""
    from soul_runtime.models.claude_tools import MEMORY_SYSTEM, exchange_prompt
    api.push(chat_tool("record_memory", {"persist": False, "categories": [], "reason": "no", "facts": [],
                                         "episode": "", "event": False, "entities": [], "task": None}))
    ex: Exchange = exchange()
    make(api).decide(ex)
    system, user = api.bodies()[0]["messages"]
    assert system["content"] == MEMORY_SYSTEM and user["content"] == exchange_prompt(ex)
