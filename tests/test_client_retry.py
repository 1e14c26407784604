"""Which Ray Client failures ``raycalls.start`` (the connect path) tries again, and which it raises at once (actors.client_session).

No Ray here: the session (``_ray_init``) and the token probe are replaced, so each case is exact. The real
thing - a session server killed on a real head - is in tests/test_local_cluster.py.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest

from actors import client_session, raycalls
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
            raise client_session._SessionStartFailed(outcome)
        state["opened"] += 1

    def probe(address: str, timeout: float = 5.0) -> None:
        state["probed"] += 1

    def drop() -> None:
        state["dropped"] += 1
    monkeypatch.setattr(client_session, "ray_init", ray_init)
    monkeypatch.setattr(client_session, "check_client_access", probe)
    monkeypatch.setattr(client_session, "_drop_session", drop)
    monkeypatch.setattr(client_session.time, "sleep", lambda s: None)
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
    monkeypatch.setattr(client_session, "check_client_access", refuse)
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
        client_session.ray_init(ADDR, {})
    assert isinstance(e.value, client_session._SessionLost) is lost
    if lost:
        assert "lost while connecting" in str(e.value)
    else:
        assert str(e.value) == f"cannot reach Ray at {ADDR}: ray client connection timeout"


def test_a_head_that_did_not_start_names_the_raylets_reason(tmp_path: Any) -> None:
    from soul_apps.cluster.local_cluster import _raylet_cause
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
    from soul_apps.bench.client import summarize
    ok = {"stage": "done", "connect_s": 10.0, "turn_s": 1.0, "session_s": 4.0, "retries": 0, "load1": 50.0}
    rows = [{"scenario": "head-failed", "variant": "runtime", "i": 0, "head_error": "raylet died"},
            {"scenario": "fresh", "variant": "runtime", "i": 0, **ok},
            {"scenario": "fresh", "variant": "runtime", "i": 1, **ok, "connect_s": 30.0, "retries": 1, "slow_warnings": 2},
            {"scenario": "fresh", "variant": "runtime", "i": 2, "stage": "connect", "error": "RuntimeUnavailable: x",
             "fail_s": 3.2, "load1": 60.0},
            {"scenario": "busy", "variant": "runtime", "i": 0, **ok, "stage": "turn", "error": "TurnFailed: y"},
            {"scenario": "head-failed", "variant": "runtime", "i": -1, "head_error": "raylet died"},
            {"scenario": "busy-load", "variant": "runtime", "busy_turns": 10}]
    s = summarize(rows)
    fresh, busy = s["fresh/runtime"], s["busy/runtime"]
    assert (fresh["heads_not_started"], fresh["connects"], fresh["failed"], fresh["failed_after_connect"]) == (1, 3, 1, 0)
    assert fresh["retried"] == 1 and fresh["slow_warned"] == 1 and fresh["fail_s"] == [3.2]
    assert fresh["connect_p50_s"] == 10.0
    assert fresh["connect_max_s"] == 30.0 and fresh["head_errors"] == ["raylet died"]
    assert (busy["heads_not_started"], busy["connects"], busy["failed"], busy["failed_after_connect"]) == (1, 1, 0, 1)


# ---- while connecting: a lost session ends at once; afterwards Ray's reconnect is the session's again -----------

class _Channel:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class _Worker:
    """The fields of Ray Client's Worker that its ``_can_reconnect`` and the watch read."""

    def __init__(self) -> None:
        self._reconnect_enabled, self._in_shutdown, self._has_connected = True, False, True
        self.channel = _Channel()


def _ray_client_parts() -> dict[str, Any]:
    from ray._private import auto_init_hook
    from ray.util.client import dataclient, logsclient
    from ray.util.client import worker as client_worker
    return {"can_reconnect": client_worker.Worker._can_reconnect,
            "data_can_reconnect": dataclient.DataClient._can_reconnect,
            "data_main": dataclient.DataClient._data_main, "log_main": logsclient.LogstreamClient._log_main,
            "auto_connect": auto_init_hook.enable_auto_connect}


