"""The remote-model path end to end: a soul on the real SDKs over HTTP against the local stand-ins, the same
request-sequence tests for both adapters (Claude through the Messages API, any OpenAI-compatible server through
chat completions).

One call before the reply returns and one after; a batched observe; an answer cut off; the cacheable prefix;
usage summed on the trace and per soul; a crash between the reply and the writes; an overloaded memory call.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from soul_apps.bench import chat_api
from soul_apps.bench.claude_path import keep_everything
from soul_apps.bench.messages_api import (
    MessagesApiServer,
    Scripted,
    ScriptedApiServer,
    delayed,
    error,
    message,
    text_message,
    tool_message,
)
from soul_runtime.config import SoulConfig, TurnConfig
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.base import LanguageModel
from soul_runtime.models.claude import AnthropicModel
from soul_runtime.models.openai_chat import OpenAIChatModel
from tests.fakes import HashEmbedder

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_780_000_000.0
REPLY, MEMORY = "claude-reply-test", "claude-memory-test"
Responder = Callable[[dict[str, Any]], Scripted]


@dataclass(frozen=True)
class Flavour:
    """One adapter and its stand-in: how to script answers and read the requests, in its own wire format."""

    name: str
    model_class: type[LanguageModel]
    overloaded: int  # the status an overloaded server answers with

    def server(self, responder: Responder | None = keep_everything, **kw: Any) -> ScriptedApiServer:
        if self.name == "anthropic":
            return MessagesApiServer(responder=responder, **kw)
        return chat_api.ChatCompletionsServer(responder=responder and chat_api.from_messages(responder), **kw)

    def url(self, api: ScriptedApiServer) -> str:
        return api.base_url if self.name == "anthropic" else api.base_url + "/v1"

    def text(self, text: str, inp: int = 10, out: int = 5) -> Scripted:
        if self.name == "anthropic":
            return text_message(text, input_tokens=inp, output_tokens=out)
        return chat_api.chat_text(text, prompt_tokens=inp, completion_tokens=out)

    def tool(self, name: str, data: Any, inp: int = 10, out: int = 5) -> Scripted:
        if self.name == "anthropic":
            return tool_message(name, data, input_tokens=inp, output_tokens=out)
        return chat_api.chat_tool(name, data, prompt_tokens=inp, completion_tokens=out)

    def cut_off(self, name: str) -> Scripted:
        """A tool answer cut off at the token limit."""
        if self.name == "anthropic":
            return Scripted(200, message([{"type": "tool_use", "id": "t", "name": name, "input": {}}],
                                         stop_reason="max_tokens", output_tokens=4096))
        return chat_api.chat_tool(name, None, raw='{"items": [{"message_id": "m0", "categ', finish_reason="length",
                                  completion_tokens=4096)

    def error(self, status: int, etype: str, headers: dict[str, str] | None = None) -> Scripted:
        if self.name == "anthropic":
            return error(status, etype, headers=headers)
        return chat_api.chat_error(status, etype, headers=headers)

    def empty(self, delay_s: float) -> Scripted:
        answer = Scripted(200, message([])) if self.name == "anthropic" else chat_api.chat_text("")
        return replace(answer, delay_s=delay_s)

    def kind(self, body: dict[str, Any]) -> str:
        if self.name == "anthropic":
            return (body.get("tool_choice") or {}).get("name", "reply")
        return ((body.get("tool_choice") or {}).get("function") or {}).get("name", "reply")

    def prompt(self, body: dict[str, Any]) -> str:
        """The user prompt of a memory call."""
        return str(body["messages"][-1]["content"])

    def system(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The system blocks (Anthropic) or the system message as one block (chat completions)."""
        if self.name == "anthropic":
            return list(body.get("system") or [])
        return [{"text": m["content"]} for m in body["messages"] if m["role"] == "system"]


FLAVOURS = [Flavour("anthropic", AnthropicModel, 529), Flavour("openai", OpenAIChatModel, 503)]


