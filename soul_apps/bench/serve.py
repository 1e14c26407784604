"""``soul bench serve``: turns over the HTTP service beside the Python async API, in the same run.

One local runtime (a fresh data dir) and the service on Ray Serve on a free 127.0.0.1 port, as ``soul serve``
runs it. The runtime's model is ``model``: ``stand-in`` (the default), the real Anthropic adapter talking to the
Messages-API stand-in in a process of its own (:mod:`soul_apps.bench.model_standin`, every message kept), or
``offline``, the built-in model (no delays). For each stand-in delay (the instant stand-in, 0 s, and a slow model)
and each level M of concurrency: M clients, each with a soul of its own, send one warm-up turn (the soul's
activation, not counted, all warm-ups done first) and then ``turns`` turns one after the other (with an
instant model, more at low levels: at least ``min_turns`` a level), through

* the Python async API (``rt.async_soul(id).turn``), the baseline, and
* HTTP (``POST /v1/souls/{id}/turns`` with a tenant's key, M async HTTP clients of one connection each:
  ``http_client`` ``httpx`` or ``aiohttp``, or ``soul``, the project's Python client (``async_soul(id).turn``
  over HTTP); the callers run on the same cores as the service, and a lighter client leaves more of them to it).

With one client the paths' turns alternate one by one (latency under the same conditions); with more, each path
runs the level alone, one after the other, in two halves in mirrored order (throughput; each client's count of
turns rounded up to an even number). Reported: turns/s, client latency p50/p99, and the ratios HTTP / Python;
at a level of many clients, each path's machine CPU per turn and its split by kind of process. Beside them, at
the first delay, the same clients' ``GET /healthz`` (a route that does no work: what Serve's ingress and a
replica cost a request on this machine). A turn waits for its writes (with the stand-in, two model calls: the
reply and the memory decision) unless ``wait_writes`` is False. The service serves the inspector's pages at ``/ui/``
as ``soul serve`` does, unless ``inspector`` is False (``--no-inspector``: what the mount costs ``/v1``, if anything).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from soul_apps.bench import HTTP_CLIENTS
from soul_apps.bench.scale import host_counters, percentile

Progress = Callable[[str], None]
TEXTS = ("I moved the billing service to the new vendor last week, ticket {n}.",
         "The deadline for the weekly report is the {n}th.",
         "My manager asked for an update on the data pipeline by Friday ({n}).")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def per_client(clients: int, turns: int, min_turns: int) -> int:
    """Counted turns per client at a level: ``turns``, or more so the level counts at least ``min_turns`` (a p50
    of a few turns says little)."""
    return max(turns, -(-min_turns // clients))


async def _run(clients: int, ks: range, turn: Callable[[int, int], Awaitable[None]]) -> tuple[float, list[float]]:
    """Turns ``ks`` of every client (each client's one after the other, the clients at once): wall time and each
    turn's latency."""
    lat: list[float] = []

    async def one(i: int) -> None:
        for k in ks:
            t0 = time.perf_counter()
            await turn(i, k)
            lat.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(clients)))
    return time.perf_counter() - t0, lat


