"""``soul bench fairness``: one tenant's flood against another tenant's few turns, on one node.

A fresh local runtime (Python API over Ray; the tenants' souls are ``A:…`` and ``B:…``, as the service names
them, and both are in the data dir's key table with weight 1). Tenant A keeps ``a_in_flight`` turns in flight
(that many souls, each sending its next turn when the last one answered), tenant B keeps ``b_in_flight`` (each of
its callers going round :data:`B_ROUND` souls). For each
model — ``offline`` (the built-in one, all CPU on the hosts' threads) and ``stand-in`` (the Anthropic adapter
against the Messages-API stand-in answering every call after ``delay_s``, under a model concurrency cap of
``model_cap`` calls on the node) — three phases of ``seconds`` each run twice, in mirrored order (B alone, A alone,
both; both, A alone, B alone), so the machine's drift weighs on each phase alike:

* **B alone**: B's latency p50/p99 and turns/s;
* **A alone**: A's turns/s, the node's capacity for A's turns;
* **both**: B's p50/p99 and turns/s, A's turns/s.

Targets it reports against: B's p50 and p99 with A at most 1.3× B alone; A's turns/s with B at least 0.9× what is left to
it, A alone's turns/s less B's turns/s with A. Every turn waits for its writes.

Each phase also records the machine's busy cores (``/proc/stat``; run it on an otherwise idle machine), and from
them the **fair-share bound** on B's latency beside A: with A flooding, a fair node gives B at most its weighted
share of the cores (half of them, both tenants at weight 1). B keeps ``b_in_flight`` turns in flight, so by
Little's law its mean latency is its turns in flight over its turns/s; if B alone kept more cores busy than its
share, no scheduler can keep B's latency beside A below ``B alone's busy cores / B's share`` times B alone's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from soul_apps.bench.scale import percentile
from soul_apps.bench.serve import MODEL_VARS, cleaned_up, use_model

Progress = Callable[[str], None]
PHASES = ("b_alone", "a_alone", "both", "both", "a_alone", "b_alone")
TEXT = "Note {n}: the quarterly report for account {soul} is due on the {day}th; Dana reviews it."
B_ROUND = 8
"""Souls each of B's callers goes round: B's souls grow about as fast as A's (a few turns in flight to one soul
each would make B's souls, and so its turns, many times larger than A's by the end), and few enough that they
all stay active beside A's (the soul hosts' ``host_capacity_mb``)."""
FLOOR_LATENCY = 1.3
FLOOR_A = 0.9


def busy_jiffies() -> tuple[int, int] | None:
    """(busy, all) clock ticks of every core since boot (``/proc/stat``); None where there is none."""
    try:
        with open("/proc/stat") as f:
            cells = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = cells[3] + (cells[4] if len(cells) > 4 else 0)  # idle and waiting for I/O
    return sum(cells) - idle, sum(cells)


def busy_cores(before: tuple[int, int] | None, after: tuple[int, int] | None, cpus: int) -> float | None:
    """How many of ``cpus`` cores were busy on average between two :func:`busy_jiffies` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]) * cpus, 3)


def fair_share_bound(b_alone_cores: float | None, cpus: int, share: float = 0.5) -> float | None:
    """The least ratio of B's mean latency beside a flood to B's alone that a fair scheduler can give: B alone
    kept ``b_alone_cores`` busy; beside the flood it gets at most ``share`` of ``cpus``. At least 1."""
    if b_alone_cores is None or cpus <= 0:
        return None
    return round(max(1.0, b_alone_cores / (share * cpus)), 3)


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