@pytest.fixture(params=FLAVOURS, ids=lambda f: f.name)
def flavour(request: pytest.FixtureRequest) -> Flavour:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def api(flavour: Flavour) -> Iterator[ScriptedApiServer]:
    with flavour.server(count_tokens=True) as server:
        yield server


def model(api: ScriptedApiServer, **kw: Any) -> LanguageModel:
    f = _flavour_of(api)
    opts: dict[str, Any] = {"model_id": REPLY, "memory_model_id": MEMORY, "api_key": "k", "base_url": f.url(api),
                            "max_retries": 1, "retry_base_delay_s": 0.01, "timeout_s": 10.0}
    opts.update(kw)
    return f.model_class(**opts)


def _flavour_of(api: ScriptedApiServer) -> Flavour:
    return FLAVOURS[0] if isinstance(api, MessagesApiServer) else FLAVOURS[1]


def soul(tmp: Path, m: LanguageModel, **turn: int) -> Soul:
    cfg = SoulConfig(turn=TurnConfig(**turn)) if turn else SoulConfig()
    return Soul("sol", tmp, memory=SoulMemory(tmp, embedder=HashEmbedder()), model=m, config=cfg)


def episodes(s: Soul) -> list[Any]:
    mem = s.memory
    assert isinstance(mem, SoulMemory)
    return mem.episodes()


def kinds(api: ScriptedApiServer) -> list[str]:
    return [_flavour_of(api).kind(b) for b in api.bodies()]


def test_reply_returns_after_one_call_and_the_memory_call_follows(tmp_path: Path, flavour: Flavour) -> None:
    memory_may_answer, memory_answered = threading.Event(), threading.Event()

    def held_memory(body: dict[str, Any]) -> Scripted:  # the memory call answers only once the test lets it
        answer = keep_everything(body)
        if body.get("tools"):
            memory_may_answer.wait(60)
            memory_answered.set()
        return answer

    with flavour.server(held_memory, count_tokens=True) as api:
        s = soul(tmp_path, model(api))
        r = s.turn("We moved the Tendril production database to Postgres 16 last night.", user="maya", at=T0,
                   wait_writes=False)
        assert r.reply == "Noted." and r.writes_pending and r.writes == ()
        assert not memory_answered.is_set() and s.busy  # back before the memory call could answer
        assert s.trace(r.turn_id).pending  # the provisional trace while the memory work runs
        memory_may_answer.set()
        s.wait_memory_work()
        assert kinds(api) == ["reply", "record_memory"]
        tr = s.trace(r.turn_id)
        assert not tr.pending and tr.persisted and tr.writes and tr.reply == r.reply
        assert tr.usage["reply"]["calls"] == 1 and tr.usage["memory"]["calls"] == 1 and tr.usage["calls"] == 2
        assert set(tr.usage["by_model"]) == {REPLY, MEMORY}
        assert api.bodies()[0]["model"] == REPLY and api.bodies()[1]["model"] == MEMORY

        # the default keeps today's contract: the writes are there when the call returns
        r2 = s.turn("Also, the staging database for Tendril is called Juniper now.", user="maya", at=T0 + 60)
        assert not r2.writes_pending and r2.writes and s.trace(r2.turn_id).writes == r2.writes
        assert kinds(api) == ["reply", "record_memory"] * 2
        # the next turn read the previous turns' writes: both episodes are recalled
        r3 = s.turn("What do we know about Tendril's databases?", user="maya", at=T0 + 120, wait_writes=False)
        assert {it.sources[0] for it in r3.recalled if it.sources} >= {"sol/1/user", "sol/2/user"}
        s.close()  # waits for the memory work of turn 3
        assert kinds(api) == ["reply", "record_memory"] * 3
        assert soul(tmp_path, model(api)).trace(r3.turn_id).writes  # committed before close returned
    with flavour.server() as api2:
        short = soul(tmp_path / "short", model(api2))
        r4 = short.turn("ok!", user="maya", at=T0)  # the length filter runs first: no memory call
        assert kinds(api2) == ["reply"] and "shorter than" in short.trace(r4.turn_id).persist_reason


