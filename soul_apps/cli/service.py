"""``soul tenants``, ``soul serve`` and ``soul mcp``: soul-runtime as a service for tenants with API keys."""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from soul_apps.cli import progress
from soul_apps.service import INGRESSES
from soul_apps.service.tenants import TenantTable, check_tenant, souls_of
from soul_runtime.errors import InvalidInput, RuntimeUnavailable
from soul_runtime.memory.postgres_db import is_postgres
from soul_runtime.memory.sqlite_db import use_storage

if TYPE_CHECKING:
    from soul_apps.cli.context import Ctx

SERVE_HELP = """Serve the JSON API (/v1), /healthz, /openapi.json, MCP (/mcp/) and the memory inspector's pages
(/ui/, unless --no-inspector) over HTTP on Ray Serve, for the tenants of `soul tenants` (Authorization: Bearer
KEY). Runs in the foreground until SIGINT/SIGTERM, then drains the requests in flight and stops the Serve app,
its ingress and controller (the runtime stays up).
Without --address it serves the data dir's local runtime; if that runtime is replaced meanwhile (a command
started under other code or another model setting replaces it), the app goes with it and `soul serve` exits
with status 3: start it again."""

MCP_HELP = """Serve one soul's memory over MCP on stdin/stdout (for Claude Desktop, Claude Code and other MCP
clients): tools remember, recall, facts and forget. With --tenant the soul is that tenant's (the same soul as
the HTTP API's); without, the runtime's soul of that id."""


def _table(ctx: Ctx) -> TenantTable:
    storage = os.environ.get("SOUL_STORAGE", "")
    if is_postgres(storage):  # the tenants and the souls' records are on the server, whichever node this is
        use_storage(storage)
        return TenantTable(ctx.data_dir, storage)
    if not ctx.local_data():
        raise InvalidInput("tenants are kept in the data dir: run `soul tenants` where the data dir is visible "
                           "(on a cluster, on the head), or on the PostgreSQL storage (SOUL_STORAGE)")
    return TenantTable(ctx.data_dir, "local")


def cmd_tenants(ctx: Ctx) -> int:
    from soul_apps.cli import render
    a = ctx.args
    table = _table(ctx)
    if a.action == "usage":
        return _usage(ctx, table, check_tenant(a.name) if a.name else None)
    if a.action == "set":
        return _set(ctx, table, check_tenant(a.name) if a.name else None)
    if a.action == "list":
        rows = [{"name": t.name, "status": "active" if t.active else "revoked", "created_at": t.created_at,
                 "revoked_at": t.revoked_at, "souls": len(souls_of(ctx.data_dir, t.name))} for t in table.tenants()]
        ctx.emit(rows, render.kv_table("tenants", {str(r["name"]): f"{r['status']}, {r['souls']} souls" for r in rows})
                 if rows else "no tenants")
        return 0
    if not a.name:
        raise InvalidInput(f"soul tenants {a.action} needs a tenant NAME")
    name = check_tenant(a.name)
    if a.action == "add":
        key = table.add(name)
        ctx.emit({"tenant": name, "key": key},
                 f"added tenant '{name}'; its API key is shown only now (the data dir keeps a hash of it).\n"
                 f"Send it as 'Authorization: Bearer KEY'. key: {key}")
    elif a.action == "revoke":
        t = table.revoke(name)
        ctx.emit({"tenant": name, "revoked_at": t.revoked_at},
                 f"revoked the key of tenant '{name}' (its souls stay; `soul tenants remove {name} --forget` deletes them)")
    elif a.action == "remove":
        table.get(name)
        have = souls_of(ctx.data_dir, name)
        if have and not a.forget:
            raise InvalidInput(f"tenant '{name}' has {len(have)} souls: add --forget to delete them with it, or "
                               f"revoke its key instead")
        table.revoke(name)  # no request of it is accepted from here on
        gone = _erase(ctx, name) if a.forget else []
        table.remove(name)
        ctx.emit({"tenant": name, "souls_deleted": gone},
                 f"removed tenant '{name}'" + (f" and deleted its {len(gone)} souls" if a.forget else ""))
    return 0


