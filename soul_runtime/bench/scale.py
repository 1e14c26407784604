"""``soul bench scale``: many souls on one node, through the public API.

N souls are created and each given a first turn (the cold path: activation, empty stores opened, first
writes), then turns go to souls in rotation with M in flight from M client coroutines (the async handle), for
each level M asked for. Everything runs on the offline model; the embedder is the default (MiniLM) or the
fast hashing one. Reported per phase: turns/s, turn latency p50/p99 at the client, and the runtime's overhead
per turn — client latency minus the model time the trace records (inference + persistence decision +
extraction) minus the embedder time (two texts a turn, timed on this machine beforehand) — plus activations,
passivations, open fds and RSS of every process of the local Ray, and disk per soul. The baseline in the same
run: the same engine in process, no Ray, one thread, with where its turn time goes.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Progress = Callable[[str, int, int], None]

# ordinary things people tell an assistant; {n} keeps the texts of different souls and turns apart
_SUBJECTS = ["the billing service", "our staging cluster", "my laptop", "the weekly report", "the mobile app",
             "the data pipeline", "my sister's wedding", "the kitchen renovation", "the book club", "the tax return"]
_TEMPLATES = [
    "I finished {s} today, it took about {n} hours.",
    "Remind me what we decided about {s}?",
    "We moved {s} to the new vendor last week, ticket {n}.",
    "The deadline for {s} is the {d}th.",
    "Thanks, that helps with {s}.",
    "My manager asked for an update on {s} by Friday.",
    "Can you summarise where {s} stands?",
    "I think {s} needs another {n} days of work.",
]


def utterance(rng: random.Random) -> str:
    return rng.choice(_TEMPLATES).format(s=rng.choice(_SUBJECTS), n=rng.randint(2, 999), d=rng.randint(1, 28))


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def embed_ms_per_text(embedder: str, rng: random.Random, n: int = 64) -> float:
    """What one text costs the embedder, one at a time, measured here (it is taken out of the overhead)."""
    from soul_runtime.embedding.choice import make_embedder
    e = make_embedder(embedder)
    texts = [utterance(rng) for _ in range(n)]
    e.embed(texts[:4])  # load the model
    t0 = time.perf_counter()
    for t in texts:
        e.embed([t])
    return (time.perf_counter() - t0) * 1000 / n


# ---- the processes of the local Ray -----------------------------------------------------------


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(d))
    return kids


def process_table(root: int | None = None) -> list[dict[str, Any]]:
    """Every process below ``root`` (this process: the local Ray it started): pid, name, RSS, open fds, CPU
    seconds so far (user + system)."""
    root = root or os.getpid()
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        if pid == root:
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
        out.append({"pid": pid, "name": cmd.split(" ")[0][:60], "rss_bytes": rss, "open_fds": fds, "cpu_s": cpu})
    return out


def _kind(name: str) -> str:
    return name.removeprefix("ray::") if name.startswith("ray::") else "Ray's own processes"


def cpu_per_turn(before: list[dict[str, Any]], after: list[dict[str, Any]], turns: int, client_s: float
                 ) -> dict[str, float]:
    """Milliseconds of CPU per turn between two :func:`process_table` snapshots, per kind of process (soul hosts,
    store shards, ...), with ``client_s`` CPU seconds of this process, and their total."""
    was = {p["pid"]: p["cpu_s"] for p in before}
    out: dict[str, float] = {"client": client_s}
    for p in after:
        if p["pid"] in was:
            k = _kind(p["name"])
            out[k] = out.get(k, 0.0) + p["cpu_s"] - was[p["pid"]]
    out["total"] = sum(out.values())
    return {k: round(v * 1000 / max(1, turns), 2) for k, v in out.items()}


def closed_soul_bytes(path: Path) -> list[int]:
    """Bytes on disk of each passivated soul (no store of it open: no ``-wal``/``-shm`` file in its directory)."""
    out = []
    root = path / "souls"
    for d in root.iterdir() if root.exists() else ():
        files = [f for f in d.iterdir() if f.is_file()]
        if files and not any(f.name.endswith(("-wal", "-shm")) for f in files):
            out.append(sum(f.stat().st_size for f in files))
    return out


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ---- the run ------------------------------------------------------------------------------------


async def _drive(rt: Any, jobs: list[tuple[str, str]], active: int, latencies: list[float], results: list[Any],
                 progress: Progress | None, label: str, at0: float) -> float:
    """Run ``jobs`` (soul id, text) with ``active`` in flight; returns the wall time."""
    queue: asyncio.Queue[tuple[int, str, str]] = asyncio.Queue()
    for i, (sid, text) in enumerate(jobs):
        queue.put_nowait((i, sid, text))
    done = 0

    async def client() -> None:
        nonlocal done
        while True:
            try:
                i, sid, text = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            t0 = time.perf_counter()
            r = await rt.async_soul(sid).turn(text, user="user", at=at0 + i)
            latencies.append((time.perf_counter() - t0) * 1000)
            results.append((sid, r.turn_id, latencies[-1]))
            done += 1
            if progress and done % 10 == 0:
                progress(label, done, len(jobs))

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(max(1, active))))
    if progress:
        progress(label, len(jobs), len(jobs))
    return time.perf_counter() - t0


def in_process(embedder: str, rng: random.Random, souls: int = 20, turns: int = 10) -> dict[str, Any]:
    """The baseline beside the runtime: the same engine in this process, no Ray, one thread (``souls`` souls
    × ``turns`` turns in rotation); where a turn's time goes, from its trace."""
    import shutil

    from soul_runtime.embedding.choice import make_embedder
    from soul_runtime.loop.soul import Soul
    from soul_runtime.memory.soul_memory import SoulMemory
    from soul_runtime.models.offline import OfflineModel

    root = Path(tempfile.mkdtemp(prefix="soul-bench-inproc-"))
    emb, model = make_embedder(embedder), OfflineModel()
    pairs = [(SoulMemory(root / f"s{i}", embedder=emb), i) for i in range(souls)]
    live = [(m, Soul(f"s{i}", root / f"s{i}", memory=m, model=model)) for m, i in pairs]
    lat: list[float] = []
    parts: dict[str, list[float]] = {}
    t_all = time.perf_counter()
    for k in range(souls * turns):
        _, soul = live[k % souls]
        t0 = time.perf_counter()
        r = soul.turn(utterance(rng), user="user", at=1_780_000_000.0 + k)
        lat.append((time.perf_counter() - t0) * 1000)
        for name, ms in soul.trace(r.turn_id).timings_ms.items():
            parts.setdefault(name, []).append(ms)
    wall = time.perf_counter() - t_all
    for m, soul in live:
        soul.close()
        m.close()
    shutil.rmtree(root, ignore_errors=True)
    out = _phase("in process, no Ray, 1 thread", 1, wall, lat, [])
    out["timings_p50_ms"] = {k: round(percentile(v, 50), 2) for k, v in sorted(parts.items())}
    return out