def test_while_connecting_a_dropped_call_ends_the_session_and_after_it_ray_reconnects(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ray._private import auto_init_hook
    from ray.util.client import worker as client_worker
    monkeypatch.setattr(auto_init_hook, "enable_auto_connect", True)  # Ray's default
    before = _ray_client_parts()
    dropped = _Rpc(grpc.StatusCode.UNAVAILABLE, "Socket closed")

    assert client_worker.Worker._can_reconnect(_Worker(), dropped) is True  # Ray's own: reconnect in place
    with client_session._connecting(ADDR, 1) as watch:
        assert _ray_client_parts()["auto_connect"] is False  # a call on an ended session starts no local Ray
        refused = _Worker()
        assert client_worker.Worker._can_reconnect(refused, _Rpc(grpc.StatusCode.NOT_FOUND, "gone")) is False
        assert watch.cause is None and not refused._in_shutdown  # an error Ray does not retry passes through
        w = _Worker()
        assert client_worker.Worker._can_reconnect(w, dropped) is False
        assert w._in_shutdown and w.channel.closed == 1  # every call on it stops now
        assert watch.cause == "a call on the session dropped: gRPC UNAVAILABLE: Socket closed"
        assert client_worker.Worker._can_reconnect(w, dropped) is False and w.channel.closed == 1
    assert _ray_client_parts() == before  # Ray's classes and auto-init as they were
    assert client_worker.Worker._can_reconnect(_Worker(), dropped) is True

    with pytest.raises(ValueError), client_session._connecting(ADDR, 1):
        raise ValueError("attach failed")
    assert _ray_client_parts() == before


def test_a_stream_the_head_ends_counts_only_after_the_session_opened_and_while_connecting() -> None:
    watch, w = client_session._Watch(), _Worker()
    watch.stream_ended(w, "log stream")  # still opening: the session's Init answer says why
    assert watch.cause is None and not w._in_shutdown
    watch.opened()
    watch.stream_ended(w, "log stream")
    assert w._in_shutdown and w.channel.closed == 1
    assert watch.cause is not None and "ended the session's log stream" in watch.cause
    later, w2 = client_session._Watch(), _Worker()
    later.opened()
    later.active = False  # attached: the stream threads are Ray's again
    later.stream_ended(w2, "log stream")
    assert later.cause is None and not w2._in_shutdown
    closing = _Worker()
    closing._in_shutdown = True  # this client closed it
    watch2 = client_session._Watch()
    watch2.opened()
    watch2.stream_ended(closing, "data stream")
    assert watch2.cause is None and closing.channel.closed == 0


def test_whatever_attach_raises_after_the_session_was_ended_is_that_loss(fake: dict[str, Any],
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    from ray.util.client import worker as client_worker
    calls: list[bool] = []

    def attach(started: bool) -> str:
        calls.append(started)
        if len(calls) == 1:  # the session's log stream ended / a call dropped: the watch ends the session ...
            client_worker.Worker._can_reconnect(_Worker(), _Rpc(grpc.StatusCode.UNAVAILABLE, "Socket closed"))
            raise Exception("Ray Client is not connected. Please connect by calling `ray.init`.")  # ... and then
        return "runtime"
    with caplog.at_level(logging.WARNING, logger="soul_runtime.connect"):
        assert raycalls.start(ADDR, attach, namespace="ns") == "runtime"
    assert calls == [False, False] and fake["dropped"] == 1 and fake["probed"] == 2  # the head probed again
    [warned] = [r.getMessage() for r in caplog.records if getattr(r, "retry", None) == 1]
    assert "a call on the session dropped: gRPC UNAVAILABLE: Socket closed; retrying" in warned


def test_a_slow_session_is_reported_at_warning_while_it_opens(fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    import threading
    monkeypatch.setattr(client_session, "CLIENT_PROGRESS_S", 0.05)

    def slow_open(address: str, kwargs: dict[str, Any]) -> None:
        threading.Event().wait(0.4)  # time.sleep is stubbed out by the fixture
        fake["opened"] += 1
    monkeypatch.setattr(client_session, "ray_init", slow_open)

    def attach(started: bool) -> str:
        threading.Event().wait(0.3)  # attaching takes long too: not the session server's wait, not reported
        return "runtime"
    with caplog.at_level(logging.WARNING, logger="soul_runtime.connect"):
        assert raycalls.start(ADDR, attach, namespace="ns") == "runtime"
    waits = [r.getMessage() for r in caplog.records]
    assert 3 <= len(waits) <= 8, waits  # about one per 0.05 s of the 0.4 s open, none while attaching
    assert all("still waiting after" in m and "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S" in m for m in waits)
    assert all(hasattr(r, "waiting_s") and not hasattr(r, "retry") for r in caplog.records)  # the bench tells them apart
