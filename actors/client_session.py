"""Ray Client sessions: opening one over ``ray://``, telling a lost session from a refused one, trying again.

Ray Client (2.60) keeps a session whose channel dropped for an in-place reconnect of up to 30 s, and reports a
session server that died at start only after that. While a connect opens its session and attaches, this module
watches Ray's client classes (patched only for that time) so a lost session ends at once with its cause and is
opened again (attaching is idempotent; no turn has been submitted); an auth failure or an unreachable head is
raised at once. Everything here runs only for ``ray://`` addresses.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

import ray

from soul_runtime.errors import AuthError, ConfigError, RuntimeUnavailable, SoulError
from soul_runtime.steps import Call, Pause, Steps, run_steps

from .ray_addresses import joins_loopback, loopback_node, port_open, wait_for_client_server

T = TypeVar("T")

CLIENT_ATTEMPTS = 3
"""Ray Client session attempts per connect (see :func:`start`)."""
CLIENT_RETRY_WINDOW_S = 10.0
"""No new attempt after a dead session server once the connect is this old: it reports within ~15 s."""
SESSION_START_FAILURES = ("Starting Ray client server failed",)
"""The server-side cause worth another attempt (Ray 2.60 proxier.py): the session server died at once.
Not "Proxy failed to Connect to backend": that server is alive but did not answer within the head's
RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S (a busy head); another server would only add to the load."""

CONNECT_WAIT_ENV = "SOUL_CONNECT_WAIT_S"
CONNECT_WAIT_S = 30.0
"""How long a ``ray://`` connect keeps trying a Ray Client port that refuses it (a head still starting: its
client server binds its port a few seconds after ``ray start`` returned, longer on a busy machine) before
``RuntimeUnavailable``; ``SOUL_CONNECT_WAIT_S`` sets it (0: one try). A missing or wrong token is never
waited on (``AuthError`` at the first answer)."""
CLIENT_PROGRESS_S = 10.0
"""While a Ray Client session opens: a warning every this many seconds, so a slow head shows within 15 s."""

CHANNEL_LOST = ("disconnected", "data channel")
"""Ray Client's words (dataclient.py) for a session whose data channel broke: while ``ray.init`` opens it, a
lost session (retried), not an unreachable head ("ray client connection timeout": not retried)."""

log = logging.getLogger("soul_runtime.connect")


def open_session(address: str, attach: Callable[[bool], T], kwargs: dict[str, Any],
                 client_attempts: int = CLIENT_ATTEMPTS) -> T:
    """Start or join Ray (:func:`init`), then ``attach(started)``: find or create what the caller needs on it.

    Over Ray Client (``ray://``) the two are one unit that is tried again, up to ``client_attempts`` times
    in all, when the session is lost before ``attach`` returned: the head's session server died at start
    (``Starting Ray client server failed``, while the connect is younger than CLIENT_RETRY_WINDOW_S), or the
    session's channel dropped while attaching (a Ray Client ``ConnectionError`` or gRPC error). ``attach``
    must therefore be idempotent (finding or creating named actors is; it must submit no turn). Each retry
    is logged at warning with its cause. Never retried: AuthError, a session server slower than the head's
    RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S (another one would only add to the load), errors of
    ``attach`` itself (SoulErrors, timeouts), a head that stopped answering (probed again before a retry).

    While the unit runs (:func:`_connecting`), a dropped channel ends the session at once instead of
    waiting in Ray's in-place reconnect (up to 30 s on a dead session server), and a session that is
    slow to open is reported at warning every CLIENT_PROGRESS_S. Once ``attach`` returned, Ray's reconnect
    is the session's as before."""
    # a head still starting is waited for (its port refuses the connection); a refused token fails at once
    wait_for_client_server(address, connect_wait_s(), lambda a, timeout: check_client_access(a, timeout),
                           setting=CONNECT_WAIT_ENV)

    def perform(step: Call | Pause) -> Any:
        if isinstance(step, Pause):
            return time.sleep(step.seconds)
        if step.method == "open":
            return _open_once(address, attach, kwargs, *step.args)
        return check_client_access(address)  # a head that went away: its cause now, not a 30 s connect timeout

    return run_steps(session_steps(address, client_attempts), perform)


def session_steps(address: str, client_attempts: int) -> Steps[Any]:
    """The attempts of :func:`open_session` as steps: ``Call("session", "open", (attempt, t0))`` opens the
    session and attaches (or raises :class:`_SessionStartFailed`); after a loss worth another attempt,
    :class:`Pause` and ``Call("session", "probe")`` (the head still answers) come before the next one."""
    t0 = time.monotonic()
    for attempt in range(1, client_attempts + 1):
        try:
            return (yield Call("session", "open", (attempt, t0)))
        except _SessionStartFailed as e:
            elapsed = time.monotonic() - t0
            retry = (e.transient or isinstance(e, _SessionLost)) and attempt < client_attempts and (
                isinstance(e, _SessionLost) or elapsed < CLIENT_RETRY_WINDOW_S)
            if not retry:
                hint = (f"; {attempt} attempts in {elapsed:.1f} s" if attempt > 1 else "") + (
                    "; see ray_client_server*.err in the head's session logs, and start the head with "
                    "GRPC_ENABLE_FORK_SUPPORT=0 (docs/troubleshooting.md)" if e.transient else
                    "; the head may be too busy to start a session server in time (its "
                    "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S)" if "Proxy failed" in str(e) else
                    "; see ray_client_server.err (the proxy) and ray_client_server_*.err in the head's session "
                    "logs" if isinstance(e, _SessionLost) else "")
                raise RuntimeUnavailable(f"{e}{hint}") from None
            log.warning("Ray Client session at %s failed (attempt %d of %d, %.1f s): %s; retrying",
                        address, attempt, client_attempts, elapsed, e.cause, extra={"retry": attempt})
            yield Pause(0.5 * attempt)
            yield Call("session", "probe")
    raise AssertionError("unreachable")  # the last attempt returns or raises


def _open_once(address: str, attach: Callable[[bool], T], kwargs: dict[str, Any], attempt: int, t0: float) -> T:
    """One attempt of :func:`open_session`: open the session, then attach; a session lost meanwhile is
    :class:`_SessionLost`."""
    with _connecting(address, attempt) as watch:
        try:
            with _fail_fast_client_close():
                ray_init(address, kwargs)
        except _SessionLost as e:
            raise watch.lost(address, e.cause) from None
        watch.opened()
        log.debug("Ray Client session to %s opened in %.2f s (attempt %d)", address, time.monotonic() - t0,
                  attempt, extra={"session_s": time.monotonic() - t0})
        try:
            return attach(False)
        except Exception as e:
            # Once the watch ended the session, whatever attach raised is that loss (Ray Client's
            # "not connected", a cancelled call ...); AuthError never is.
            lost = None if isinstance(e, AuthError) else watch.cause or _session_lost(e)
            if lost is None:
                raise
            watch.note(lost)  # before closing: closing cancels the session's streams too
            _drop_session()
            raise watch.lost(address, lost) from None


class _Watch:
    """One Ray Client session attempt of :func:`start`, while it opens and attaches (see :func:`_connecting`).

    ``cause``: the first thing that ended the session (a dropped channel, a stream the head ended)."""

    def __init__(self) -> None:
        self.cause: str | None = None
        self.is_open = False
        self.active = True
        self._lock = threading.Lock()

    def note(self, cause: str) -> None:
        with self._lock:
            if self.cause is None:
                self.cause = cause

    def end(self, worker: Any, cause: str) -> None:
        """The session broke (``cause``): stop every call on it now - Ray's client would otherwise wait
        out its reconnect, and a call in the head's proxy its 30 s channel wait."""
        self.note(cause)
        with self._lock:
            first = not worker._in_shutdown
            worker._in_shutdown = True  # no stream thread reconnects, no call is retried
        if first and worker.channel is not None:
            worker.channel.close()  # cancels the calls in flight (one may wait in the head's proxy)

    def stream_ended(self, worker: Any, stream: str) -> None:
        """A stream of the session ended without this client closing it: after the session opened, only
        the head ends them so - the proxy ends the log stream at once when the session server dies (the
        data stream's error it holds back for the session's reconnect grace period, 30 s)."""
        if self.active and self.is_open and not worker._in_shutdown:
            self.end(worker, f"the head ended the session's {stream} (its session server for this client is "
                             "gone)")

    def opened(self) -> None:
        self.is_open = True

    def lost(self, address: str, cause: str) -> _SessionLost:
        self.note(cause)
        assert self.cause is not None
        return _SessionLost(f"the Ray Client session to {address} was lost while connecting: {self.cause}",
                            self.cause)


@contextmanager
def _connecting(address: str, attempt: int) -> Iterator[_Watch]:
    """While one session attempt opens and attaches: a lost session ends at once, and a slow one is reported.

    Ray Client (2.60) keeps a session whose channel dropped for a reconnect in place. When the head's
    session server for this client dies, its proxy ends the session's log stream at once but holds the
    data stream's error back for the session's reconnect grace period (30 s: the client's
    RAY_CLIENT_RECONNECT_GRACE_PERIOD, sent in its InitRequest), and a call that reaches the proxy after
    the death waits RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S (30 s) for the dead server; connect() heard
    of the loss only then (30.1-30.6 s, in 3 of 6 and 5 of 5 runs). While connecting nothing is lost by
    opening a new session instead (attaching is idempotent, no turn was submitted), so here (:class:`_Watch`)
    a stream the head ended after the session opened, or an error Ray's ``_can_reconnect`` would retry,
    ends the session at once with its cause. The patches are on Ray's client classes only while this
    runs; once attached, the session reconnects as Ray's does (the grace period the head holds it for is
    never changed). Errors Ray does not retry pass through, and so do errors before the client's first
    channel connected (Ray's own connect loop retries those). Ray's auto-init is off meanwhile: a call on
    the ended session would otherwise start a local Ray in this process (``ray.is_initialized()`` is then
    False).

    Opening the session waits for the head to start a session server for this client (seconds; 30 s and
    more on a busy 2-core head), and only the head decides it failed (after its
    RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S): every CLIENT_PROGRESS_S of that wait is logged at warning."""
    from ray._private import auto_init_hook
    from ray.util.client import dataclient, logsclient
    from ray.util.client import worker as client_worker

    watch = _Watch()
    worker_cls, data_cls, logs_cls = client_worker.Worker, dataclient.DataClient, logsclient.LogstreamClient
    can_reconnect, data_main, log_main = worker_cls._can_reconnect, data_cls._data_main, logs_cls._log_main

    def worker_reconnect(self: Any, e: Any) -> bool:
        retried = bool(can_reconnect(self, e))
        if not retried or not getattr(self, "_has_connected", False):
            return retried
        watch.end(self, f"a call on the session dropped: {_session_lost(e) or e}")
        return False

    def data_reconnect(self: Any, e: Any) -> bool:  # the data stream broke: the session is over either way
        watch.end(self.client_worker, f"the session's data channel dropped: {_session_lost(e) or e}")
        return False

    def data_thread(self: Any) -> None:  # the stream threads start while this runs, and keep these targets
        try:
            data_main(self)
        finally:
            watch.stream_ended(self.client_worker, "data stream")

    def log_thread(self: Any) -> None:
        try:
            log_main(self)
        finally:
            watch.stream_ended(self.client_worker, "log stream")

    stop = threading.Event()
    t0 = time.monotonic()

    def report() -> None:  # the wait is the head's (its session server starting); say so while it lasts
        while not stop.wait(CLIENT_PROGRESS_S):
            if watch.is_open:
                return
            log.warning("Ray Client session at %s (attempt %d): still waiting after %.0f s for the session "
                        "server the head starts for this client; a busy head is slow to start it, and the head "
                        "gives up after its RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S (Ray's default 30 s)",
                        address, attempt, time.monotonic() - t0, extra={"waiting_s": time.monotonic() - t0})

    patches = {(worker_cls, "_can_reconnect"): worker_reconnect, (data_cls, "_can_reconnect"): data_reconnect,
               (data_cls, "_data_main"): data_thread, (logs_cls, "_log_main"): log_thread}
    originals = {key: getattr(*key) for key in patches}
    for (cls, name), patched in patches.items():
        setattr(cls, name, patched)
    auto_connect = auto_init_hook.enable_auto_connect
    auto_init_hook.enable_auto_connect = False  # a call on an ended session must not start a local Ray
    reporter = threading.Thread(target=report, name="soul-connect-progress", daemon=True)
    reporter.start()
    try:
        yield watch
    finally:
        stop.set()
        watch.active = False  # the session's stream threads outlive this; they are Ray's again
        for (cls, name), original in originals.items():
            setattr(cls, name, original)
        auto_init_hook.enable_auto_connect = auto_connect


class _SessionStartFailed(RuntimeUnavailable):
    """The head's Ray Client proxy failed to start (or reach) the per-client server of this session."""

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause if cause is not None else message.rsplit(": ", 1)[-1]

    @property
    def transient(self) -> bool:
        return any(m in str(self) for m in SESSION_START_FAILURES)


def ray_init(address: str, kwargs: dict[str, Any]) -> None:
    """``ray.init`` with one clear line in the project's errors (Ray raises many kinds here)."""
    try:
        with loopback_node() if not address.startswith("ray://") and joins_loopback(address) else nullcontext():
            ray.init(address=address, **kwargs)
    except ConnectionAbortedError as e:  # Ray Client: "Initialization failure from server:\n<server traceback>"
        if "authentication" in _server_cause(e).lower():
            raise AuthError(f"Ray at {address} refused the session: {_server_cause(e)}") from None
        raise _SessionStartFailed(f"the Ray Client server at {address} could not open a session for this client: "
                                 f"{_server_cause(e)}", _server_cause(e)) from None
    except ConnectionError as e:
        msg = str(e)
        if address.startswith("ray://") and any(m in msg for m in CHANNEL_LOST):
            lost = _session_lost(e) or msg
            raise _SessionLost(f"the Ray Client session to {address} was lost while connecting: {lost}", lost) from None
        raise RuntimeUnavailable(f"cannot reach Ray at {address}: {msg.splitlines()[0] if msg else e}"
                                 f"{_grpc_status(msg)}") from None
    except Exception as e:
        if "auth" in str(e).lower() or "token" in str(e).lower():
            raise AuthError(f"Ray at {address} refused the connection: {str(e).splitlines()[0]}") from None
        raise RuntimeUnavailable(f"cannot connect to Ray at {address}: {str(e).splitlines()[0]}") from None


def _grpc_status(msg: str) -> str:
    """' (gRPC UNAUTHENTICATED: details)' from a gRPC error Ray quotes in its message, else ''."""
    found = dict(re.findall(r"^\s*(status|details) = (.+)$", msg, re.M))
    if not found:
        return ""
    return f" (gRPC {found.get('status', '?').removeprefix('StatusCode.')}: {found.get('details', '').strip(chr(34))})"


def _server_cause(e: BaseException) -> str:
    """The last line of the server-side traceback Ray puts in an init failure (the exception raised there)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__


class _SessionLost(_SessionStartFailed):
    """The Ray Client session opened, then its channel dropped before the connect had attached."""


def _session_lost(e: BaseException) -> str | None:
    """The cause, when ``e`` is Ray Client's account of a lost session (the data channel dropped, the server
    went away), else None. SoulErrors (AuthError included) and timeouts are never a lost session."""
    import grpc
    if isinstance(e, SoulError):
        return None
    if isinstance(e, grpc.RpcError) and hasattr(e, "code"):
        return f"gRPC {e.code().name}: {e.details()}"
    if isinstance(e, ConnectionError):
        msg = str(e)
        return (msg.splitlines()[0] if msg else type(e).__name__) + _grpc_status(msg)
    return None


def _drop_session() -> None:
    """Disconnect a lost session at once (without waiting for Ray's reconnect grace period)."""
    try:
        with _fail_fast_client_close():
            ray.shutdown()
    except Exception as e:  # the session is gone already; what matters is that a new one can start
        log.debug("closing the lost Ray Client session: %s", e)


@contextmanager
def _fail_fast_client_close() -> Iterator[None]:
    """While ``ray.init("ray://...")`` runs: a failed init closes the gRPC channel before Ray joins its
    stream threads.

    Ray 2.60's ``Worker.close()`` (called when the init fails) first waits for the server to end the
    data stream - the server holds it for the reconnect grace period, 30 s - and the log stream - the
    proxy retries the dead session 5 times - so the cause surfaced 30-45 s late. Closing the channel
    first cancels both streams; the threads then exit at once. Only failed inits call ``close`` here:
    a session that connected is closed later by ``ray.shutdown()``, unpatched."""
    from ray.util.client import worker as client_worker

    original = client_worker.Worker.close

    def close(self: Any) -> None:
        self._in_shutdown = True  # the stream threads must not try to reconnect
        quiet = logging.getLogger("ray.util.client.dataclient")
        was = quiet.disabled
        quiet.disabled = True  # "Unrecoverable error in data channel": the cancel we asked for
        try:
            if self.channel is not None:
                self.channel.close()
            original(self)
        finally:
            quiet.disabled = was

    client_worker.Worker.close = close  # type: ignore[method-assign]
    try:
        yield
    finally:
        client_worker.Worker.close = original  # type: ignore[method-assign]


def connect_wait_s(env: dict[str, str] | None = None) -> float:
    """:data:`CONNECT_WAIT_S`, or ``SOUL_CONNECT_WAIT_S`` when set (seconds, >= 0)."""
    raw = (os.environ if env is None else env).get(CONNECT_WAIT_ENV, "").strip()
    if not raw:
        return CONNECT_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise ConfigError(f"{CONNECT_WAIT_ENV} must be a number of seconds in 0..3600, got {raw!r}")
    return value


def check_client_access(client_address: str, timeout: float = 5.0) -> None:
    """Ping the Ray Client server the way ray.init("ray://...") would, with this process's Ray auth settings.
    Raises AuthError (token missing/wrong, ~10 ms) or RuntimeUnavailable (nothing accepts connections, or
    nothing answers within `timeout`) instead of Ray's ~30 s "ray client connection timeout".
    (:func:`actors.ray_addresses.ping_client_server` is the same ping with a token given, without Ray.)"""
    import grpc
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import ray_client_pb2_grpc
    from ray.core.generated.ray_client_pb2 import ClusterInfoRequest, ClusterInfoType  # type: ignore[attr-defined]

    target = client_address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not port_open(host.strip("[]"), int(port), timeout=min(timeout, 2.0)):
        raise RuntimeUnavailable(f"nothing accepts connections at {client_address}")
    channel = init_grpc_channel(target, asynchronous=False)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        stub = ray_client_pb2_grpc.RayletDriverStub(channel)
        stub.ClusterInfo(ClusterInfoRequest(type=ClusterInfoType.PING), timeout=timeout)
    except grpc.FutureTimeoutError as e:
        raise RuntimeUnavailable(f"no Ray Client server answers at {client_address} within {timeout:.0f} s") from e
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNAUTHENTICATED:
            mode = os.environ.get("RAY_AUTH_MODE", "unset")
            raise AuthError(f"{client_address} refused the connection: {e.details()} (RAY_AUTH_MODE={mode}; set "
                            "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH to the cluster's token file)") from e
        raise RuntimeUnavailable(f"Ray Client server at {client_address}: {e.code().name}: {e.details()}") from e
    finally:
        channel.close()