def _per_turn(before: dict[str, int], after: dict[str, int], turns: int,
              names: tuple[tuple[str, str], ...]) -> dict[str, float]:
    return {m: round((after.get(c, 0) - before.get(c, 0)) / max(1, turns), 3) for m, c in names}


def _host_counters(rt: Any) -> dict[str, int]:
    from actors import raycalls
    from actors.controller import host_name
    total: dict[str, int] = {}
    for i in range(rt.cfg.hosts):
        h = raycalls.get_actor(host_name(i), rt.cfg.namespace)
        if h is not None:
            for k, v in raycalls.get(raycalls.call(h, "metrics_snapshot"), timeout=60).items():
                total[k] = total.get(k, 0) + int(v)
    return total


async def _overheads(rt: Any, sample: list[tuple[str, str, float]], embed_ms: float) -> list[float]:
    out = []
    for sid, turn_id, latency in sample:
        tr = await rt.async_soul(sid).trace(turn_id)
        t = tr.timings_ms
        model = t.get("inference", 0.0) + t.get("persist_decision", 0.0) + t.get("extract", 0.0)
        out.append(max(0.0, latency - model - 2 * embed_ms))
    return out


def _phase(name: str, active: int, wall: float, lat: list[float], over: list[float]) -> dict[str, Any]:
    return {"phase": name, "active": active, "turns": len(lat), "seconds": round(wall, 3),
            "turns_per_s": round(len(lat) / wall, 2) if wall else 0.0,
            "turn_p50_ms": round(percentile(lat, 50), 2), "turn_p99_ms": round(percentile(lat, 99), 2),
            "overhead_p50_ms": round(percentile(over, 50), 2) if over else None}