def test_observe_judges_a_window_in_one_call_with_provenance_per_message(tmp_path: Path,
                                                                          api: ScriptedApiServer) -> None:
    msgs = [{"speaker": "Caroline" if i % 2 else "Melanie", "id": f"D1:{i}",
             "text": "Yes!" if i == 3 else f"Message {i}: I went hiking near lake {i} with my sister last weekend."}
            for i in range(1, 26)]
    s = soul(tmp_path, model(api), observe_window=10)
    r = s.observe(msgs, at=T0, session="s1")
    assert kinds(api) == ["record_memories"] * 3  # 25 messages in windows of 10: three calls, not 25 (or 50)
    prompt = _flavour_of(api).prompt(api.bodies()[0])
    assert "[D1:1] (" in prompt and "Caroline: Message 1" in prompt and "[D1:10]" in prompt and "[D1:11]" not in prompt
    assert "[D1:10]" in _flavour_of(api).prompt(api.bodies()[1])  # the previous window is context
    tr = s.trace(r.turn_id)
    assert "D1:3: shorter than" in tr.persist_reason  # "Yes!" is context only
    assert sorted(e.sources for e in episodes(s)) == sorted((f"D1:{i}",) for i in range(1, 26) if i != 3)
    assert tr.usage["memory"]["calls"] == 3 and tr.usage["reply"]["calls"] == 0


def test_a_cut_off_window_answer_is_retried_as_two_halves(tmp_path: Path, api: ScriptedApiServer,
                                                          flavour: Flavour) -> None:
    api.push(flavour.cut_off("record_memories"))
    msgs = [{"speaker": "Ana", "id": f"m{i}", "text": f"Ana adopted cat number {i} from the shelter today."}
            for i in range(6)]
    r = soul(tmp_path, model(api)).observe(msgs, at=T0, session="s")
    assert kinds(api) == ["record_memories"] * 3 and len(episodes(soul(tmp_path, model(api)))) == 6 and r.writes
    assert [len(flavour.prompt(b).split("<messages>")[1].strip().splitlines()) - 1
            for b in api.bodies()] == [6, 3, 3]


def test_cache_control_marks_the_static_prefix_and_usage_reports_cached_tokens(tmp_path: Path) -> None:
    with MessagesApiServer(responder=keep_everything, count_tokens=True, cache_min_tokens=200) as api:
        s = soul(tmp_path, model(api, cache_min=200))
        for i in range(3):
            s.turn(f"Decision {i}: we chose Postgres {14 + i} for the Orca analytics service.", user="maya",
                   at=T0 + 60 * i)
        mem = [b for b in api.bodies() if b.get("tools")]
        assert len(mem) == 3
        for b in mem:
            (block,) = b["system"]
            assert block["cache_control"] == {"type": "ephemeral"} and "record_memory" in block["text"]
            assert b["system"][0]["text"] == mem[0]["system"][0]["text"] and b["tools"] == mem[0]["tools"]
        traces = s.traces(3)
        assert traces[0].usage["cache_write_tokens"] > 0 and traces[0].usage["cache_read_tokens"] == 0
        assert all(t.usage["cache_read_tokens"] > 0 and t.usage["memory"]["cache_read_tokens"] > 0 for t in traces[1:])
        reply = [b for b in api.bodies() if not b.get("tools")]
        assert all("cache_control" not in blk for b in reply for blk in b["system"])  # the short persona: no mark
    with MessagesApiServer(responder=keep_everything) as api:  # a model whose minimum the prefix misses
        soul(tmp_path / "b", model(api, cache_min=100_000)).turn("We chose Redis for the session cache.", at=T0)
        assert all("cache_control" not in blk for b in api.bodies() for blk in b.get("system", []))


