"""A ``ray://`` connect waits for a Ray Client port that is not open yet, and never for a token the head refuses;
a head's start waits for its Ray Client server the same way.

No Ray here: the "head" is a real gRPC server speaking Ray Client's first call (``ClusterInfo`` PING, token checked
as Ray 2.60's interceptor does), opened on its port only after the connect has been refused a few times. The
pauses between tries are recorded instead of slept, so the tests count tries, not seconds.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc

from actors import client_session, ray_addresses, raycalls
from actors.ray_addresses import ping_client_server, wait_for_client_server
from soul_apps.cluster import local_cluster
from soul_runtime.errors import AuthError, ConfigError, RuntimeUnavailable

TOKEN = "a" * 64


class _Driver(ray_client_pb2_grpc.RayletDriverServicer):
    """Answers the ping of a Ray Client that sends ``authorization: Bearer <token>`` (any, when token is None)."""

    def __init__(self, token: str | None) -> None:
        self.token = token
        self.pings = 0

    def ClusterInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC's name)
        self.pings += 1
        sent = dict(context.invocation_metadata()).get("authorization")
        if self.token is not None and sent != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "Invalid or missing authentication token")
        return ray_client_pb2.ClusterInfoResponse(json="{}")


class _LateHead:
    """A port nothing listens on until :meth:`open` starts the gRPC server on it."""

    def __init__(self, token: str | None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.address = f"ray://127.0.0.1:{self.port}"
        self.driver = _Driver(token)
        self.server: grpc.Server | None = None

    def open(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        ray_client_pb2_grpc.add_RayletDriverServicer_to_server(self.driver, self.server)
        assert self.server.add_insecure_port(f"127.0.0.1:{self.port}") == self.port
        self.server.start()

    def close(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None)


@pytest.fixture()
def late_head() -> Iterator[_LateHead]:
    head = _LateHead(TOKEN)
    yield head
    head.close()


class _Pauses:
    """Stands in for time.sleep and time.monotonic: a pause advances the clock; after ``open_after`` pauses the
    head opens its port."""

    def __init__(self, head: _LateHead | None, open_after: int) -> None:
        self.head, self.open_after = head, open_after
        self.now = 0.0
        self.taken: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.taken.append(seconds)
        self.now += seconds
        if self.head is not None and len(self.taken) == self.open_after:
            self.head.open()

    def clock(self) -> float:
        return self.now


def _with(bearer: str | None) -> ray_addresses.Probe:
    return lambda address, timeout: ping_client_server(address, timeout, bearer=bearer)


def test_the_ping_is_ray_clients_first_call() -> None:
    from ray.core.generated.ray_client_pb2 import ClusterInfoRequest, ClusterInfoType  # type: ignore[attr-defined]
    assert ray_addresses.PING_REQUEST == ClusterInfoRequest(type=ClusterInfoType.PING).SerializeToString()
    assert ray_addresses.PING_METHOD == "/ray.rpc.RayletDriver/ClusterInfo"


def test_a_refused_port_is_tried_until_the_server_listens(late_head: _LateHead,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    pauses = _Pauses(late_head, open_after=4)
    with caplog.at_level(logging.DEBUG, logger="soul_runtime.connect"):
        tries = wait_for_client_server(late_head.address, 30, _with(TOKEN), sleep=pauses.sleep, clock=pauses.clock)
    assert tries == 5 and len(pauses.taken) == 4  # four refusals, then the answer
    assert late_head.driver.pings == 1  # the ping reached the server once: when it had opened
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "nothing accepts connections" in warned[0] and "trying again" in warned[0]
    assert pauses.taken == sorted(pauses.taken) and pauses.taken[-1] <= ray_addresses.PROBE_PAUSE_S[1]


def test_the_connect_path_waits_for_a_head_that_is_starting(late_head: _LateHead, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """raycalls.start (what connect("ray://…") runs): the session is opened only once the server answered."""
    pauses = _Pauses(late_head, open_after=3)
    opened: list[str] = []
    waits: list[float] = []
    real = client_session.wait_for_client_server

    def wait(address: str, wait_s: float, probe: Any, **kw: Any) -> int:  # the real wait, pauses counted not slept
        waits.append(wait_s)
        return real(address, wait_s, _with(TOKEN), **kw | {"sleep": pauses.sleep, "clock": pauses.clock})
    monkeypatch.setattr(client_session, "wait_for_client_server", wait)
    monkeypatch.setattr(client_session, "ray_init", lambda address, kwargs: opened.append(address))
    monkeypatch.setattr(raycalls.ray, "is_initialized", lambda: False)
    monkeypatch.setenv("SOUL_CONNECT_WAIT_S", "45")
    assert raycalls.start(late_head.address, lambda started: "runtime", namespace="ns") == "runtime"
    assert waits == [45.0]  # the setting reached the wait
    assert len(pauses.taken) == 3 and late_head.driver.pings == 1 and opened == [late_head.address]


@pytest.mark.parametrize("bearer", ["b" * 64, None], ids=["wrong token", "no token"])
def test_a_refused_token_fails_at_the_first_answer(late_head: _LateHead, bearer: str | None) -> None:
    late_head.open()
    pauses = _Pauses(None, open_after=0)
    with pytest.raises(AuthError, match="Invalid or missing authentication token"):
        wait_for_client_server(late_head.address, 30, _with(bearer), sleep=pauses.sleep, clock=pauses.clock)
    assert late_head.driver.pings == 1 and pauses.taken == []  # one try, no wait


def test_the_process_token_settings_refused_fail_at_once_on_the_connect_path(
        late_head: _LateHead, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process sends no token the head accepts (unit tests run Ray without one): AuthError, one ping."""
    late_head.open()
    pauses = _Pauses(None, open_after=0)
    opened: list[str] = []
    real = client_session.wait_for_client_server
    monkeypatch.setattr(client_session, "wait_for_client_server",
                        lambda address, wait_s, probe, **kw: real(address, wait_s, probe, **kw | {"sleep": pauses.sleep}))
    monkeypatch.setattr(client_session, "ray_init", lambda address, kwargs: opened.append(address))
    monkeypatch.setattr(raycalls.ray, "is_initialized", lambda: False)
    with pytest.raises(AuthError):
        raycalls.start(late_head.address, lambda started: "runtime", namespace="ns")
    assert late_head.driver.pings == 1 and pauses.taken == [] and opened == []