def run(*, souls: int, active: Sequence[int], turns: int = 2, embedder: str = "fast", data_dir: str | None = None,
        host_capacity: int | None = None, store_capacity: int | None = None, seed: int = 7,
        overhead_sample: int = 200, reactivate: int = 0, local_channels: bool = True,
        progress: Progress | None = None) -> dict[str, Any]:
    """Run the benchmark on a fresh embedded runtime; returns the results (JSON-ready). ``local_channels=False``:
    every call through Ray (the runtime before its local channels, for comparison)."""
    import soul_runtime

    if souls < 1 or not active or min(active) < 1 or turns < 0 or reactivate < 0:
        raise soul_runtime.InvalidInput("souls and active must be positive, turns and reactivate >= 0")
    rng = random.Random(seed)
    embed_ms = embed_ms_per_text(embedder, rng)
    own_dir = data_dir is None
    path = Path(data_dir or tempfile.mkdtemp(prefix="soul-bench-scale-"))
    opts: dict[str, Any] = {"embedder": embedder, "model": "offline", "local_channels": local_channels}
    if host_capacity:
        opts["host_capacity"] = host_capacity
    if store_capacity:
        opts["store_capacity"] = store_capacity
    baseline = in_process(embedder, rng)
    ids = [f"bench-{i:06d}" for i in range(souls)]
    at0 = 1_780_000_000.0
    phases: list[dict[str, Any]] = [baseline]
    started = time.perf_counter()
    with soul_runtime.connect(data_dir=str(path), **opts) as rt:
        start_s = time.perf_counter() - started
        # phase 1: every soul's first turn (activation + first writes)
        lat: list[float] = []
        res: list[Any] = []
        wall = asyncio.run(_drive(rt, [(sid, utterance(rng)) for sid in ids], max(active), lat, res, progress,
                                  "first turns", at0))
        over = asyncio.run(_overheads(rt, rng.sample(res, min(overhead_sample, len(res))), embed_ms))
        first = _phase("first turns", max(active), wall, lat, over)
        first["activations_per_s"] = first["turns_per_s"]
        phases.append(first)
        # phase 2: turns in rotation at each level of concurrency
        for level in sorted(set(active)) if turns else ():
            jobs = [(ids[(k * 7919) % souls], utterance(rng)) for k in range(souls * turns)]
            lat, res = [], []
            procs0, host0, cpu0 = process_table(), _host_counters(rt), time.process_time()
            wall = asyncio.run(_drive(rt, jobs, level, lat, res, progress, f"{level} in flight", at0 + 1e5 * level))
            cpu = cpu_per_turn(procs0, process_table(), len(jobs), time.process_time() - cpu0)
            host1 = _host_counters(rt)
            over = asyncio.run(_overheads(rt, rng.sample(res, min(overhead_sample, len(res))), embed_ms))
            phase = _phase("turns", level, wall, lat, over)
            phase["cpu_ms_per_turn"] = cpu
            # every call a turn makes, and of those the ones that went over a local channel instead of Ray
            phase["calls_per_turn"] = _per_turn(host0, host1, len(jobs), (
                ("run_batch", "turn_calls"), ("recall_batch", "shard_calls:recall_batch"),
                ("apply_batch", "shard_calls:apply_batch")))
            phase["channel_calls_per_turn"] = _per_turn(host0, host1, len(jobs), (
                ("run_batch", "channel_calls"), ("recall_batch", "shard_channel_calls:recall_batch"),
                ("apply_batch", "shard_channel_calls:apply_batch")))
            phases.append(phase)
        if reactivate:  # phase 3: the next turn of souls picked at random, one at a time (most are passivated)
            before = _host_counters(rt)
            picked = rng.sample(ids, min(reactivate, souls))
            lat, res = [], []
            wall = asyncio.run(_drive(rt, [(sid, utterance(rng)) for sid in picked], 1, lat, res, progress,
                                      "reactivations", at0 + 1e7))
            after = _host_counters(rt)
            react = _phase("next turn of a random soul", 1, wall, lat, [])
            react["activations"] = after.get("activations", 0) - before.get("activations", 0)
            phases.append(react)
        counters = _host_counters(rt)
        procs = process_table()
        disk = dir_bytes(path)
        closed = closed_soul_bytes(path)
        stats = rt.stats()
    if own_dir:
        import shutil
        shutil.rmtree(path, ignore_errors=True)
    steady = [p for p in phases if p["phase"] == "turns"] or [first]
    best = max(steady, key=lambda p: p["active"])
    react_phase = next((p for p in phases if p["phase"].startswith("next turn")), None)
    return {
        "souls": souls, "active": sorted(set(active)), "turns_per_soul": turns, "embedder": embedder, "local_channels": local_channels,
        "embed_ms_per_text": round(embed_ms, 3), "runtime_start_s": round(start_s, 2),
        "turns_per_s": best["turns_per_s"], "turn_p50_ms": best["turn_p50_ms"], "turn_p99_ms": best["turn_p99_ms"],
        "overhead_p50_ms": best["overhead_p50_ms"],
        "first_turns_per_s": first["turns_per_s"], "activations_per_s": first["activations_per_s"],
        "reactivation_p50_ms": react_phase["turn_p50_ms"] if react_phase else None,
        "reactivation_p99_ms": react_phase["turn_p99_ms"] if react_phase else None,
        "reactivated": react_phase["activations"] if react_phase else None,
        "activations": counters.get("activations", 0), "passivations": counters.get("passivations", 0),
        "shard_calls": {m: counters.get(f"shard_calls:{m}", 0) for m in ("recall_batch", "apply_batch")},
        "shard_items_per_call": {m: round(counters.get(f"shard_items:{m}", 0) / counters[f"shard_calls:{m}"], 2)
                                 for m in ("recall_batch", "apply_batch") if counters.get(f"shard_calls:{m}")},
        "turns_per_host_call": round(counters.get("turn_items", 0) / counters["turn_calls"], 2)
        if counters.get("turn_calls") else None,
        "cpu_ms_per_turn": best.get("cpu_ms_per_turn"),
        "active_at_end": stats.get("active"),
        "cluster_rss_bytes": sum(p["rss_bytes"] for p in procs), "max_open_fds": max((p["open_fds"] for p in procs),
                                                                                    default=0),
        "in_process_turns_per_s": baseline["turns_per_s"], "in_process_timings_p50_ms": baseline["timings_p50_ms"],
        "processes": procs, "disk_bytes_per_soul": disk // souls, "disk_bytes": disk, "phases": phases,
        "closed_souls": len(closed), "disk_bytes_per_closed_soul_p50": int(percentile(closed, 50)) if closed else None,
        "disk_bytes_per_closed_soul_max": max(closed) if closed else None,
        "overhead_method": "client latency - trace model time (inference + persist_decision + extract) "
                           "- 2 x embed_ms_per_text",
        "machine": {"cpus": os.cpu_count()},
    }


