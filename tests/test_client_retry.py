"""Which Ray Client failures ``raycalls.start`` (the connect path) tries again, and which it raises at once.

No Ray here: the session (``_ray_init``) and the token probe are replaced, so each case is exact. The real
thing - a session server killed on a real head - is in tests/test_local_cluster.py.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest

from actors import raycalls
from soul_runtime.errors import AuthError, RuntimeUnavailable, TurnFailed

ADDR = "ray://127.0.0.1:1"
DIED = ("the Ray Client server at ray://127.0.0.1:1 could not open a session for this client: "
        "RuntimeError: Starting Ray client server failed. See ray_client_server_23001.err for detailed logs.")
SLOW = ("the Ray Client server at ray://127.0.0.1:1 could not open a session for this client: "
        "RuntimeError: Proxy failed to Connect to backend! Check `ray_client_server.err`")


class _Rpc(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Sessions open (or fail, per the ``opens`` script); every session opened and dropped is counted."""
    state: dict[str, Any] = {"opens": [], "opened": 0, "dropped": 0, "probed": 0}

    def ray_init(address: str, kwargs: dict[str, Any]) -> None:
        outcome = state["opens"].pop(0) if state["opens"] else None
        if outcome is not None:
            raise raycalls._SessionStartFailed(outcome)
        state["opened"] += 1

    def probe(address: str, timeout: float = 5.0) -> None:
        state["probed"] += 1

    def drop() -> None:
        state["dropped"] += 1
    monkeypatch.setattr(raycalls, "_ray_init", ray_init)
    monkeypatch.setattr(raycalls, "check_client_access", probe)
    monkeypatch.setattr(raycalls, "_drop_session", drop)
    monkeypatch.setattr(raycalls.time, "sleep", lambda s: None)
    monkeypatch.setattr(raycalls.ray, "is_initialized", lambda: False)
    return state


def _attach(failures: list[BaseException]) -> tuple[Any, list[bool]]:
    calls: list[bool] = []

    def attach(started: bool) -> str:
        calls.append(started)
        if failures:
            raise failures.pop(0)
        return "runtime"
    return attach, calls