def test_the_chat_prefix_is_static_and_cached_tokens_are_reported(tmp_path: Path) -> None:
    """Chat completions: no marks; the memory calls' system message and tool never change, so the server's
    automatic prefix cache serves them from the second call on."""
    f = FLAVOURS[1]
    with f.server(count_tokens=True, cache_min_tokens=200) as api:
        s = soul(tmp_path, model(api))
        for i in range(3):
            s.turn(f"Decision {i}: we chose Postgres {14 + i} for the Orca analytics service.", user="maya",
                   at=T0 + 60 * i)
        mem = [b for b in api.bodies() if b.get("tools")]
        assert len(mem) == 3 and all(b["messages"][0] == mem[0]["messages"][0] and b["tools"] == mem[0]["tools"]
                                     for b in mem)
        assert "record_memory" in mem[0]["messages"][0]["content"]
        traces = s.traces(3)
        assert traces[0].usage["cache_read_tokens"] == 0 and traces[0].usage["cache_write_tokens"] == 0
        assert all(t.usage["memory"]["cache_read_tokens"] > 0 for t in traces[1:])
        assert all(t.usage["reply"]["cache_read_tokens"] == 0 for t in traces)  # the short persona: below the minimum


def test_usage_is_summed_per_turn_per_soul_and_per_model(tmp_path: Path, flavour: Flavour) -> None:
    with flavour.server(None) as api:
        api.push(flavour.text("Sure.", 100, 5),
                 flavour.tool("record_memory", {"persist": True, "categories": ["fact"], "reason": "a fact",
                                                "facts": [], "episode": "Maya set the budget to 4k.", "event": True,
                                                "entities": [], "task": None}, 700, 50),
                 flavour.text("Ok.", 120, 3),
                 flavour.tool("record_memory", {"persist": False, "categories": [], "reason": "chat", "facts": [],
                                                "episode": "", "event": False, "entities": [], "task": None},
                              650, 20))
        s = soul(tmp_path, model(api))
        a = s.turn("The monthly budget for the Orca cluster is 4k dollars.", user="maya", at=T0)
        b = s.turn("Thanks a lot for that, really helpful.", user="maya", at=T0 + 60)
        ta, tb = s.trace(a.turn_id), s.trace(b.turn_id)
        assert {k: ta.usage[k] for k in ("calls", "input_tokens", "output_tokens")} == {
            "calls": 2, "input_tokens": 800, "output_tokens": 55}
        assert ta.usage["by_model"] == {REPLY: {"calls": 1, "input_tokens": 100, "output_tokens": 5,
                                                "cache_read_tokens": 0, "cache_write_tokens": 0},
                                        MEMORY: {"calls": 1, "input_tokens": 700, "output_tokens": 50,
                                                 "cache_read_tokens": 0, "cache_write_tokens": 0}}
        assert tb.usage["calls"] == 2 and tb.persist_reason == "chat"
        total = s.state.usage
        assert total["calls"] == 4 and total["input_tokens"] == 100 + 700 + 120 + 650
        assert total["by_model"][MEMORY]["output_tokens"] == 70 and total["reply"]["calls"] == 2
        s.close()
        again = soul(tmp_path, model(api))  # the running total is durable
        assert again.state.usage == total