def plot(res: dict[str, Any], path: str) -> None:
    from soul_runtime.bench.plotting import pyplot
    plt = pyplot()

    steady = [p for p in res["phases"] if p["phase"] == "turns"]
    xs = [p["active"] for p in steady]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(xs, [p["turns_per_s"] for p in steady], "o-")
    a.set_xlabel("turns in flight")
    a.set_ylabel("turns/s")
    a.set_title(f"throughput, {res['souls']} souls, {res['embedder']} embedder")
    b.plot(xs, [p["turn_p50_ms"] for p in steady], "o-", label="p50")
    b.plot(xs, [p["turn_p99_ms"] for p in steady], "s--", label="p99")
    b.plot(xs, [p["overhead_p50_ms"] or 0 for p in steady], "^:", label="overhead p50")
    b.set_xlabel("turns in flight")
    b.set_ylabel("ms")
    b.set_title("turn latency at the client")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_rows(res: dict[str, Any]) -> list[list[str]]:
    return [[p["phase"], str(p["active"]), str(p["turns"]), f"{p['turns_per_s']:.1f}", f"{p['turn_p50_ms']:.0f}",
             f"{p['turn_p99_ms']:.0f}", "—" if p["overhead_p50_ms"] is None else f"{p['overhead_p50_ms']:.1f}"]
            for p in res["phases"]]

