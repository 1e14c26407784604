"""Every call into Ray goes through here, so the actor logic stays testable without Ray.

Errors from Ray are mapped onto the project's exception tree at this boundary.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import ray
import ray.exceptions

from soul_runtime.errors import AuthError, RuntimeUnavailable, SoulError, TurnFailed
from soul_runtime.owner_only import private_umask

from . import auth_token
from .ray_addresses import LOOPBACK, loopback_node

T = TypeVar("T")

ACTOR_DIED = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)

log = logging.getLogger("soul_runtime.connect")


def is_initialized() -> bool:
    return bool(ray.is_initialized())


def start(address: str | None, attach: Callable[[bool], T], *, namespace: str,
          env_vars: dict[str, str] | None = None, resources: dict[str, float] | None = None,
          client_attempts: int | None = None) -> T:
    """Start or join Ray (:func:`init`), then ``attach(started)``: find or create what the caller needs on it.
    Over Ray Client (``ray://``) the two are one unit, tried again when the session is lost before ``attach``
    returned (:func:`actors.client_session.open_session`)."""
    if address is None or not address.startswith("ray://") or ray.is_initialized():
        started = init(address, namespace=namespace, env_vars=env_vars, resources=resources)
        return attach(started)
    from . import client_session
    auth_token.reload_in_ray()  # the token this environment names now, not one Ray read before
    return client_session.open_session(address, attach, _init_kwargs(namespace, env_vars),
                                       client_session.CLIENT_ATTEMPTS if client_attempts is None
                                       else client_attempts)


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
    auth_token.reload_in_ray()  # Ray's auth settings as the environment has them now (say the local runtime's token)
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
    from .client_session import ray_init
    if address != "auto":
        check_token(address)
    ray_init(address, kwargs)
    return False


def check_token(gcs_address: str) -> None:
    """AuthError at once when the GCS at ``gcs_address`` refuses the token this process's Ray would offer it
    (``ray.init`` itself retries a refused token for about 20 s, then says only that it failed to connect)."""
    from .ray_addresses import gcs_refusal, process_bearer
    mode = os.environ.get("RAY_AUTH_MODE", "").strip().lower()
    bearer = process_bearer() if mode == "token" else None  # an explicit address never turns token auth on
    refusal = gcs_refusal(gcs_address, bearer=bearer)
    if refusal is not None:
        source = ("none (RAY_AUTH_MODE is not 'token')" if mode != "token" else
                  auth_token.token_source() if bearer else f"none found ({auth_token.token_source()})")
        raise AuthError(f"Ray at {gcs_address} refused this process's token ({refusal}); the token offered: {source}")


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()


def create(cls: type, name: str, namespace: str, args: Sequence[Any], **options: Any) -> Any:
    """Get the named actor, creating it when absent (concurrent creators get the same one)."""
    return ray.remote(cls).options(name=name, namespace=namespace, get_if_exists=True, **options).remote(*args)


def confirm_created(named: dict[str, Any], namespace: str, timeout: float) -> dict[str, Any]:
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


async def get_async(refs: list[Any]) -> list[Any]:
    """The calls' answers, awaited (no thread waits), with Ray's errors as the project's own."""
    try:
        return list(await asyncio.gather(*refs))
    except Exception as e:  # noqa: BLE001 — as the project's own error
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