def test_the_asynchronous_view_sends_the_same_requests_with_the_sdks_async_client(tmp_path: Path, flavour: Flavour,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A host's view of the adapter: the SDK's async clients (made for the loop that calls it, at most
    max_concurrency requests out, a new client only when every client's pool is busy), the same request and
    answer, the usage summed on the model itself."""
    import asyncio

    from soul_runtime.models import remote
    from soul_runtime.models.base import ReplyRequest
    monkeypatch.setattr(remote, "POOL_CONNECTIONS", 2)
    with flavour.server(None) as api:
        api.push(*[delayed(flavour.text(f"Hi {i}."), 0.3) for i in range(6)])
        m = model(api, max_concurrency=4)
        view = m.asynchronous()
        assert view is m.asynchronous() and view.model_id == m.model_id and view.label == m.label
        most = 0

        async def main() -> list[str]:
            nonlocal most
            req = ReplyRequest(system="You are Ana's assistant.", memory_lines=(), history=(), user_text="hello",
                               user="ana", max_tokens=32)
            calls = [asyncio.ensure_future(view.reply(req)) for _ in range(6)]
            while not all(c.done() for c in calls):
                most = max(most, view.in_flight)
                await asyncio.sleep(0.01)
            pools = view._pools()
            assert pools.gate._value == 4 and len(pools.clients) == 2  # type: ignore[attr-defined]
            assert all(type(c).__name__ == m.async_client_class for c in pools.clients) and pools.busy == [0, 0]
            # Claude's requests go over the SDK's aiohttp transport (its aiohttp extra is a dependency)
            http = m.sdk.DefaultAioHttpClient if flavour.name == "anthropic" else m.sdk.DefaultAsyncHttpxClient
            assert all(isinstance(c._client, http) for c in pools.clients)
            await view.aclose()
            return sorted(c.result().text for c in calls)
        assert asyncio.run(main()) == [f"Hi {i}." for i in range(6)]
        assert most == 4  # the cap, reached
        assert len(api.bodies()) == 6 and m.usage_total.calls == 6


def test_the_asynchronous_view_retries_times_out_and_fails_as_the_blocking_one(tmp_path: Path,
                                                                               flavour: Flavour) -> None:
    """Over the async transport: a busy answer's retry-after is waited for, a slow answer is a ModelTimeout
    (retried once first), a server that is gone is a one-line ModelError."""
    import asyncio

    from soul_runtime.errors import ModelError, ModelTimeout
    from soul_runtime.models.base import ReplyRequest
    req = ReplyRequest(system="s", memory_lines=(), history=(), user_text="hello", user="ana", max_tokens=32)
    with flavour.server(None) as api:
        busy = flavour.error(429, "rate_limit_error", headers={"retry-after-ms": "150"})
        api.push(busy, flavour.text("Got it."), delayed(flavour.text("late"), 1.5), delayed(flavour.text("late"), 1.5))
        view = model(api, timeout_s=0.5, deadline_s=30).asynchronous()

        async def main() -> None:
            t0 = time.monotonic()
            assert (await view.reply(req)).text == "Got it." and time.monotonic() - t0 >= 0.15
            with pytest.raises(ModelTimeout):
                await view.reply(req)
            await view.aclose()
        asyncio.run(main())
        assert len(api.bodies()) == 4  # the busy answer, the reply, the slow one tried twice
        url = flavour.url(api)
    gone = model(api, base_url=url, timeout_s=2.0, max_retries=0).asynchronous()

    async def refused() -> None:
        try:
            await gone.reply(req)
        finally:
            await gone.aclose()
    with pytest.raises(ModelError) as info:
        asyncio.run(refused())
    assert not isinstance(info.value, ModelTimeout) and "\n" not in str(info.value)


@pytest.mark.parametrize("overloaded", [True, False], ids=["overloaded", "rate-limited"])
def test_a_busy_api_slows_a_turn_until_its_deadline(tmp_path: Path, flavour: Flavour, overloaded: bool) -> None:
    """429/529 with retry-after are waited for beyond max_retries while the call's deadline allows: the turn
    is late, not failed; the waits are the server's."""
    status = flavour.overloaded if overloaded else 429
    with flavour.server(None) as api:
        busy = flavour.error(status, "overloaded_error" if overloaded else "rate_limit_error",
                             headers={"retry-after-ms": "150"})
        api.push(*[busy] * 3, flavour.text("Got it."))
        s = soul(tmp_path, model(api, max_retries=1, deadline_s=30))
        t0 = time.monotonic()
        r = s.turn("ok", user="maya", at=T0)
        assert r.reply == "Got it." and time.monotonic() - t0 >= 0.45  # three waits of 150 ms
        assert len(api.bodies()) == 4


@pytest.mark.parametrize("overloaded", [True, False], ids=["overloaded", "rate-limited"])
def test_an_overloaded_memory_call_does_not_fail_the_reply(tmp_path: Path, flavour: Flavour, overloaded: bool) -> None:
    status = flavour.overloaded if overloaded else 429
    with flavour.server(None) as api:
        api.push(flavour.text("Got it."), *[flavour.error(status, "overloaded_error" if overloaded else "rate_limit_error",
                                                          headers={"retry-after-ms": "10"})] * 2,
                 flavour.text("Next."))
        s = soul(tmp_path, model(api, max_retries=1, deadline_s=0))  # past its deadline: busy is a failure
        r = s.turn("Our on-call rotation for Orca changes every Monday morning.", user="maya", at=T0)
        assert r.reply == "Got it." and r.writes == ()
        tr = s.trace(r.turn_id)
        assert not tr.persisted and "memory decision failed" in tr.persist_reason and str(status) in tr.persist_reason
        assert tr.usage["reply"]["calls"] == 1 and tr.usage["memory"]["calls"] == 0
        assert s.turn("ok", user="maya", at=T0 + 60).reply == "Next."  # the soul goes on
        assert s.last_seq == 2 and [t.role for t in s.state.buffer.turns] == ["user", "assistant"] * 2


CRASHER = textwrap.dedent("""
    import sys
    from soul_runtime.loop.soul import Soul
    from soul_runtime.memory.soul_memory import SoulMemory
    from soul_runtime.models.claude import AnthropicModel
    from soul_runtime.models.openai_chat import OpenAIChatModel
    from tests.fakes import HashEmbedder
    path, url, flavour = sys.argv[1], sys.argv[2], sys.argv[3]
    cls = AnthropicModel if flavour == "anthropic" else OpenAIChatModel
    m = cls(model_id="claude-reply-test", memory_model_id="claude-memory-test", api_key="k", base_url=url)
    s = Soul("sol", path, memory=SoulMemory(path, embedder=HashEmbedder()), model=m)
    r = s.turn("The Orca cluster moved to the eu-west-2 region yesterday.", user="maya", at=1780000000.0,
               wait_writes=False)
    print("REPLY", r.turn_id, r.reply, flush=True)
    s.wait_memory_work()
""")


def test_a_crash_between_the_reply_and_the_writes_is_completed_by_the_intent(tmp_path: Path,
                                                                             flavour: Flavour) -> None:
    with flavour.server(None) as api:
        # the reply at once; the memory call hangs until the process is killed
        api.push(flavour.text("Noted, eu-west-2."), flavour.empty(delay_s=30))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-c", CRASHER, str(tmp_path), flavour.url(api), flavour.name],
                                stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("REPLY sol/1 Noted, eu-west-2."), line
            deadline = time.monotonic() + 20
            while len(api.requests) < 2 and time.monotonic() < deadline:  # the memory call is in flight
                time.sleep(0.02)
            assert len(api.requests) == 2
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        api.push(flavour.tool("record_memory", {"persist": True, "categories": ["event"], "reason": "a move",
                                                "facts": [], "episode": "The Orca cluster moved to eu-west-2.",
                                                "event": True, "entities": ["Orca"], "task": None}))
        s = soul(tmp_path, model(api))  # the next activation completes the turn from its intent
        assert s.last_seq == 1 and len(api.requests) == 3
        tr = s.trace("sol/1")
        assert tr.reply == "Noted, eu-west-2." and tr.persisted and tr.writes and not tr.pending
        assert [t.text for t in s.state.buffer.turns] == [
            "The Orca cluster moved to the eu-west-2 region yesterday.", "Noted, eu-west-2."]
        assert [e.sources for e in episodes(s)] == [("sol/1/user",)]
        s.close()
        s = soul(tmp_path, model(api))  # and never twice
        assert len(api.requests) == 3 and len(episodes(s)) == 1