async def _phase(rt: Any, workers: dict[str, list[list[str]]], seconds: float, counter: list[int]
                 ) -> dict[str, Any]:
    """Every worker of ``workers`` (tenant -> each worker's souls) sends turns one after the other for ``seconds``,
    to its souls in turn: each tenant's latencies and turns/s (turns that began within the window; their end is
    waited for)."""
    lat: dict[str, list[float]] = {t: [] for t in workers}
    stop = time.perf_counter() + seconds

    async def one(tenant: str, ids: list[str]) -> None:
        k = 0
        while time.perf_counter() < stop:
            sid = ids[k % len(ids)]
            k += 1
            counter[0] += 1
            t0 = time.perf_counter()
            await rt.async_soul(sid).turn(TEXT.format(n=counter[0], soul=sid, day=counter[0] % 28 + 1))
            lat[tenant].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    await asyncio.gather(*(one(t, ids) for t, ws in workers.items() for ids in ws))
    wall = time.perf_counter() - t0
    return {t: {"turns": len(v), "turns_per_s": len(v) / wall, "latencies": v} for t, v in lat.items()}


def _summary(runs: list[dict[str, Any]], tenant: str) -> dict[str, Any]:
    lat = [x for r in runs for x in r[tenant]["latencies"]]
    return {"turns": len(lat), "turns_per_s": round(sum(r[tenant]["turns_per_s"] for r in runs) / len(runs), 2),
            "p50_s": round(percentile(lat, 50), 4), "p99_s": round(percentile(lat, 99), 4)}


async def _model_run(rt: Any, a: list[list[str]], b: list[list[str]], seconds: float, say: Progress
                     ) -> dict[str, Any]:
    counter = [0]
    every = [[s] for ws in (a, b) for ids in ws for s in ids]
    say(f"warming up {len(every)} souls")
    await _phase(rt, {"all": every}, 0.01, counter)  # one turn each: every soul active before the count
    got: dict[str, list[dict[str, Any]]] = {p: [] for p in PHASES}
    for i, phase in enumerate(PHASES):
        souls = {"b_alone": {"B": b}, "a_alone": {"A": a}, "both": {"A": a, "B": b}}[phase]
        load, jiffies = load_average(), busy_jiffies()
        r = await _phase(rt, souls, seconds, counter)
        r["load"], r["cores"] = load, busy_cores(jiffies, busy_jiffies(), os.cpu_count() or 1)
        got[phase].append(r)
        say(f"  phase {i + 1}/{len(PHASES)} {phase}: " + ", ".join(
            f"{t} {v['turns_per_s']:.1f} turns/s p50 {percentile(v['latencies'], 50) * 1000:.0f} ms"
            for t, v in r.items() if t not in ("load", "cores")) + f" (load {load}, {r['cores']} cores busy)")
    b_alone, b_with = _summary(got["b_alone"], "B"), _summary(got["both"], "B")
    a_alone, a_with = _summary(got["a_alone"], "A"), _summary(got["both"], "A")
    left = a_alone["turns_per_s"] - b_with["turns_per_s"]
    out = {"b_alone": b_alone, "b_with_a": b_with, "a_alone": a_alone, "a_with_b": a_with,
           "b_p50_ratio": round(b_with["p50_s"] / b_alone["p50_s"], 3),
           "b_p99_ratio": round(b_with["p99_s"] / b_alone["p99_s"], 3),
           "a_left_turns_per_s": round(left, 2), "a_share_of_left": round(a_with["turns_per_s"] / left, 3),
           "load_by_phase": [[p, got[p][PHASES[:i].count(p)]["load"]] for i, p in enumerate(PHASES)],
           "busy_cores_by_phase": [[p, got[p][PHASES[:i].count(p)]["cores"]] for i, p in enumerate(PHASES)]}
    cpus = os.cpu_count() or 1
    b_cores = [r["cores"] for r in got["b_alone"] if r["cores"] is not None]
    out["b_alone_busy_cores"] = round(sum(b_cores) / len(b_cores), 3) if b_cores else None
    out["b_fair_share_bound"] = fair_share_bound(out["b_alone_busy_cores"], cpus)
    for tenant, phase in (("A", "a_alone"), ("B", "b_alone")):  # the node's CPU a turn, each tenant alone
        turns = sum(r[tenant]["turns"] for r in got[phase])
        busy = sum((r["cores"] or 0.0) * r[tenant]["turns"] / r[tenant]["turns_per_s"]  # cores × the phase's wall
                   for r in got[phase] if r[tenant]["turns_per_s"])
        out[f"{tenant.lower()}_alone_cpu_ms_per_turn"] = round(busy / turns * 1000, 3) if turns else None
    out["floors_met"] = {"b_p50": out["b_p50_ratio"] <= FLOOR_LATENCY, "b_p99": out["b_p99_ratio"] <= FLOOR_LATENCY,
                         "a_turns_per_s": out["a_share_of_left"] >= FLOOR_A}
    return out


