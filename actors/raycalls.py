"""Every call into Ray goes through here, so the actor logic stays testable without Ray.

Errors from Ray are mapped onto the project's exception tree at this boundary.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

import ray
import ray.exceptions

from soul_runtime.errors import AuthError, RuntimeUnavailable, SoulError, TurnFailed
from soul_runtime.owner_only import private_umask

from . import auth_token
from .local_cluster import LOOPBACK_HOSTS, RAY_CLUSTERS_ENV

T = TypeVar("T")

ACTOR_DIED = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)

CLIENT_ATTEMPTS = 3
"""Ray Client session attempts per connect (see :func:`start`)."""
CLIENT_RETRY_WINDOW_S = 10.0
"""No new attempt after a dead session server once the connect is this old: it reports within ~15 s."""
SESSION_START_FAILURES = ("Starting Ray client server failed",)
"""The server-side cause worth another attempt (Ray 2.60 proxier.py): the session server died at once.
Not "Proxy failed to Connect to backend": that server is alive but did not answer within the head's
RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S (a busy head); another server would only add to the load."""

CLIENT_PROGRESS_S = 10.0
"""While a Ray Client session opens: a warning every this many seconds, so a slow head shows within 15 s."""

CHANNEL_LOST = ("disconnected", "data channel")
"""Ray Client's words (dataclient.py) for a session whose data channel broke: while ``ray.init`` opens it, a
lost session (retried), not an unreachable head ("ray client connection timeout": not retried)."""

log = logging.getLogger("soul_runtime.connect")


def is_initialized() -> bool:
    return bool(ray.is_initialized())


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


def _joins_loopback(address: str) -> bool:
    """Does ``address`` ("host:port" or "auto") name a Ray whose node address is loopback?"""
    if address == "auto":
        from ray._private.services import find_gcs_addresses
        found = [os.environ["RAY_ADDRESS"]] if os.environ.get("RAY_ADDRESS") else sorted(find_gcs_addresses())
        return len(found) == 1 and _host(found[0]) in LOOPBACK_HOSTS
    return _host(address) in LOOPBACK_HOSTS


def start(address: str | None, attach: Callable[[bool], T], *, namespace: str,
          env_vars: dict[str, str] | None = None, resources: dict[str, float] | None = None,
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
    if address is None or not address.startswith("ray://") or ray.is_initialized():
        started = init(address, namespace=namespace, env_vars=env_vars, resources=resources)
        return attach(started)
    check_client_access(address)  # fails fast: missing token (AuthError) vs. dead address, never retried
    kwargs = _init_kwargs(namespace, env_vars)
    t0 = time.monotonic()
    for attempt in range(1, client_attempts + 1):
        try:
            with _connecting(address, attempt) as watch:
                try:
                    with _fail_fast_client_close():
                        _ray_init(address, kwargs)
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
            time.sleep(0.5 * attempt)
            check_client_access(address)  # a head that went away: its cause now, not a 30 s connect timeout
    raise AssertionError("unreachable")  # the last attempt returns or raises


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


def _init_kwargs(namespace: str, env_vars: dict[str, str] | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"namespace": namespace, "ignore_reinit_error": True, "log_to_driver": False}
    if env_vars:
        kwargs["runtime_env"] = {"env_vars": env_vars}
    return kwargs


def init(address: str | None, *, namespace: str, num_cpus: int | None = None,
         env_vars: dict[str, str] | None = None, resources: dict[str, float] | None = None) -> bool:
    """Start or join Ray. Returns True when this call started a local Ray instance.

    The local Ray (``address=None``, the embedded default) keeps to the machine and its owner:
    node address 127.0.0.1, so every Ray server listens on loopback only (:func:`loopback_node`),
    and it is started under umask 077, so Ray's processes (the actors included) create
    owner-only files and the auth token Ray writes is 0600.

    ``ray://`` addresses: a session as :func:`start` opens it (the token checked first, a lost session
    retried)."""
    if ray.is_initialized():
        return False
    kwargs = _init_kwargs(namespace, env_vars)
    if address is None:
        kwargs.update(include_dashboard=False, num_cpus=num_cpus or os.cpu_count() or 2, _node_ip_address=LOOPBACK)
        if resources:
            kwargs["resources"] = resources
        token = auth_token.token_file()
        existed = token is not None and token.exists()
        with loopback_node(), private_umask():
            ray.init(**kwargs)
        auth_token.secure_after_start(token, existed)
        return True
    if address.startswith("ray://"):
        return start(address, lambda started: started, namespace=namespace, env_vars=env_vars)
    _ray_init(address, kwargs)
    return False


class _SessionStartFailed(RuntimeUnavailable):
    """The head's Ray Client proxy failed to start (or reach) the per-client server of this session."""

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause if cause is not None else message.rsplit(": ", 1)[-1]

    @property
    def transient(self) -> bool:
        return any(m in str(self) for m in SESSION_START_FAILURES)


def _ray_init(address: str, kwargs: dict[str, Any]) -> None:
    """``ray.init`` with one clear line in the project's errors (Ray raises many kinds here)."""
    try:
        with loopback_node() if not address.startswith("ray://") and _joins_loopback(address) else nullcontext():
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


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()


def create(cls: type, name: str, namespace: str, args: Sequence[Any], **options: Any) -> Any:
    """Get the named actor, creating it when absent (concurrent creators get the same one)."""
    return ray.remote(cls).options(name=name, namespace=namespace, get_if_exists=True, **options).remote(*args)


