"""The HTTP client's retries and error mapping on answers scripted per request (httpx's MockTransport): what is
sent again, after how long, with which key, and what is raised when it gives up. (The client against a real
``soul serve``: tests/test_http_client.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from soul_runtime import errors
from soul_runtime.http_client import HttpRuntime
from soul_runtime.http_client import transport as tp

TURN = {"reply": "ok", "turn_id": "s/1", "seq": 1, "recalled": [], "writes": [], "writes_pending": False,
        "model": "offline", "offline": True}


class Script:
    """Answers requests in order with the given responses (or raises the given transport errors)."""

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


def _rt(script: Script, monkeypatch: pytest.MonkeyPatch, waits: list[float], **kw: Any) -> HttpRuntime:
    monkeypatch.setattr(tp.time, "sleep", waits.append)
    return HttpRuntime("http://service.test", "k", transport=httpx.MockTransport(script), **kw)


def busy(retry_after: str | None = "2") -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return httpx.Response(429, json={"error": {"type": "RuntimeBusy", "message": "busy"}}, headers=headers)


def test_a_busy_answer_is_waited_out_as_retry_after_says_and_the_same_key_sent(monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    script, waits = Script(busy("2"), busy(None), httpx.Response(200, json=TURN)), []
    got = _rt(script, monkeypatch, waits).soul("s").turn("hello", request_id="r-1")
    assert got.reply == "ok" and got.offline
    assert waits == [2.0, 0.5]  # Retry-After, then the backoff's second step (0.25 s doubled)
    assert [r.headers["Idempotency-Key"] for r in script.seen] == ["r-1"] * 3
    assert len({r.content for r in script.seen}) == 1
    assert script.seen[0].headers["Authorization"] == "Bearer k"


def test_busy_past_the_retries_is_runtime_busy_with_its_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    script, waits = Script(busy("3"), busy("3"), busy("7")), []
    with pytest.raises(errors.RuntimeBusy) as e:
        _rt(script, monkeypatch, waits, retries=2).soul("s").turn("hello")
    assert waits == [3.0, 3.0] and e.value.retry_after == 7.0  # type: ignore[attr-defined]
    assert isinstance(e.value, errors.RuntimeUnavailable)


def test_a_lost_answer_is_sent_again_only_with_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    lost = httpx.ReadError("connection reset")
    script, waits = Script(lost, httpx.Response(200, json=TURN)), []
    rt = _rt(script, monkeypatch, waits)
    assert rt.soul("s").turn("hello").seq == 1
    keys = [r.headers["Idempotency-Key"] for r in script.seen]
    assert len(keys) == 2 and keys[0] == keys[1]  # a generated key, the same both times
    script.steps = [httpx.ReadError("connection reset"), httpx.Response(201, json={})]
    script.seen.clear()
    with pytest.raises(errors.RuntimeUnavailable):
        rt.soul("s").import_(b"\x80")  # an import has no key: it may have been applied, so it is not resent
    assert len(script.seen) == 1
    script.steps = [httpx.ConnectError("refused"), httpx.Response(201, json={})]
    rt.soul("s").import_(b"\x80")  # ... unless it never left
    assert "Idempotency-Key" not in script.seen[-1].headers


def test_no_answer_in_time_is_turn_failed_and_not_resent(monkeypatch: pytest.MonkeyPatch) -> None:
    script, waits = Script(httpx.ReadTimeout("slow")), []
    with pytest.raises(errors.TurnFailed):
        _rt(script, monkeypatch, waits).soul("s").turn("hello")
    assert len(script.seen) == 1 and waits == []


@pytest.mark.parametrize("status,kind,raised", [
    (400, "InvalidInput", errors.InvalidInput), (422, "IdempotencyConflict", errors.IdempotencyConflict),
    (401, "Unauthorized", errors.Unauthorized), (401, "", errors.Unauthorized), (404, "NotFound", errors.NotFound),
    (502, "ModelTimeout", errors.ModelTimeout), (500, "InternalError", errors.TurnFailed),
    (503, "StaleOwner", errors.StaleOwner), (418, "", errors.SoulError)])
def test_error_answers_are_the_project_s_exceptions(monkeypatch: pytest.MonkeyPatch, status: int, kind: str,
                                                     raised: type[Exception]) -> None:
    body = {"error": {"type": kind, "message": "why"}} if kind else None
    steps = [httpx.Response(status, json=body)] * 4
    with pytest.raises(raised) as e:  # a 503 is sent again for 1 s of waits: 0.25 + 0.5, then given up
        _rt(Script(*steps), monkeypatch, [], retry_for_s=1).soul("s").facts()
    assert type(e.value) is raised


def test_the_async_handle_retries_alike() -> None:
    script = Script(busy("0"), httpx.Response(200, json={"facts": []}))

    async def run() -> list[Any]:
        async with HttpRuntime("http://service.test", "k", async_transport=httpx.MockTransport(script)) as rt:
            return await rt.async_soul("s").facts("maya")
    assert asyncio.run(run()) == []
    assert [str(r.url) for r in script.seen] == ["http://service.test/v1/souls/s/facts?entity=maya"] * 2


@pytest.mark.parametrize("make", [lambda: HttpRuntime("ftp://x", "k"), lambda: HttpRuntime("http://x", ""),
                                  lambda: HttpRuntime("http://x", "k", retries=-1),
                                  lambda: HttpRuntime("http://x", "k", retry_for_s=-1)])
def test_bad_settings_are_config_errors(make: Callable[[], Any]) -> None:
    with pytest.raises(errors.ConfigError):
        make()


def test_the_client_reads_replies_without_the_turn_loop() -> None:
    """The HTTP client's records come from records.py: importing it and reading a turn's answer loads neither the
    turn loop, the models, the memory engine nor Ray."""
    import subprocess
    import sys
    code = ("import sys\nfrom soul_runtime.http_client import wire\n"
            "r = wire.turn_result({'reply': 'hi', 'recalled': [], 'writes': [], 'turn_id': 's/1', 'seq': 1,"
            " 'model': 'm', 'offline': True, 'writes_pending': False})\n"
            "assert r.reply == 'hi' and type(r).__module__ == 'soul_runtime.records', r\n"
            "print(sorted(m for m in sys.modules if m.startswith(('soul_runtime.loop', 'soul_runtime.models',"
            " 'soul_runtime.memory', 'actors', 'ray'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


PROXY_404 = httpx.Response(404, text="Path '/v1/souls/s/turns' not found. Ping http://x/-/routes for available routes.",
                           headers={"content-type": "text/plain; charset=utf-8"})


def unavailable() -> httpx.Response:
    return httpx.Response(503, json={"error": {"type": "RuntimeUnavailable", "message": "not ready"}},
                          headers={"Retry-After": "1"})


def test_a_restart_is_waited_out_with_the_same_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A service restarting: the connection refused, the ingress's plain 404 while no app is deployed, the
    service's 503 while it starts, a connection lost mid-request: the call is sent again (more than ``retries``
    times) with one Idempotency-Key until it is answered."""
    script = Script(httpx.ConnectError("refused"), PROXY_404, unavailable(), httpx.RemoteProtocolError("closed"),
                    PROXY_404, httpx.ConnectError("refused"), unavailable(), httpx.Response(200, json=TURN))
    waits: list[float] = []
    got = _rt(script, monkeypatch, waits, retries=1).soul("s").turn("hello", request_id="r-9")
    assert got.seq == 1 and len(script.seen) == 8
    assert [r.headers["Idempotency-Key"] for r in script.seen] == ["r-9"] * 8
    assert waits == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 1.0]  # backoff (at most 2 s) or the 503's Retry-After