LIMIT_FLAGS = (("turns_per_s", float), ("in_flight", int), ("souls", int), ("stored_bytes", int),
               ("tokens_per_day", int), ("weight", float))


def _set(ctx: Ctx, table: TenantTable, name: str | None) -> int:
    """``soul tenants set NAME --turns-per-s … --weight …`` (``--default``: every tenant without a value of its
    own); a value of 0 unsets a limit (the weight goes back to 1)."""
    a = ctx.args
    if (name is None) != a.default:
        raise InvalidInput("soul tenants set takes a tenant NAME, or --default for every tenant without its own")
    changes = {k: (None if v == 0 else v) for k, _ in LIMIT_FLAGS if (v := getattr(a, k)) is not None}
    if not changes:
        raise InvalidInput("soul tenants set needs a limit: --turns-per-s, --in-flight, --souls, --stored-bytes, "
                           "--tokens-per-day or --weight")
    got = table.set_limits(name, **changes).to_dict()
    who = f"tenant '{name}'" if name else "tenants without their own (defaults)"
    ctx.emit({"tenant": name, "limits": got},
             f"limits of {who}: " + (", ".join(f"{k}={v:g}" for k, v in got.items()) or "none"))
    return 0


def _usage(ctx: Ctx, table: TenantTable, name: str | None) -> int:
    """``soul tenants usage [NAME]``: each tenant's souls and bytes on disk, its counts (turns, tokens, tokens
    today, turns refused over a limit, seconds waited in the fair queues) and its limits in force."""
    from actors.quotas import usage_row
    from actors.tenant_usage import read_usage
    from soul_apps.cli import render
    storage = os.environ.get("SOUL_STORAGE", "")  # the usage books are on the server with a PostgreSQL storage
    counted = read_usage(ctx.data_dir, storage=storage if is_postgres(storage) else "")
    if name:
        table.get(name)
    rows = [usage_row(ctx.data_dir, n, table.limits(n), counted) for n in ([name] if name else
                                                                          [t.name for t in table.tenants()])]
    if not rows:
        ctx.emit(rows, "no tenants")
        return 0
    t = render.Table(title="tenant usage (counts since the data dir's first service; tokens today: UTC)",
                     title_justify="left")
    cols = ("tenant", "souls", "stored_bytes", "turns", "tokens", "tokens_today", "throttled", "queued_s", "limits")
    for col in cols:
        t.add_column(col, overflow="fold", justify="left" if col in ("tenant", "limits") else "right")
    for r in rows:
        limits = ", ".join(f"{k}={v:g}" for k, v in r["limits"].items()) or "-"
        t.add_row(*(limits if c == "limits" else str(r[c]) for c in cols))
    ctx.emit(rows, t)
    return 0


def _erase(ctx: Any, tenant: str) -> list[str]:
    from soul_apps.cluster import local_runtime as bg
    if ctx.address is None and not bg.running(ctx.data_dir):
        from soul_apps.service.tenant_admin import erase_souls
        return erase_souls(None, ctx.data_dir, tenant)  # no runtime holds the data dir: the files go directly
    with ctx.runtime() as rt:  # (Ray is imported once the runtime's auth settings are in the environment)
        from soul_apps.service.tenant_admin import erase_souls
        return erase_souls(rt, ctx.data_dir, tenant)


def _listening(host: str, port: int) -> bool:
    import socket
    try:
        with socket.create_connection(("127.0.0.1" if host in ("0.0.0.0", "::", "localhost") else host, port),
                                      timeout=0.5):
            return True
    except OSError:
        return False


def _wait_healthy(url: str, timeout: float, stop: threading.Event) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline and not stop.is_set():
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                if r.status == 200:
                    return
        except Exception as e:  # not up yet
            last = str(e)
        time.sleep(0.5)
    if not stop.is_set():
        raise RuntimeUnavailable(f"the service did not answer {url} within {timeout:.0f} s ({last})")