def run(*, models: Sequence[str] = ("offline", "stand-in"), seconds: float = 20.0, a_in_flight: int = 200,
        b_in_flight: int = 4, delay_s: float = 1.0, model_cap: int = 32, hosts: int = 2, host_steps: int = 0,
        embedder: str = "fast", progress: Progress | None = None) -> dict[str, Any]:
    for m in models:
        if m not in ("offline", "stand-in"):
            raise ValueError(f"models are offline and stand-in, got {m!r}")
    if model_cap % hosts:
        raise ValueError(f"model_cap ({model_cap}) must be a multiple of hosts ({hosts}): each host gets its share")
    say = progress or (lambda s: None)
    out: dict[str, Any] = {"a_in_flight": a_in_flight, "b_in_flight": b_in_flight, "seconds_per_phase": seconds,
                           "phases": list(PHASES), "hosts": hosts, "host_steps": host_steps, "model_cap": model_cap,
                           "delay_s": delay_s,
                           "cpus": os.cpu_count(), "load_before": load_average(), "models": {}}
    for model in models:
        say(f"model {model}")
        out["models"][model] = _one_model(model, seconds, a_in_flight, b_in_flight, delay_s, model_cap, hosts,
                                          host_steps, embedder, say)
    out["load_after"] = load_average()
    return out