def test_a_service_that_stays_away_is_runtime_unavailable_after_retry_for_s(monkeypatch: pytest.MonkeyPatch) -> None:
    script, waits = Script(*[PROXY_404] * 20), []
    with pytest.raises(errors.RuntimeUnavailable):
        _rt(script, monkeypatch, waits, retry_for_s=5).soul("s").turn("hello")
    assert sum(waits) <= 5 and waits == [0.25, 0.5, 1.0, 2.0]
    script, waits = Script(unavailable(), unavailable()), []
    with pytest.raises(errors.RuntimeUnavailable):  # 0: never sent again
        _rt(script, monkeypatch, waits, retry_for_s=0).soul("s").facts()
    assert len(script.seen) == 1


def test_the_service_s_own_not_found_is_not_retried_and_reads_are_resent(monkeypatch: pytest.MonkeyPatch) -> None:
    own = httpx.Response(404, json={"error": {"type": "NotFound", "message": "no soul 's'"}})
    script, waits = Script(own), []
    with pytest.raises(errors.NotFound):
        _rt(script, monkeypatch, waits).soul("s").traces()
    assert len(script.seen) == 1 and waits == []
    script = Script(httpx.ReadError("reset"), httpx.Response(502, text="<html>bad gateway</html>"),
                    httpx.Response(200, json={"facts": []}))
    assert _rt(script, monkeypatch, waits).soul("s").facts() == []  # a read is safe to send again
    script = Script(httpx.Response(502, text="<html>bad gateway</html>"), httpx.Response(201, json={}))
    with pytest.raises(errors.SoulError):  # an import (no key) past the ingress may have been applied: not resent
        _rt(script, monkeypatch, []).soul("s").import_(b"\x80")
    assert len(script.seen) == 1


def test_the_retries_are_steps_that_the_one_pair_of_drivers_runs() -> None:
    """``send_steps`` yields what it waits for: a send, the close of an answer it does not take, the pause the
    answer's Retry-After names, then the same call (its key with it); the blocking and the async sender only
    perform those steps (:func:`soul_runtime.steps.run_steps` / ``run_steps_async``)."""
    from soul_runtime import steps
    call = tp.Call("POST", "/v1/souls/s/turns", json={"text": "hi"}, key="r-1")
    gen = tp.send_steps(call, tp.Retries())
    first = next(gen)
    assert first == steps.Call("http", "send", (call,))
    refused = busy("2")
    assert gen.send(refused) == steps.Call("http", "close", (refused,))
    assert gen.send(None) == steps.Pause(2.0)
    assert gen.send(None) == first
    done = steps.resume(gen, httpx.Response(200, json=TURN), None)
    assert isinstance(done, steps.Done) and done.value == TURN
