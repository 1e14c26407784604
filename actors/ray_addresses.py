"""Where a Ray is and whether it answers: loopback addresses (and Ray's switch that keeps a node on loopback), the
Ray Client and GCS pings (grpc only, no ray imported), waiting for a head that is starting, and the token this
process would offer.

What starting and joining Ray (:mod:`actors.raycalls`, :mod:`actors.client_session`) and managing a local head
(:mod:`soul_apps.cluster.local_cluster`) share.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from soul_runtime.errors import AuthError, RuntimeUnavailable
from soul_runtime.steps import Call, Pause, Steps, run_steps

from .auth_token import token_file

log = logging.getLogger("soul_runtime.connect")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
RAY_CLUSTERS_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray keeps a loopback node address

LOOPBACK = "127.0.0.1"


@contextmanager
def loopback_node() -> Iterator[None]:
    """While Ray starts or joins: let it keep 127.0.0.1 as the node address.

    Ray 2.60 on Linux replaces a loopback node address (``_node_ip_address``,
    ``--node-ip-address``, a ``127.0.0.1:port`` GCS address) with the machine's routable
    address (``services.resolve_ip_for_localhost``); its GCS, raylet and worker gRPC servers
    then listen on every interface (``::``) and the runtime-env agent on that address. It keeps
    127.0.0.1 only when multi-node clusters are switched off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
    read once into ``ray_constants.ENABLE_RAY_CLUSTER``); then every server binds to loopback.
    The variable is set while Ray spawns its processes (they inherit it) and restored after."""
    from ray._private import ray_constants
    old_env, old_flag = os.environ.get(RAY_CLUSTERS_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[RAY_CLUSTERS_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old_flag
        if old_env is None:
            os.environ.pop(RAY_CLUSTERS_ENV, None)
        else:
            os.environ[RAY_CLUSTERS_ENV] = old_env


def _host(address: str) -> str:
    return address.removeprefix("ray://").rpartition(":")[0]


def joins_loopback(address: str) -> bool:
    """Does ``address`` ("host:port" or "auto") name a Ray whose node address is loopback?"""
    if address == "auto":
        from ray._private.services import find_gcs_addresses
        found = [os.environ["RAY_ADDRESS"]] if os.environ.get("RAY_ADDRESS") else sorted(find_gcs_addresses())
        return len(found) == 1 and _host(found[0]) in LOOPBACK_HOSTS
    return _host(address) in LOOPBACK_HOSTS


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


PROBE_PAUSE_S = (0.1, 1.0)
"""Pause between two tries of a port that is not ready: starts at the first value, doubles up to the second."""
PING_METHOD = "/ray.rpc.RayletDriver/ClusterInfo"
PING_REQUEST = b"\x08\x06"
"""A Ray Client's first call, ``ClusterInfo(ClusterInfoRequest(type=PING))`` as Ray 2.60's protobuf encodes it
(checked against Ray's own classes in the tests): the head's client proxy answers it itself, behind its token
check, before any session server is started. Sent here with grpc alone, so no ray is imported: a process
that starts a head must not import ray before it has set the Ray auth variables of the head's token."""

Probe = Callable[[str, float], None]


def ping_client_server(client_address: str, timeout: float = 5.0, *, bearer: str | None) -> None:
    """Ping the Ray Client server at ``ray://HOST:PORT`` as a client's first call does, with the token ``bearer``
    (None: none, for a head without token auth). Raises AuthError when the head refuses the token and
    RuntimeUnavailable when nothing accepts connections or nothing answers within ``timeout``. Imports grpc,
    not ray."""
    import grpc

    target = client_address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not port_open(host.strip("[]"), int(port), timeout=min(timeout, 2.0)):
        raise RuntimeUnavailable(f"nothing accepts connections at {client_address}")
    with grpc.insecure_channel(target) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
            channel.unary_unary(PING_METHOD)(PING_REQUEST, timeout=timeout,
                                             metadata=(("authorization", f"Bearer {bearer}"),) if bearer else None)
        except grpc.FutureTimeoutError as e:
            raise RuntimeUnavailable(f"no Ray Client server answers at {client_address} within {timeout:.0f} s") from e
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.UNAUTHENTICATED:
                raise AuthError(f"{client_address} refused the connection: {e.details()} "
                                f"({'with the token given' if bearer else 'without a token'})") from e
            raise RuntimeUnavailable(f"Ray Client server at {client_address}: {code.name}: "
                                     f"{e.details()}") from e


GCS_PING_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
"""A driver's first call to the GCS (an empty ``GetClusterIdRequest``), checked against the token like any other."""


def gcs_refusal(gcs_address: str, timeout: float = 5.0, *, bearer: str | None) -> str | None:
    """What the GCS at ``HOST:PORT`` says when it refuses the token ``bearer`` (None: no token offered), or None
    when it does not refuse it (accepted, or not reachable: ``ray.init`` reports that itself). Imports grpc, not ray."""
    import grpc

    host, _, port = gcs_address.rpartition(":")
    if not port.isdigit() or not port_open(host.strip("[]"), int(port), timeout=min(timeout, 2.0)):
        return None
    with grpc.insecure_channel(gcs_address) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
            channel.unary_unary(GCS_PING_METHOD)(b"", timeout=timeout,
                                                 metadata=(("authorization", f"Bearer {bearer}"),) if bearer else None)
        except grpc.FutureTimeoutError:
            return None
        except grpc.RpcError as e:
            return f"{e.code().name}: {e.details()}" if e.code() == grpc.StatusCode.UNAUTHENTICATED else None
    return None


def wait_for_client_server(client_address: str, wait_s: float, probe: Probe, *, setting: str = "",
                           warn: bool = True, probe_timeout: float = 5.0, sleep: Callable[[float], None] | None = None,
                           clock: Callable[[], float] | None = None) -> int:
    """Ping the Ray Client server at ``client_address`` with ``probe(address, timeout)`` until it answers, for up
    to ``wait_s`` s; returns the number of tries. A port that refuses the connection or a server that does not
    answer yet (a head still starting) is tried again after a pause (:data:`PROBE_PAUSE_S`), the first retry
    logged at warning (``warn``; else at debug); an AuthError (a missing or wrong token) is raised at the first
    answer; past ``wait_s``: RuntimeUnavailable naming the last cause, the wait and ``setting`` (what sets it)."""
    def perform(step: Call | Pause) -> None:
        if isinstance(step, Pause):
            return (sleep or time.sleep)(step.seconds)
        return probe(client_address, probe_timeout)

    return run_steps(probe_steps(client_address, wait_s, setting=setting, warn=warn, clock=clock or time.monotonic),
                     perform)


def probe_steps(client_address: str, wait_s: float, *, setting: str, warn: bool,
                clock: Callable[[], float]) -> Steps[int]:
    """:func:`wait_for_client_server`'s tries as steps: ``Call("probe", "ping")`` pings the server (raising
    ``RuntimeUnavailable`` while it is not there), :class:`Pause` waits between tries."""
    deadline = clock() + wait_s
    pause, tries = PROBE_PAUSE_S[0], 0
    while True:
        tries += 1
        try:
            yield Call("probe", "ping")
            if tries > 1:
                log.debug("Ray Client server at %s answered after %d tries", client_address, tries,
                          extra={"probe_tries": tries})
            return tries
        except AuthError:
            raise
        except RuntimeUnavailable as e:
            left = deadline - clock()
            if left <= 0:
                if tries == 1:
                    raise
                raise RuntimeUnavailable(f"{e} (tried {tries} times in {wait_s:g} s"
                                         f"{'; ' + setting + ' sets how long' if setting else ''})") from None
            if tries == 1:
                log.log(logging.WARNING if warn else logging.DEBUG, "%s; trying again for up to %.0f s (a head "
                        "that is starting opens its Ray Client port a few seconds after `ray start` returns)", e,
                        left, extra={"probe_wait_s": left})
            yield Pause(min(pause, left))
            pause = min(PROBE_PAUSE_S[1], pause * 2)


def bearer_of(token_path: str | None) -> str | None:
    """The token in ``token_path`` (None: no token file, a head without token auth)."""
    if token_path is None:
        return None
    return Path(token_path).read_text().strip()


def process_bearer(env: Mapping[str, str] | None = None) -> str | None:
    """The token a Ray Client in this environment sends: none with ``RAY_AUTH_MODE=disabled``, else
    ``RAY_AUTH_TOKEN``, else the file :func:`actors.auth_token.token_file` names (Ray 2.60's precedence)."""
    e = os.environ if env is None else env
    if e.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        return None
    if e.get("RAY_AUTH_TOKEN", "").strip():
        return e["RAY_AUTH_TOKEN"].strip()
    path = token_file(e)
    return bearer_of(str(path)) if path is not None and path.is_file() else None