def test_a_session_lost_while_attaching_is_retried_with_a_warning(fake: dict[str, Any],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    attach, calls = _attach([ConnectionError("Request can't be sent because the Ray client has already been "
                                             "disconnected due to an error. Last exception: <_MultiThreaded"
                                             "Rendezvous of RPC that terminated with:\n\tstatus = StatusCode.NOT_FOUND"
                                             "\n\tdetails = \"Attempted to reconnect a session that has already been"
                                             " cleaned up\"\n>")])
    with caplog.at_level(logging.WARNING, logger="soul_runtime.connect"):
        assert raycalls.start(ADDR, attach, namespace="ns") == "runtime"
    assert calls == [False, False] and fake["opened"] == 2 and fake["dropped"] == 1
    [warned] = [r.getMessage() for r in caplog.records]
    assert "attempt 1 of 3" in warned and "lost while connecting" not in warned  # the cause, not the preamble
    assert "gRPC NOT_FOUND: Attempted to reconnect a session that has already been cleaned up" in warned


def test_a_grpc_error_while_attaching_is_a_lost_session(fake: dict[str, Any]) -> None:
    attach, calls = _attach([_Rpc(grpc.StatusCode.UNAVAILABLE, "Socket closed")])
    assert raycalls.start(ADDR, attach, namespace="ns") == "runtime"
    assert len(calls) == 2 and fake["dropped"] == 1


def test_a_lost_session_every_time_fails_with_its_cause_after_the_attempts(fake: dict[str, Any]) -> None:
    attach, calls = _attach([ConnectionError("data channel gone") for _ in range(5)])
    with pytest.raises(RuntimeUnavailable) as e:
        raycalls.start(ADDR, attach, namespace="ns", client_attempts=3)
    assert not isinstance(e.value, AuthError)
    assert len(calls) == 3 and fake["dropped"] == 3
    assert "was lost while connecting: data channel gone" in str(e.value) and "3 attempts" in str(e.value)
    assert "ray_client_server.err" in str(e.value)


@pytest.mark.parametrize("error", [AuthError("refused"), TurnFailed("no answer in time"), ValueError("bad"),
                                   RuntimeUnavailable("actor died: x")])
def test_errors_of_the_attach_itself_are_not_retried(fake: dict[str, Any], error: BaseException) -> None:
    attach, calls = _attach([error])
    with pytest.raises(type(error)):
        raycalls.start(ADDR, attach, namespace="ns")
    assert len(calls) == 1 and fake["dropped"] == 0 and fake["opened"] == 1


def test_a_dead_session_server_is_retried_a_slow_one_is_not(fake: dict[str, Any]) -> None:
    fake["opens"] = [DIED]
    attach, calls = _attach([])
    assert raycalls.start(ADDR, attach, namespace="ns") == "runtime"
    assert fake["opened"] == 1 and len(calls) == 1

    fake["opens"] = [SLOW]
    with pytest.raises(RuntimeUnavailable, match="too busy to start a session server"):
        raycalls.start(ADDR, attach, namespace="ns")
    assert fake["opened"] == 1  # no second session asked of a busy head


def test_one_attempt_means_no_retry(fake: dict[str, Any]) -> None:
    attach, calls = _attach([ConnectionError("data channel gone")])
    with pytest.raises(RuntimeUnavailable, match="lost while connecting"):
        raycalls.start(ADDR, attach, namespace="ns", client_attempts=1)
    assert len(calls) == 1


def test_an_auth_failure_at_the_probe_opens_no_session(fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(address: str, timeout: float = 5.0) -> None:
        raise AuthError("no token")
    monkeypatch.setattr(raycalls, "check_client_access", refuse)
    attach, calls = _attach([])
    with pytest.raises(AuthError):
        raycalls.start(ADDR, attach, namespace="ns")
    assert fake["opened"] == 0 and calls == []


@pytest.mark.parametrize("message,lost", [
    ("Request can't be sent because the Ray client has already been disconnected due to an error. Last exception: "
     "<_MultiThreadedRendezvous of RPC that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n\tdetails = "
     "\"Socket closed\"\n>", True),
    ("Sending request failed because the data channel is no longer running.", True),
    ("ray client connection timeout", False),
])
def test_what_a_session_open_that_breaks_is_called(monkeypatch: pytest.MonkeyPatch, message: str, lost: bool) -> None:
    def init(*a: object, **k: object) -> None:
        raise ConnectionError(message)
    monkeypatch.setattr(raycalls.ray, "init", init)
    with pytest.raises(RuntimeUnavailable) as e:
        raycalls._ray_init(ADDR, {})
    assert isinstance(e.value, raycalls._SessionLost) is lost
    if lost:
        assert "lost while connecting" in str(e.value)
    else:
        assert str(e.value) == f"cannot reach Ray at {ADDR}: ray client connection timeout"


def test_a_head_that_did_not_start_names_the_raylets_reason(tmp_path: Any) -> None:
    from actors.local_cluster import _raylet_cause
    err = tmp_path / "raylet.err"
    assert _raylet_cause(str(err)) == ""  # no log at all
    err.write_text("[2026-11-30 21:41:26,385 C 16400 16400] (raylet) node_manager.cc:3576:  An unexpected system "
                   "state has occurred. ... Check failed: statussetor3576.has_value() Timed out waiting for file "
                   "/tmp/rtx/session_x/metrics_agent_port_ed15\n*** StackTrace Information ***\n")
    assert _raylet_cause(str(err)) == (": the raylet died: Check failed: statussetor3576.has_value() Timed out "
                                       "waiting for file /tmp/rtx/session_x/metrics_agent_port_ed15")
    err.write_text("I1130 nothing wrong here\n")
    assert _raylet_cause(str(err)) == ""


def test_the_bench_counts_heads_not_started_and_failures_after_connect_apart() -> None:
    from soul_runtime.bench.client import summarize
    ok = {"stage": "done", "connect_s": 10.0, "turn_s": 1.0, "session_s": 4.0, "retries": 0, "load1": 50.0}
    rows = [{"scenario": "head-failed", "variant": "fixed", "i": 0, "head_error": "raylet died"},
            {"scenario": "fresh", "variant": "fixed", "i": 0, **ok},
            {"scenario": "fresh", "variant": "fixed", "i": 1, **ok, "connect_s": 30.0, "retries": 1},
            {"scenario": "fresh", "variant": "fixed", "i": 2, "stage": "connect", "error": "RuntimeUnavailable: x",
             "fail_s": 3.2, "load1": 60.0},
            {"scenario": "busy", "variant": "fixed", "i": 0, **ok, "stage": "turn", "error": "TurnFailed: y"},
            {"scenario": "head-failed", "variant": "fixed", "i": -1, "head_error": "raylet died"},
            {"scenario": "busy-load", "variant": "fixed", "busy_turns": 10}]
    s = summarize(rows)
    fresh, busy = s["fresh/fixed"], s["busy/fixed"]
    assert (fresh["heads_not_started"], fresh["connects"], fresh["failed"], fresh["failed_after_connect"]) == (1, 3, 1, 0)
    assert fresh["retried"] == 1 and fresh["fail_s"] == [3.2] and fresh["connect_p50_s"] == 10.0
    assert fresh["connect_max_s"] == 30.0 and fresh["head_errors"] == ["raylet died"]
    assert (busy["heads_not_started"], busy["connects"], busy["failed"], busy["failed_after_connect"]) == (1, 1, 0, 1)