def machine_cpu_s() -> tuple[float, float] | None:
    """CPU seconds the whole machine spent busy, and seconds of all its cores, so far (``/proc/stat``: user, nice,
    system, irq and softirq are busy; idle and iowait are not; time stolen by a hypervisor is left out of both);
    None where there is no such file. Every process on the machine counts (the runtime, the service, the callers,
    the model stand-in, and anything else running)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:8]]
    except (OSError, ValueError):
        return None
    if len(fields) < 7:
        return None
    user, nice, system, idle, iowait, irq, softirq = fields
    busy = user + nice + system + irq + softirq
    tick = os.sysconf("SC_CLK_TCK")
    return busy / tick, (busy + idle + iowait) / tick


Snapshot = dict[int, tuple[int, str, float]]
"""pid -> (start time in clock ticks since boot, kind of process, CPU seconds so far)."""


def process_kind(cmdline: str, pid: int, me: int) -> str:
    """``callers`` (this process: the benchmark's Python API and HTTP clients), ``model stand-in``, a Ray worker's
    actor class (``SoulHost``, ``LayerShard``, ``ServeReplica``, ``ServeController``, ``IDLE``: the title without
    the method it runs or the deployment it serves), ``haproxy``, or ``other``."""
    if pid == me:
        return "callers"
    if "soul_apps.bench.model_standin" in cmdline:
        return "model stand-in"
    if cmdline.startswith("ray::"):
        return re.split(r"[.:\s]", cmdline[5:], maxsplit=1)[0] or "other"
    return "haproxy" if "haproxy" in cmdline.split(" ", 1)[0] else "other"


def process_snapshot() -> Snapshot:
    """Every process on the machine now (Linux; empty elsewhere): its start time, kind and CPU seconds."""
    if not os.path.isdir("/proc"):
        return {}
    me, tick, out = os.getpid(), os.sysconf("SC_CLK_TCK"), {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as fb:
                cmd = fb.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue
        out[int(d)] = (int(stat[19]), process_kind(cmd, int(d), me), (int(stat[11]) + int(stat[12])) / tick)
    return out


def cpu_delta_by_kind(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds each kind of process spent between two snapshots, counting the processes alive in both (the
    same pid and start time), each under its kind in ``before``. A process that started or ended in between is
    not counted here; its CPU is in the machine's total (see ``unattributed`` in :func:`_levels`)."""
    out: dict[str, float] = {}
    for pid, (start, _, cpu) in after.items():
        was = before.get(pid)
        if was is not None and was[0] == start:
            out[was[1]] = out.get(was[1], 0.0) + max(0.0, cpu - was[2])
    return out


BATCHES = (("turns_per_host_call", "turn_items", "turn_calls"),
           ("recall_items_per_shard_call", "shard_items:recall_batch", "shard_calls:recall_batch"),
           ("apply_items_per_shard_call", "shard_items:apply_batch", "shard_calls:apply_batch"))
"""How full the runtime's batches were: (figure, items counter, calls counter) of the soul hosts' counters."""


async def _levels(clients: int, turns: int, paths: dict[str, Callable[[int, int], Awaitable[None]]],
                  counters: Callable[[], dict[str, int]] | None = None) -> dict[str, dict[str, Any]]:
    """Throughput at ``clients``: every path's warm-up turn per client (the soul's activation, not counted), then
    ``turns`` turns per client of each path, the paths one at a time, in two halves run in mirrored order (A, B,
    B, A): a machine that speeds up or slows down during the level weighs on every path alike. A path's turns/s
    is its counted turns over the sum of its halves' wall times; ``machine_cpu_ms_per_turn`` the whole machine's
    busy CPU over its halves per counted turn (:func:`machine_cpu_s`), ``machine_busy`` that CPU over all cores'
    time (1.0: saturated), ``cpu_ms_per_turn`` the same per kind of process (:func:`cpu_delta_by_kind`) with
    ``unattributed``: the machine's busy CPU that no process alive through a half accounts for (processes that
    started or ended, the kernel's own work, the moments between the readings). An odd ``turns`` makes halves
    of unequal sizes: :func:`_all` asks for an even count. With ``counters`` (the soul hosts' summed counters,
    read before and after each half, off the event loop), ``batches``: items per call of the hosts' turn calls
    and of their calls to the store shards (:data:`BATCHES`); fuller batches cost the hosts and shards less CPU
    a turn."""
    for fn in paths.values():
        await asyncio.gather(*(fn(i, 0) for i in range(clients)))
    half = max(1, turns // 2)
    rounds = [range(1, half + 1), range(half + 1, turns + 1)]
    order = [(name, rounds[0]) for name in paths] + [(name, rounds[1]) for name in reversed(list(paths))]
    walls: dict[str, float] = {name: 0.0 for name in paths}
    lat: dict[str, list[float]] = {name: [] for name in paths}
    busy = {name: 0.0 for name in paths}  # the machine's busy CPU seconds, and all its cores' seconds
    cores = {name: 0.0 for name in paths}
    kinds: dict[str, dict[str, float]] = {name: {} for name in paths}
    counted: dict[str, dict[str, int]] = {name: {} for name in paths}
    for name, ks in order:
        if ks:
            n0 = await asyncio.to_thread(counters) if counters else {}
            p0 = process_snapshot()
            c0 = machine_cpu_s()
            wall, got = await _run(clients, ks, paths[name])
            c1 = machine_cpu_s()
            p1 = process_snapshot()
            if c0 is not None and c1 is not None:
                busy[name] += c1[0] - c0[0]
                cores[name] += c1[1] - c0[1]
            for kind, t in cpu_delta_by_kind(p0, p1).items():
                kinds[name][kind] = kinds[name].get(kind, 0.0) + t
            if counters:
                n1 = await asyncio.to_thread(counters)
                for key in {k for _, *pair in BATCHES for k in pair}:
                    counted[name][key] = counted[name].get(key, 0) + n1.get(key, 0) - n0.get(key, 0)
            walls[name] += wall
            lat[name] += got
    n = clients * turns
    out: dict[str, dict[str, Any]] = {}
    for name, v in lat.items():
        out[name] = {"clients": clients, "turns": n, "wall_s": round(walls[name], 3),
                     "turns_per_s": round(n / walls[name], 2), "p50_ms": round(1000 * percentile(v, 50), 2),
                     "p99_ms": round(1000 * percentile(v, 99), 2)}
        if cores[name] > 0:  # /proc/stat read, and at least a clock tick passed
            per_kind = {k: round(1000 * t / n, 2) for k, t in sorted(kinds[name].items(), key=lambda kv: -kv[1])
                        if t > 0}
            per_kind["unattributed"] = round(1000 * (busy[name] - sum(kinds[name].values())) / n, 2)
            out[name].update(machine_cpu_ms_per_turn=round(1000 * busy[name] / n, 2),
                             machine_busy=round(busy[name] / cores[name], 3), cpu_ms_per_turn=per_kind)
        if counters:
            got_n = counted[name]
            out[name]["batches"] = {fig: round(got_n[items] / got_n[calls], 2) if got_n.get(calls) else None
                                    for fig, items, calls in BATCHES}
    return out


async def _one_client(turns: int, paths: dict[str, Callable[[int, int], Awaitable[None]]]) -> dict[str, Any]:
    """One client: every path's warm-up turn, then turn k of each path in turn (so a path's turns meet the same
    machine and the same soul sizes as the others'), timed one by one; ``wall_s`` is the sum of a path's own turn
    times, and its turns/s comes from it."""
    for fn in paths.values():
        await fn(0, 0)
    lat: dict[str, list[float]] = {name: [] for name in paths}
    for k in range(1, turns + 1):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            await fn(0, k)
            lat[name].append(time.perf_counter() - t0)
    return {name: {"clients": 1, "turns": turns, "wall_s": round(sum(v), 3), "turns_per_s": round(turns / sum(v), 2),
                   "p50_ms": round(1000 * percentile(v, 50), 2), "p99_ms": round(1000 * percentile(v, 99), 2)}
            for name, v in lat.items()}


def run(*, levels: Sequence[int] = (1, 64, 300), turns: int = 3, delays: Sequence[float] = (0.0, 1.0),
        embedder: str = "fast", replicas: int = 1, model: str = "stand-in", wait_writes: bool = True,
        ingress: str = "auto", min_turns: int = 600, http_client: str = "httpx", inspector: bool = True,
        progress: Progress | None = None) -> dict[str, Any]:
    if model not in ("stand-in", "offline"):
        raise ValueError(f"model must be stand-in or offline, got {model!r}")
    if http_client not in HTTP_CLIENTS:
        raise ValueError(f"http_client must be one of {', '.join(HTTP_CLIENTS)}, got {http_client!r}")
    if turns < 1 or min_turns < 0:
        raise ValueError(f"turns must be >= 1 and min_turns >= 0, got {turns} and {min_turns}")
    say = progress or (lambda s: None)
    data = tempfile.mkdtemp(prefix="sb-serve-", dir="/tmp")
    saved = {k: os.environ.get(k) for k in MODEL_VARS}
    delays = list(delays) if model == "stand-in" else [0.0]
    out: dict[str, Any] = {"model": model, "wait_writes": wait_writes, "levels": list(levels),
                           "turns_per_client": turns, "min_turns_per_level": min_turns, "delays_s": delays,
                           "embedder": embedder, "replicas": replicas, "http_client": http_client,
                           "inspector": inspector, "rows": []}
    from soul_apps.bench.model_standin import StandinProcess
    from soul_apps.cluster import local_runtime as bg
    api = StandinProcess(delay_s=0.0) if model == "stand-in" else None
    try:
        with contextlib.ExitStack() as stack:
            if api is not None:
                say("starting the model stand-in")
            use_model(api, stack)
            say("starting a local runtime")
            address, _ = bg.attach(data)  # before Ray is imported: its auth settings come from here
            import httpx

            from actors.runtime import connect
            from soul_apps.service import serve_app
            from soul_apps.service.tenants import TenantTable
            rt = connect(address, data_dir=data, embedder=embedder)
            key = TenantTable(data).add("bench")
            port = _free_port()
            say("starting Ray Serve")
            t0 = time.perf_counter()
            out["ingress"] = serve_app.start(rt.cfg.data_dir, rt.cfg.namespace, "127.0.0.1", port, replicas,
                                             storage=rt.cfg.storage, embedder=rt.cfg.embedder,
                                             ingress=ingress, inspector=inspector).ingress
            base = f"http://127.0.0.1:{port}"
            last = "no answer"
            while True:
                try:
                    r = httpx.get(base + "/healthz", timeout=30)
                    if r.status_code == 200:
                        break
                    last = f"HTTP {r.status_code}: {r.text[:300]}"
                except httpx.HTTPError as e:
                    last = repr(e)
                if time.perf_counter() - t0 > 300:
                    raise RuntimeError(f"the service did not become healthy within 300 s ({last})")
                time.sleep(0.5)
            out["serve_start_s"] = round(time.perf_counter() - t0, 1)
            out["hosts"] = rt.cfg.hosts
            out["host_threads"] = rt.cfg.host_threads
            try:
                asyncio.run(_all(rt, base, key, levels, turns, delays, api, out, say, wait_writes, min_turns,
                                 http_client))
            finally:
                serve_app.stop()
                rt.shutdown_actors()
                rt.close(flush=False)
    finally:
        cleaned_up(saved, data)
    return out


MODEL_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "SOUL_MODEL")
"""The environment variables :func:`use_model` sets (a benchmark saves them first, :func:`cleaned_up` restores them)."""


def use_model(api: Any, stack: contextlib.ExitStack) -> None:
    """The model a benchmark's local runtime takes, in this process's environment (before the runtime starts): the
    Anthropic adapter against the stand-in ``api`` (started here, stopped when ``stack`` closes), or the offline
    model (``api`` None)."""
    if api is not None:
        api.start()
        stack.callback(api.stop)
        os.environ.update(ANTHROPIC_API_KEY="bench-key", ANTHROPIC_BASE_URL=api.base_url, SOUL_MODEL="anthropic")
    else:
        os.environ["SOUL_MODEL"] = "offline"


def cleaned_up(saved: dict[str, str | None], data: str) -> None:
    """After a benchmark's local runtime: the environment variables it set back as ``saved``, the runtime of the
    data dir ``data`` stopped and the dir deleted."""
    from soul_apps.cluster import local_runtime as bg
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    bg.stop(data)
    shutil.rmtree(data, ignore_errors=True)


Send = Callable[[str, str, Any], Awaitable[None]]
"""``send(method, path, json_body)``: one request of a caller; an answer other than 200 raises."""


async def _caller(stack: contextlib.AsyncExitStack, kind: str, base: str, key: str) -> Send:
    """One caller's HTTP client with one connection, as separate callers have: one shared client's pool costs the
    caller CPU per request that grows with the pool (httpx: 8.6 ms against 1.1 ms a request at 64)."""
    headers = {"Authorization": f"Bearer {key}"}
    if kind == "soul":  # the Python API over HTTP: a turn is the async handle's turn()
        from soul_runtime.http_client import HttpRuntime
        rt = HttpRuntime(base, key, max_connections=1)
        stack.push_async_callback(rt.aclose)

        async def send_soul(method: str, path: str, body: Any) -> None:
            parts = path.split("/")  # /v1/souls/{id}/turns
            if method == "POST" and parts[-1] == "turns":
                await rt.async_soul(parts[3]).turn(body["text"], wait_writes=body["wait_writes"])
                return
            r = await rt.async_sender().client.request(method, path, json=body)
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        return send_soul
    if kind == "aiohttp":
        import aiohttp
        session = await stack.enter_async_context(aiohttp.ClientSession(
            base, headers=headers, timeout=aiohttp.ClientTimeout(total=600), connector=aiohttp.TCPConnector(limit=1)))

        async def send_aiohttp(method: str, path: str, body: Any) -> None:
            async with session.request(method, path, json=body) as r:
                text = await r.text()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {text[:200]}")
        return send_aiohttp
    import httpx
    client = await stack.enter_async_context(httpx.AsyncClient(
        base_url=base, headers=headers, timeout=600, limits=httpx.Limits(max_connections=1, max_keepalive_connections=1)))

    async def send_httpx(method: str, path: str, body: Any) -> None:
        r = await client.request(method, path, json=body)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
    return send_httpx


async def _all(rt: Any, base: str, key: str, levels: Sequence[int], turns: int, delays: Sequence[float],
               api: Any, out: dict[str, Any], say: Progress, wait_writes: bool = True, min_turns: int = 0,
               http_client: str = "httpx") -> None:
    async with contextlib.AsyncExitStack() as stack:
        https = [await _caller(stack, http_client, base, key) for _ in range(max(levels))]
        models: set[str] = set()
        for d in delays:
            if api is not None:
                api.set_delay(d)
            for m in levels:
                tag = f"d{int(d * 1000)}-m{m}"

                async def py(i: int, k: int, tag: str = tag) -> None:
                    res = await rt.async_soul(f"py-{tag}-{i}").turn(TEXTS[k % 3].format(n=k), wait_writes=wait_writes)
                    models.add(res.model)

                async def web(i: int, k: int, tag: str = tag) -> None:
                    await https[i]("POST", f"/v1/souls/web-{tag}-{i}/turns",
                                   {"text": TEXTS[k % 3].format(n=k), "wait_writes": wait_writes})

                async def health(i: int, k: int) -> None:
                    await https[i]("GET", "/healthz", None)
                row: dict[str, Any] = {"delay_s": d, "clients": m}
                calls = (("python", py), ("http", web)) + ((("healthz", health),) if d == delays[0] else ())
                n = per_client(m, turns, min_turns if d == 0 else 0)
                n += n % 2 if m > 1 else 0  # two halves of the same size
                if m == 1:  # latency: the paths' turns alternate
                    say(f"{d:g} s stand-in, 1 client, {' / '.join(name for name, _ in calls)} alternately")
                    row.update(await _one_client(n, dict(calls)))
                else:  # throughput: each path runs the level alone, in mirrored halves
                    say(f"{d:g} s stand-in, {m} clients, {' / '.join(name for name, _ in calls)} "
                        f"(then in reverse order)")
                    row.update(await _levels(m, n, dict(calls), counters=lambda: host_counters(rt)))
                p, h = row["python"], row["http"]
                row["http_vs_python_turns_per_s"] = round(h["turns_per_s"] / p["turns_per_s"], 3) \
                    if p["turns_per_s"] and h["turns_per_s"] else None
                row["http_minus_python_p50_ms"] = round(h["p50_ms"] - p["p50_ms"], 2)
                if "machine_cpu_ms_per_turn" in p and "machine_cpu_ms_per_turn" in h:
                    row["http_minus_python_cpu_ms_per_turn"] = round(h["machine_cpu_ms_per_turn"]
                                                                     - p["machine_cpu_ms_per_turn"], 2)
                out["rows"].append(row)
        out["models"] = sorted(models)
    instant = {r["clients"]: r["http"]["turns_per_s"] for r in out["rows"] if r["delay_s"] == 0}
    for r in out["rows"]:
        if r["delay_s"] and instant.get(r["clients"]) and r["http"]["turns_per_s"]:
            r["http_vs_instant_http_turns_per_s"] = round(r["http"]["turns_per_s"] / instant[r["clients"]], 3)


def table(res: dict[str, Any]) -> Any:
    from rich.table import Table
    t = Table(title=f"HTTP service vs Python async API ({res.get('model', 'stand-in')} model, wait_writes="
                    f"{res.get('wait_writes', True)}, same run; "
                    f"counted turns of each path after a warm-up turn per client; {res['replicas']} replica(s), "
                    f"{res['hosts']} hosts, {res.get('ingress', 'proxy')} ingress, "
                    f"{res.get('http_client', 'httpx')} callers"
                    f"{'' if res.get('inspector', True) else ', no inspector'})")
    for c in ("stand-in", "clients", "turns", "python turns/s", "http turns/s", "http/python", "python p50/p99 ms",
              "http p50/p99 ms", "http - python p50 ms", "machine CPU ms/turn (busy) python / http",
              "/healthz req/s, p50 ms"):
        t.add_column(c, justify="right")
    for r in res["rows"]:
        p, h, z = r["python"], r["http"], r.get("healthz")
        t.add_row(f"{r['delay_s']:g} s", str(r["clients"]), str(p["turns"]), str(p["turns_per_s"]), str(h["turns_per_s"]),
                  f"{r['http_vs_python_turns_per_s']}x", f"{p['p50_ms']} / {p['p99_ms']}",
                  f"{h['p50_ms']} / {h['p99_ms']}", str(r["http_minus_python_p50_ms"]), _cpu(p, h),
                  f"{z['turns_per_s']}, {z['p50_ms']}" if z else "—")
    return t


def _cpu(*paths: dict[str, Any]) -> str:
    if not all("machine_cpu_ms_per_turn" in p for p in paths):
        return "—"
    return " / ".join(f"{p['machine_cpu_ms_per_turn']} ({p['machine_busy']:.0%})" for p in paths)