def cmd_serve(ctx: Ctx) -> int:
    from soul_apps.cluster import local_runtime as bg
    a = ctx.args
    if not 1 <= a.replicas <= 64:
        raise InvalidInput("--replicas must be in 1..64")
    if not 1 <= a.max_ongoing <= 100_000:
        raise InvalidInput("--max-ongoing must be in 1..100000")
    if not 1 <= a.port <= 65535:
        raise InvalidInput("--port must be in 1..65535")
    from soul_apps.service.cors import ENV, check_origins, parse_env
    cors = check_origins(a.cors_origin) if a.cors_origin else parse_env(os.environ.get(ENV))
    from soul_apps.service import inspector as ui
    inspector = a.inspector if a.inspector is not None else ui.parse_env(os.environ.get(ui.ENV))
    if ctx.address is None and _listening(a.host, a.port):
        raise InvalidInput(f"port {a.port} on {a.host} is in use (another `soul serve`?); choose another --port")
    stop = threading.Event()
    why: list[str] = []

    def on_signal(signum: int, frame: Any) -> None:
        why.append(signal.Signals(signum).name)
        stop.set()
    with ctx.runtime() as rt:
        from soul_apps.service import serve_app
        host = "127.0.0.1" if a.host == "localhost" else a.host
        local = ctx.address is None
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, on_signal)
        t0 = time.perf_counter()
        with progress.working(ctx.err, "Starting Ray Serve and the service replicas" + progress.estimate("serve")):
            started = serve_app.start(rt.cfg.data_dir, rt.cfg.namespace, host, a.port, a.replicas, a.max_ongoing,
                                      replace=a.replace, storage=rt.cfg.storage, embedder=rt.cfg.embedder,
                                      ingress=a.ingress, cors_origins=cors, inspector=inspector)
            try:
                _wait_healthy(f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{a.port}/healthz", 300,
                              stop)
            except BaseException:
                serve_app.stop()  # nothing of a service that never answered is left on the runtime
                raise
        if not stop.is_set():
            progress.remember("serve", time.perf_counter() - t0)
        code = 0
        if not stop.is_set():
            ingress, ports = started.ingress, started.ports
            extra = f"; HAProxy's stats at :{ports['haproxy_stats']}/stats, its metrics at " \
                    f":{ports['haproxy_metrics']}/metrics" if {"haproxy_stats", "haproxy_metrics"} <= set(ports) else ""
            ctx.emit({"url": f"http://{host}:{a.port}", "replicas": a.replicas, "max_ongoing_requests": a.max_ongoing,
                      "ingress": ingress, "ports": ports, "cors_origins": list(cors), "inspector": inspector,
                      "start_seconds": round(time.perf_counter() - t0, 1)},
                     f"serving http://{host}:{a.port} (/v1, /mcp/, /openapi.json{', /ui/' if inspector else ''}; "
                     f"{a.replicas} replica(s), "
                     f"up to {a.max_ongoing} requests each, {ingress} ingress{extra}) in "
                     f"{time.perf_counter() - t0:.0f} s; Ctrl-C stops")
            import sys
            sys.stdout.flush()
            while not stop.wait(2.0):
                if local and not bg.running(ctx.data_dir):
                    ctx.err.print("soul: error: the local runtime went away (replaced after a code or model change, "
                                  "or `soul down`); the service stopped with it: start `soul serve` again")
                    code = 3
                    break
        if code == 0:
            with progress.working(ctx.err, "Draining requests in flight and stopping the service"):
                serve_app.stop()
            ctx.err.print(f"stopped ({why[0] if why else 'done'})")
    return code