def settle(named: dict[str, Any], namespace: str, timeout: float) -> dict[str, Any]:
    """Ping freshly created named actors; return the handles that answered, by name.

    ``get_if_exists`` is not enough when several processes create the same actors at once over Ray
    Client: the GCS refuses all but one creation *after* ``.remote()`` returned, and the loser's
    handle fails with ActorAlreadyExistsError on first use. Such a handle is replaced by the actor the
    other process created."""
    out = dict(named)
    for _ in range(3):
        lost, refs = [], {}
        for name, h in out.items():
            try:  # over Ray Client the refusal may surface here, when the handle is first resolved ...
                refs[name] = call(h, "ping")
            except ray.exceptions.ActorAlreadyExistsError:
                lost.append(name)
        for name, ref in refs.items():
            try:  # ... or here
                get(ref, timeout=timeout)
            except ray.exceptions.ActorAlreadyExistsError:
                lost.append(name)
        if not lost:
            return out
        for name in lost:
            h = get_actor(name, namespace)
            if h is None:
                raise RuntimeUnavailable(f"actor {name!r} in namespace {namespace!r} is neither ours nor found")
            out[name] = h
    raise RuntimeUnavailable(f"actors {sorted(lost)} kept failing with 'name already taken'")


def get_actor(name: str, namespace: str) -> Any | None:
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


def named_actors(namespace: str) -> set[str]:
    """Names of the live named actors of ``namespace`` (one GCS call)."""
    import ray.util
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace}


def kill(handle: Any, *, no_restart: bool = True) -> None:
    ray.kill(handle, no_restart=no_restart)


TASK_ERROR = ray.exceptions.RayTaskError
"""What an actor method's own exception arrives as (unwrap it with :func:`translate`)."""


def call(handle: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """Submit a method call; returns an ObjectRef."""
    return getattr(handle, method).remote(*args, **kwargs)


def _unwrap(e: BaseException) -> BaseException:
    """The SoulError behind a (possibly nested) RayTaskError, or ``e`` itself."""
    cur: BaseException | None = e
    for _ in range(8):
        if isinstance(cur, SoulError) and not isinstance(cur, ray.exceptions.RayTaskError):
            return cur
        if not isinstance(cur, ray.exceptions.RayTaskError):
            break
        inner = getattr(cur, "cause", None)
        if isinstance(inner, BaseException):
            cur = inner
            continue
        as_cause = cur.as_instanceof_cause()
        return as_cause if isinstance(as_cause, SoulError) else e
    return cur if isinstance(cur, SoulError) else e


def translate(e: BaseException) -> BaseException:
    """A Ray exception as the project's own (SoulErrors raised in actors come back as themselves)."""
    if isinstance(e, ray.exceptions.GetTimeoutError):
        return TurnFailed("no answer in time")
    if isinstance(e, ray.exceptions.RayTaskError):
        err = _unwrap(e)
        if err is e:
            return TurnFailed(f"remote call failed: {str(e).splitlines()[0]}")
        return err
    if isinstance(e, ACTOR_DIED):
        return RuntimeUnavailable(f"actor died: {str(e).splitlines()[0]}")
    return e


def get(refs: Any, timeout: float | None = None) -> Any:
    """``ray.get`` with our errors: a SoulError raised in an actor is re-raised as itself."""
    try:
        return ray.get(refs, timeout=timeout)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayTaskError, *ACTOR_DIED) as e:
        raise translate(e) from None


def get_raw(refs: Any, timeout: float | None = None) -> Any:
    """``ray.get`` with Ray's own errors (for a caller that tells a dead actor from a failed call itself)."""
    return ray.get(refs, timeout=timeout)


def current_actor() -> Any | None:
    """The handle of the actor this code runs in (to queue a call to itself); None outside an actor (a driver
    that constructs the plain class, as the unit tests do)."""
    if not ray.is_initialized():
        return None
    try:
        return ray.get_runtime_context().current_actor
    except RuntimeError:  # "only available in an actor"
        return None


def node_id() -> str:
    """The id of the Ray node this process runs on ('' outside Ray)."""
    return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else ""


def cluster_cpus() -> int:
    """The CPUs the cluster has (all nodes); this machine's outside Ray."""
    if not ray.is_initialized():
        return os.cpu_count() or 2
    return max(1, int(ray.cluster_resources().get("CPU", 0) or os.cpu_count() or 2))


def metrics_available() -> bool:
    return ray.is_initialized()


def counter(name: str, description: str, tag_keys: tuple[str, ...] = ()) -> Any:
    from ray.util import metrics
    return metrics.Counter(name, description=description, tag_keys=tag_keys)


def histogram(name: str, description: str, boundaries: list[float], tag_keys: tuple[str, ...] = ()) -> Any:
    from ray.util import metrics
    return metrics.Histogram(name, description=description, boundaries=boundaries, tag_keys=tag_keys)


__all__ = ["init", "shutdown", "create", "get_actor", "kill", "call", "get", "translate"]


def check_client_access(client_address: str, timeout: float = 5.0) -> None:
    """Ping the Ray Client server the way ray.init("ray://...") would, with this
    process's auth settings. Raises AuthError (token missing/wrong, ~10 ms) or
    RuntimeUnavailable (nothing answers within `timeout`) instead of Ray's
    ~30 s "ray client connection timeout". Imports ray (and grpc) lazily."""
    import grpc
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import ray_client_pb2_grpc
    from ray.core.generated.ray_client_pb2 import ClusterInfoRequest, ClusterInfoType  # type: ignore[attr-defined]

    from .local_cluster import port_open

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