def _one_model(model: str, seconds: float, a_n: int, b_n: int, delay_s: float, cap: int, hosts: int, steps: int,
               embedder: str, say: Progress) -> dict[str, Any]:
    from soul_apps.bench.model_standin import StandinProcess
    from soul_apps.cluster import local_runtime as bg
    data = tempfile.mkdtemp(prefix="sb-fair-", dir="/tmp")
    saved = {k: os.environ.get(k) for k in MODEL_VARS}
    api = StandinProcess(delay_s=delay_s) if model == "stand-in" else None
    try:
        with contextlib.ExitStack() as stack:
            use_model(api, stack)
            say("  starting a local runtime")
            address, _ = bg.attach(data)
            from actors.runtime import connect
            from soul_apps.service.tenants import TenantTable
            table = TenantTable(data, "local")
            for t in ("a", "b"):
                table.add(t)
            rt = connect(address, data_dir=data, embedder=embedder, hosts=hosts, host_steps=steps,
                         model_slots=cap // hosts if api is not None else 0)
            try:
                a = [[f"a:flood-{i}"] for i in range(a_n)]  # A: a soul per turn in flight
                b = [[f"b:few-{i}-{k}" for k in range(B_ROUND)] for i in range(b_n)]
                res = asyncio.run(_model_run(rt, a, b, seconds, say))
                from soul_apps.bench.scale import host_counters
                res["host_counters"] = {k: v for k, v in host_counters(rt).items() if k.startswith("tenant_")}
                res["host_threads"] = rt.cfg.host_threads
                res["model_slots_per_host"] = rt.cfg.model_slots
                if api is not None:
                    res["standin_calls"] = api.stats()["calls"]
                return res
            finally:
                rt.shutdown_actors()
                rt.close(flush=False)
                from actors import raycalls
                raycalls.shutdown()  # the next model's runtime is another head: this process joins it afresh
    finally:
        cleaned_up(saved, data)


def table(res: dict[str, Any]) -> Any:
    from rich.table import Table
    t = Table(title=f"soul bench fairness: A {res['a_in_flight']} in flight, B {res['b_in_flight']} "
                    f"(load {res['load_before']} -> {res['load_after']} on {res['cpus']} cores)", title_justify="left")
    for c in ("model", "B p50 alone", "B p50 with A", "x", "B p99 alone", "B p99 with A", "x", "fair bound",
              "A turns/s alone", "A with B", "left to A", "A/left"):
        t.add_column(c, justify="left" if c == "model" else "right")
    for m, r in res["models"].items():
        t.add_row(m, f"{r['b_alone']['p50_s'] * 1000:.0f} ms", f"{r['b_with_a']['p50_s'] * 1000:.0f} ms",
                  f"{r['b_p50_ratio']:.2f}", f"{r['b_alone']['p99_s'] * 1000:.0f} ms",
                  f"{r['b_with_a']['p99_s'] * 1000:.0f} ms", f"{r['b_p99_ratio']:.2f}",
                  "—" if r.get("b_fair_share_bound") is None else f"{r['b_fair_share_bound']:.2f}",
                  f"{r['a_alone']['turns_per_s']:.1f}", f"{r['a_with_b']['turns_per_s']:.1f}",
                  f"{r['a_left_turns_per_s']:.1f}", f"{r['a_share_of_left']:.2f}")
    return t


def plot(res: dict[str, Any], path: str | Path) -> None:
    from soul_apps.bench.plotting import pyplot
    plt = pyplot()
    models = list(res["models"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    width = 0.2
    for j, (label, key, q) in enumerate((("B alone p50", "b_alone", "p50_s"), ("B with A p50", "b_with_a", "p50_s"),
                                         ("B alone p99", "b_alone", "p99_s"), ("B with A p99", "b_with_a", "p99_s"))):
        ratios = [res["models"][m][key][q] / res["models"][m]["b_alone"][q] for m in models]
        ax.bar([i + (j - 1.5) * width for i in range(len(models))], ratios, width, label=label)
    ax.axhline(FLOOR_LATENCY, color="red", linestyle="--", linewidth=1, label=f"floor {FLOOR_LATENCY}x")
    bounds = [(i, res["models"][m].get("b_fair_share_bound")) for i, m in enumerate(models)]
    bounds = [(i, b) for i, b in bounds if b is not None]
    if bounds:
        ax.scatter([i for i, _ in bounds], [b for _, b in bounds], marker="_", s=900, color="black", zorder=3,
                   label="fair-share bound (B alone's busy cores / its share)")
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel("B's latency / B alone")
    ax.set_title("tenant B's latency, alone and beside A's flood")
    top = max([FLOOR_LATENCY] + [res["models"][m][k][q] / res["models"][m]["b_alone"][q] for m in models
                                 for k in ("b_with_a",) for q in ("p50_s", "p99_s")])
    ax.set_ylim(0, top * 1.45)  # room above the bars for the legend
    ax.legend(fontsize=7, loc="upper center", ncol=2)
    ax = axes[1]
    shares = [res["models"][m]["a_share_of_left"] for m in models]
    bars = ax.bar(range(len(models)), shares, 0.5, color="tab:orange", label="A with B / (A alone - B with A)")
    for bar, m in zip(bars, models, strict=True):
        r = res["models"][m]
        ax.annotate(f"{r['a_with_b']['turns_per_s']:.1f} of {r['a_left_turns_per_s']:.1f} turns/s",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.axhline(FLOOR_A, color="red", linestyle="--", linewidth=1, label=f"floor {FLOOR_A}x")
    ax.set_xticks(range(len(models)), models)
    ax.set_ylim(0, max(1.2, max(shares) + 0.2))
    ax.set_ylabel("A's turns/s beside B / what is left to A")
    ax.set_title("tenant A's throughput beside B")
    ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"A {res['a_in_flight']} turns in flight, B {res['b_in_flight']}; one node, {res['cpus']} cores "
                 f"(load {res['load_before']}); stand-in {res['delay_s']:g} s/call, cap {res['model_cap']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