def cmd_mcp(ctx: Ctx) -> int:
    import anyio

    from soul_apps.service.mcp_tools import build_mcp, fixed_resolver
    from soul_apps.service.souls_api import TenantSouls
    from soul_runtime.text import check_id
    a = ctx.args
    tenant = check_tenant(a.tenant) if a.tenant else None
    sid = check_id(a.soul, what="soul id")
    if tenant is not None:
        table = _table(ctx)
        if not table.get(tenant).active:
            raise InvalidInput(f"tenant '{tenant}' is revoked")
    with ctx.runtime() as rt:
        souls = TenantSouls(rt, tenant)
        souls.scope.soul(sid)  # the id is checked before the server starts
        server = build_mcp(fixed_resolver(souls, sid), ctx.data_dir, soul_optional=True)
        anyio.run(server.run_stdio_async)
    return 0


LIMIT_HELP = {"turns_per_s": "turns per second", "in_flight": "turns in progress at once", "souls": "souls",
              "stored_bytes": "bytes of its souls on disk", "tokens_per_day": "model tokens per UTC day"}


def register(add: Callable[..., argparse.ArgumentParser]) -> None:
    sp = add("tenants", cmd_tenants, "tenants of the HTTP service and their API keys",
             description="add NAME: a new tenant; its API key is the last word of the last line (shown once, "
             "stored hashed). list; revoke NAME: the key stops working, the souls stay; remove NAME --forget: "
             "the tenant and all its souls, deleted on disk. set NAME --turns-per-s … --weight …: its limits "
             "(over one, a turn is refused 429 QuotaExceeded before it begins); usage [NAME]: what each used.")
    sp.add_argument("action", choices=("add", "list", "revoke", "remove", "set", "usage"))
    sp.add_argument("name", nargs="?", help="tenant name: 1-32 of a-z, 0-9, '-'")
    sp.add_argument("--forget", action="store_true", help="remove: delete all the tenant's souls too")
    for flag, kind in LIMIT_FLAGS:
        sp.add_argument("--" + flag.replace("_", "-"), dest=flag, type=kind, metavar="N",
                        help=f"set: the tenant's {LIMIT_HELP[flag]} (0: no limit)" if flag != "weight" else
                        "set: the tenant's share of the hosts' threads and model slots while tenants wait for them "
                        "(default 1; 0: back to 1)")
    sp.add_argument("--default", action="store_true",
                    help="set: the limits of every tenant that sets none of its own (instead of a NAME)")
    sp = add("serve", cmd_serve, "serve the HTTP API and MCP on Ray Serve (foreground)", description=SERVE_HELP)
    sp.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sp.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    sp.add_argument("--replicas", type=int, default=1, help="service replicas (Ray actors, no CPU each; default 1)")
    sp.add_argument("--max-ongoing", type=int, default=1000,
                    help="requests one replica takes at once (default 1000)")
    sp.add_argument("--ingress", choices=INGRESSES, default="auto",
                    help="haproxy: Serve's HAProxy ingress, which passes each connection to a replica's own HTTP "
                         "server; proxy: Serve's Python proxy actor, which hands each request to a replica as Ray "
                         "calls (a hop that costs more CPU and latency); auto (default): haproxy when a binary is "
                         "found (ray[serve] brings one on Linux), else proxy")
    sp.add_argument("--cors-origin", action="append", metavar="URL",
                    help="let web pages of this origin (scheme://host[:port], or * for any) call the API from a "
                         "browser; repeat for more (env SOUL_CORS_ORIGINS, comma-separated; default: none, the "
                         "inspector at /ui/ is same-origin)")
    sp.add_argument("--inspector", action=argparse.BooleanOptionalAction, default=None,
                    help="serve the memory inspector's pages at /ui/ (default; env SOUL_INSPECTOR=on|off); with "
                         "--no-inspector /ui/ is a 404 and the other routes are unchanged")
    sp.add_argument("--replace", action="store_true",
                    help="stop the service another `soul serve` left on the runtime (one that was killed) first")
    sp = add("mcp", cmd_mcp, "serve one soul over MCP on stdio (for desktop agents)", description=MCP_HELP)
    sp.add_argument("--soul", required=True, help="the soul id")
    sp.add_argument("--tenant", help="the tenant whose soul it is (as in the HTTP API)")

