"""Every call into Ray goes through here, so the actor logic stays testable without Ray.

Errors from Ray are mapped onto the project's exception tree at this boundary.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeVar

import ray
import ray.exceptions

from soul_runtime.errors import AuthError, RuntimeUnavailable, SoulError, TurnFailed

T = TypeVar("T")

ACTOR_DIED = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


def is_initialized() -> bool:
    return bool(ray.is_initialized())


def init(address: str | None, *, namespace: str, num_cpus: int | None = None,
         env_vars: dict[str, str] | None = None, resources: dict[str, float] | None = None) -> bool:
    """Start or join Ray. Returns True when this call started a local Ray instance."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"namespace": namespace, "ignore_reinit_error": True, "log_to_driver": False}
    if env_vars:
        kwargs["runtime_env"] = {"env_vars": env_vars}
    if address is None:
        kwargs.update(include_dashboard=False, num_cpus=num_cpus or os.cpu_count() or 2)
        if resources:
            kwargs["resources"] = resources
        ray.init(**kwargs)
        return True
    if address.startswith("ray://"):
        check_client_access(address)  # fails fast: missing token vs. dead address
    try:
        ray.init(address=address, **kwargs)
    except ConnectionError as e:
        msg = str(e)
        raise RuntimeUnavailable(f"cannot reach Ray at {address}: {msg.splitlines()[0] if msg else e}") from None
    except Exception as e:  # ray raises many kinds here; one clear line for the caller
        if "auth" in str(e).lower() or "token" in str(e).lower():
            raise AuthError(f"Ray at {address} refused the connection: {str(e).splitlines()[0]}") from None
        raise RuntimeUnavailable(f"cannot connect to Ray at {address}: {str(e).splitlines()[0]}") from None
    return False


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()


def create(cls: type, name: str, namespace: str, args: Sequence[Any], **options: Any) -> Any:
    """Get the named actor, creating it when absent (concurrent creators get the same one)."""
    return ray.remote(cls).options(name=name, namespace=namespace, get_if_exists=True, **options).remote(*args)


def get_actor(name: str, namespace: str) -> Any | None:
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


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


def node_id() -> str:
    """The id of the Ray node this process runs on ('' outside Ray)."""
    return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else ""


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
