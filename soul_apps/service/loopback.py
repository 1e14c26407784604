"""A service on loopback keeps every port of its own on loopback: Ray Serve binds HAProxy's stats and metrics
frontends to every interface (its configuration template writes ``bind *:PORT`` and ``bind :PORT``, whatever the
service's host) and each replica's internal gRPC server to ``[::]``. :func:`bind_loopback` rewrites those binds to
the service's loopback address; it runs in each process of Serve's actors (the controller, HAProxy's manager, the
replicas), as Ray's worker setup hook, which :func:`controller_env` puts into the Serve controller's environment
(its actors inherit it) when the service listens on loopback on one node. A service on another host is left as
Serve makes it (docs/service.md lists those ports)."""

from __future__ import annotations

import logging
import os
from typing import Any

HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"  # ray._private.ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR
HOST_ENV = "SOUL_SERVE_LOOPBACK"
LOOPBACK = {"127.0.0.1": "127.0.0.1", "localhost": "127.0.0.1", "::1": "::1"}
BINDS = ("bind *:{{ config.stats_port }}", "bind :{{ config.metrics_port }}")
log = logging.getLogger("soul_runtime")


def controller_env(host: str, nodes: int) -> dict[str, str]:
    """The Serve controller's environment for a service on ``host`` over ``nodes`` nodes: the hook, when the
    service keeps to one machine's loopback (on more nodes the replicas' ports must be reachable from the others)."""
    address = LOOPBACK.get(host)
    if address is None or nodes != 1:
        return {}
    return {HOOK_ENV: f"{__name__}.bind_loopback", HOST_ENV: address}


def bind_loopback() -> None:
    """In a Serve process: HAProxy's stats and metrics frontends and the replica's internal gRPC server bind the
    loopback address of :data:`HOST_ENV` instead of every interface."""
    address = os.environ.get(HOST_ENV)
    if not address:
        return
    from ray.serve._private import haproxy, replica
    template = haproxy.HAPROXY_CONFIG_TEMPLATE
    host = f"[{address}]" if ":" in address else address
    for bind in BINDS:
        if bind not in template:
            log.warning("Serve's HAProxy template has no %r: that port may listen beyond loopback", bind)
        template = template.replace(bind, "bind " + host + ":" + bind.split(":", 1)[1])
    haproxy.HAPROXY_CONFIG_TEMPLATE = template
    add_port = replica.add_port_to_grpc_server

    def on_loopback(server: Any, address_: str) -> Any:
        return add_port(server, f"{host}:0" if address_ == "[::]:0" else address_)
    replica.add_port_to_grpc_server = on_loopback