def test_a_port_that_never_opens_fails_after_the_wait_naming_the_setting() -> None:
    head = _LateHead(None)  # never opened
    pauses = _Pauses(None, open_after=0)
    with pytest.raises(RuntimeUnavailable) as e:
        wait_for_client_server(head.address, 3, _with(None), setting="SOUL_CONNECT_WAIT_S", sleep=pauses.sleep,
                               clock=pauses.clock)
    assert not isinstance(e.value, AuthError)
    assert "nothing accepts connections" in str(e.value) and "SOUL_CONNECT_WAIT_S" in str(e.value)
    assert f"tried {len(pauses.taken) + 1} times" in str(e.value)
    assert sum(pauses.taken) == pytest.approx(3)  # waited the whole window on the (fake) clock, and no more
    with pytest.raises(RuntimeUnavailable, match="nothing accepts connections"):  # 0: one try
        wait_for_client_server(head.address, 0, _with(None), sleep=pauses.sleep, clock=pauses.clock)


def test_the_wait_is_configured_by_the_environment() -> None:
    assert client_session.connect_wait_s({}) == client_session.CONNECT_WAIT_S >= 30
    assert client_session.connect_wait_s({"SOUL_CONNECT_WAIT_S": "2.5"}) == 2.5
    for bad in ("soon", "-1", "nan", "1e9"):
        with pytest.raises(ConfigError, match="SOUL_CONNECT_WAIT_S"):
            client_session.connect_wait_s({"SOUL_CONNECT_WAIT_S": bad})


def test_wait_ready_for_the_start_script(late_head: _LateHead, tmp_path: Any, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """What cluster/start-head.sh runs (with the head's auth variables): exit 0 once the server answers with the
    token, 2 when the token is refused, 3 when nothing answers within --timeout."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    assert ray_addresses.process_bearer() == TOKEN
    assert local_cluster.main(["wait-ready", late_head.address, "--timeout", "0"]) == 3
    assert "did not answer within 0 s" in capsys.readouterr().err
    late_head.open()
    assert local_cluster.main(["wait-ready", late_head.address, "--timeout", "5"]) == 0
    assert late_head.driver.pings == 1
    monkeypatch.setenv("RAY_AUTH_TOKEN", "c" * 64)  # the value wins over the file, as in Ray
    assert local_cluster.main(["wait-ready", late_head.address, "--timeout", "5"]) == 2
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert ray_addresses.process_bearer() is None
    assert local_cluster.main(["wait-ready", late_head.address, "--timeout", "5"]) == 2
    assert late_head.driver.pings == 3  # each refused at its first answer
    assert local_cluster.wait_client_ready(late_head.address, 0, bearer=ray_addresses.bearer_of(str(token))) == 1
