"""``soul bench scale``: many souls on one node, through the public API.

N souls are created and each given a first turn (the cold path: activation, empty stores opened, first
writes), then turns go to souls in rotation with M in flight from M client coroutines (the async handle), for
each level M asked for. The embedder is the default (MiniLM) or the fast hashing one. The model is

* ``offline`` (the default): the rule-based model in every host; a phase is ``turns`` turns per soul;
* ``stand-in``: the real Anthropic adapter (the ``anthropic`` SDK over HTTP) against the Messages-API stand-in
  (:mod:`soul_apps.bench.model_standin`) in a process of its own, which answers every call after a delay.
  Each level runs once on the instant stand-in (0 s, the baseline) and once per delay asked for, with the
  same warm souls (the delay is changed over the stand-in's control route, the runtime stays up); a phase is
  ``turns`` turns per turn in flight (at least 8 in flight's worth), so a slow model at 1 in flight stays short.

Turns wait for their writes or not (``wait_writes``; both: each level twice). Reported per phase: turns/s, turn
latency p50/p99 at the client, errors by type (a failed turn is counted, never stops the run), and the runtime's
overhead per turn — client latency minus the model time the trace records (inference, plus the persistence
decision and extraction when the turn waited for them) minus the embedder time (two texts a turn, timed on this
machine beforehand) — plus threads and RSS of every process of the local Ray at their peak in the phase, the
open TCP connections to the model stand-in, its calls per turn, and for a delayed phase its turns/s as a share
of the instant stand-in's at the same level. At the end: activations, passivations, open fds and RSS of every
process, disk per soul. The baseline in the same run: the same engine in process on the offline model, no Ray,
one thread, with where its turn time goes.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from soul_apps.bench import fsyncs
from soul_runtime.memory.postgres_db import is_postgres, redacted

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


def process_info(pid: int) -> dict[str, Any] | None:
    """One process: pid, name, RSS, threads, open fds, CPU seconds so far (user + system); None if it is gone."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    threads = next((int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("Threads:")), 0)
    cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    return {"pid": pid, "name": cmd.split(" ")[0][:60], "rss_bytes": rss, "threads": threads, "open_fds": fds,
            "cpu_s": cpu}


def process_table(root: int | None = None, exclude: Collection[int] = ()) -> list[dict[str, Any]]:
    """Every process below ``root`` (this process: the local Ray it started) but those in ``exclude`` (and
    theirs): pid, name, RSS, threads, open fds, CPU seconds so far (user + system)."""
    root = root or os.getpid()
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        if pid in exclude:
            continue
        todo += kids.get(pid, [])
        if pid == root:
            continue
        info = process_info(pid)
        if info is not None:
            out.append(info)
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

MODELS = ("offline", "stand-in")
MIN_PHASE_CLIENTS = 8
"""With a stand-in model a phase is ``turns`` turns per turn in flight, and at least this many in flight's worth."""


async def _drive(rt: Any, jobs: list[tuple[str, str]], active: int, latencies: list[float], results: list[Any],
                 progress: Progress | None, label: str, at0: float, *, wait_writes: bool = True,
                 errors: dict[str, int] | None = None, examples: dict[str, str] | None = None) -> float:
    """Run ``jobs`` (soul id, text) with ``active`` in flight; returns the wall time. A failed turn is counted in
    ``errors`` by its type's name (its first message in ``examples``) and the run goes on; without ``errors``
    it is raised."""
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
            try:
                r = await rt.async_soul(sid).turn(text, user="user", at=at0 + i, wait_writes=wait_writes)
            except Exception as e:  # noqa: BLE001 — counted by type; one failed turn must not end the run
                if errors is None:
                    raise
                name = type(e).__name__
                errors[name] = errors.get(name, 0) + 1
                if examples is not None:
                    examples.setdefault(name, str(e)[:300])
            else:
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


class Sampler:
    """Samples the local Ray's processes (threads, RSS) and the connections to the model stand-in every
    ``every_s`` seconds on a thread of its own while a phase runs, and keeps each one's peak. With ``done``
    (how much work is done so far), also each sample's RSS per process beside it: :attr:`timeline`."""

    def __init__(self, every_s: float = 1.0, standin: Any = None, done: Callable[[], int] | None = None) -> None:
        self.every_s = every_s
        self.standin = standin
        self.done = done
        self.exclude = (standin.pid,) if standin is not None else ()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reset()

    def reset(self) -> None:
        self.peak: dict[int, dict[str, Any]] = {}
        self.threads_max = self.rss_max = self.conns_max = self.samples = 0
        self.cpu_s = 0.0  # this process's CPU spent sampling (taken out of the client's CPU per turn)
        self.timeline: list[dict[str, Any]] = []
        self.loads: list[float] = []  # the machine's 1-min load average at each sample (the box may be shared)
        self._t0 = time.perf_counter()

    def sample(self) -> None:
        t0 = time.thread_time()
        procs = process_table(exclude=self.exclude)
        me = process_info(os.getpid())
        if me is not None:
            procs.append({**me, "name": "client (this process)"})
        conns: dict[int, int] = {}
        if self.standin is not None:
            from soul_apps.bench.model_standin import connections_by_pid
            self.conns_max = max(self.conns_max, self.standin.connections())
            conns = connections_by_pid(self.standin.port, [p["pid"] for p in procs])
        for p in procs:
            q = self.peak.setdefault(p["pid"], {"pid": p["pid"], "name": p["name"], "threads_max": 0,
                                                "rss_bytes_max": 0, "model_connections_max": 0})
            q["threads_max"] = max(q["threads_max"], p["threads"])
            q["rss_bytes_max"] = max(q["rss_bytes_max"], p["rss_bytes"])
            q["model_connections_max"] = max(q["model_connections_max"], conns.get(p["pid"], 0))
        if self.done is not None:
            self.timeline.append({"s": round(time.perf_counter() - self._t0, 1), "done": self.done(),
                                  "rss_mib": {f"{p['name']} {p['pid']}": round(p["rss_bytes"] / 2**20, 1)
                                              for p in procs}})
        self.loads.append(round(os.getloadavg()[0], 2))
        self.threads_max = max(self.threads_max, sum(p["threads"] for p in procs))
        self.rss_max = max(self.rss_max, sum(p["rss_bytes"] for p in procs))
        self.samples += 1
        self.cpu_s += time.thread_time() - t0

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> Sampler:
        self.reset()
        self.sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.sample()

    def report(self) -> dict[str, Any]:
        kinds: dict[str, dict[str, int]] = {}
        for q in self.peak.values():
            k = kinds.setdefault(q["name"] if q["name"].startswith("client") else _kind(q["name"]),
                                 {"processes": 0, "threads_max": 0, "rss_bytes_max": 0, "model_connections_max": 0})
            k["processes"] += 1
            for f in ("threads_max", "rss_bytes_max", "model_connections_max"):
                k[f] += q[f]
        out: dict[str, Any] = {"threads_max": self.threads_max, "rss_bytes_max": self.rss_max, "samples": self.samples,
                               "sampler_cpu_s": round(self.cpu_s, 3), "by_kind": kinds, "processes": sorted(self.peak.values(), key=lambda q: q["pid"])}
        if self.loads:
            out["load_avg_1min"] = {"start": self.loads[0], "end": self.loads[-1], "max": max(self.loads)}
        if self.standin is not None:
            out["model_connections_max"] = self.conns_max
        return out


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


def host_counters(rt: Any) -> dict[str, int]:
    """Every soul host's counters (:meth:`SoulHost.metrics_snapshot`), summed."""
    from actors import raycalls
    from actors.controller import host_name
    total: dict[str, int] = {}
    for i in range(rt.cfg.hosts):
        h = raycalls.get_actor(host_name(i), rt.cfg.namespace)
        if h is not None:
            for k, v in raycalls.get(raycalls.call(h, "metrics_snapshot"), timeout=60).items():
                total[k] = total.get(k, 0) + int(v)
    return total


async def _overheads(rt: Any, sample: list[tuple[str, str, float]], embed_ms: float,
                     wait_writes: bool = True, timings: dict[str, list[float]] | None = None) -> list[float]:
    """Client latency minus the model and embedder time of each sampled turn (the memory decision counts only
    when the turn waited for it); each stage's time in the turn's trace is added to ``timings``."""
    out = []
    for sid, turn_id, latency in sample:
        try:
            tr = await rt.async_soul(sid).trace(turn_id)
        except Exception:  # noqa: BLE001 — a trace not there is a sample less
            continue
        t = tr.timings_ms
        if timings is not None:
            for k, v in t.items():
                timings.setdefault(k, []).append(float(v))
        model = t.get("inference", 0.0)
        if wait_writes:
            model += t.get("persist_decision", 0.0) + t.get("extract", 0.0)
        out.append(max(0.0, latency - model - 2 * embed_ms))
    return out


def _phase(name: str, active: int, wall: float, lat: list[float], over: list[float]) -> dict[str, Any]:
    return {"phase": name, "active": active, "turns": len(lat), "seconds": round(wall, 3),
            "turns_per_s": round(len(lat) / wall, 2) if wall else 0.0,
            "turn_p50_ms": round(percentile(lat, 50), 2), "turn_p99_ms": round(percentile(lat, 99), 2),
            "overhead_p50_ms": round(percentile(over, 50), 2) if over else None}


def _per(before: int | None, after: int | None, turns: int) -> float | None:
    """A counter's increase per turn (None when it was not measured)."""
    if before is None or after is None or not turns:
        return None
    return round((after - before) / turns, 2)


def _calls_delta(before: dict[str, Any] | None, after: dict[str, Any] | None, turns: int) -> dict[str, Any]:
    """The stand-in's calls between two of its stats (``per_turn``: per turn answered)."""
    if before is None or after is None:
        return {}
    kinds = {k: after["by_kind"].get(k, 0) - before["by_kind"].get(k, 0) for k in after["by_kind"]}
    calls = after["calls"] - before["calls"]
    return {"calls": calls, "by_kind": {k: v for k, v in kinds.items() if v},
            "per_turn": round(calls / turns, 3) if turns else None}


def server_commits(storage: str) -> tuple[int, float | None] | None:
    """Transactions the PostgreSQL database of a ``postgresql://`` storage has committed so far, and the CPU
    seconds its server's processes have used (None when the server is not on this machine); None for SQLite.
    The server's statistics lag its backends by up to a second: read after a pause."""
    if not is_postgres(storage):
        return None
    import psycopg
    time.sleep(1.1)
    with psycopg.connect(storage, autocommit=True) as con:
        con.execute("SELECT pg_stat_clear_snapshot()")
        row = con.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
        backend = con.execute("SELECT pg_backend_pid()").fetchone()
        cpu = _server_cpu_s(int(backend[0])) if backend else None
    return (int(row[0]) if row else 0), cpu


def _server_cpu_s(backend: int) -> float | None:
    """CPU seconds of the PostgreSQL server that runs ``backend`` (its postmaster and every process the postmaster
    started), when that server runs on this machine; None otherwise."""
    try:
        parent = int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
    pids = [parent, *_children().get(parent, [])]
    infos = [process_info(pid) for pid in pids]
    return sum(i["cpu_s"] for i in infos if i is not None)


def _server_figures(before: tuple[int, float | None] | None, after: tuple[int, float | None] | None,
                    turns: int) -> dict[str, Any]:
    """Server commits and server CPU (ms) per turn between two :func:`server_commits` readings."""
    if before is None or after is None:
        return {"server_commits_per_turn": None, "server_cpu_ms_per_turn": None}
    cpu = None if before[1] is None or after[1] is None else round((after[1] - before[1]) * 1000 / max(1, turns), 2)
    return {"server_commits_per_turn": _per(before[0], after[0], turns), "server_cpu_ms_per_turn": cpu}


def run(*, souls: int, active: Sequence[int], turns: int = 2, embedder: str = "fast", data_dir: str | None = None,
        host_capacity: int | None = None, store_capacity: int | None = None, seed: int = 7,
        overhead_sample: int = 200, reactivate: int = 0, local_channels: bool = True,
        model: str = "offline", model_delays: Sequence[float] = (3.0,), wait_writes: Sequence[bool] | None = None,
        sample_every_s: float = 1.0, progress: Progress | None = None, storage: str = "local",
        count_fsyncs: bool = False) -> dict[str, Any]:
    """Run the benchmark on a fresh embedded runtime; returns the results (JSON-ready). ``data_dir``: where the
    souls live (default a fresh temp dir, removed after): a directory on the storage to measure, e.g. an NFS or
    EFS mount with ``storage="shared"``; each phase then reports the fsyncs per turn the runtime made on it
    (``count_fsyncs``, :mod:`soul_apps.bench.fsyncs`), and the result names the data dir's file system.
    ``local_channels=False``:
    every call through Ray (the runtime before its local channels, for comparison). ``model``: ``offline`` or
    ``stand-in`` (the Messages-API stand-in in a process of its own, at 0 s and at each of ``model_delays``
    seconds per call). ``wait_writes``: the values to run each level with (default: True for the offline model,
    False for the stand-in)."""
    from actors.runtime import connect

    _check_run(souls, active, turns, reactivate, model, model_delays)
    standin_model = model == "stand-in"
    waits, delays = _levels(standin_model, wait_writes, model_delays)
    rng = random.Random(seed)
    embed_ms = embed_ms_per_text(embedder, rng)
    own_dir = data_dir is None
    path = Path(data_dir or tempfile.mkdtemp(prefix="soul-bench-scale-"))
    opts: dict[str, Any] = {"embedder": embedder, "model": "offline", "local_channels": local_channels,
                            "storage": storage, **_capacities(host_capacity, store_capacity)}
    work = Path(tempfile.mkdtemp(prefix="soul-bench-fsyncs-"))
    syncs = fsyncs.counter(path, work) if count_fsyncs else None
    saved_env = {k: os.environ.get(k) for k in (syncs.env() if syncs else {})}

    def synced() -> int | None:
        return syncs.read() if syncs else None

    def committed() -> tuple[int, float | None] | None:
        return server_commits(storage)
    baseline = in_process(embedder, rng)
    ids = [f"bench-{i:06d}" for i in range(souls)]
    at0 = 1_780_000_000.0
    phases: list[dict[str, Any]] = [baseline]
    standin: Any = None
    standin_info: dict[str, Any] = {}
    try:
        if standin_model:
            standin, standin_info = _start_standin(delays, opts, progress)
        sampler = Sampler(sample_every_s, standin)
        started = time.perf_counter()
        if progress:
            progress("starting the runtime", 0, 1)
        if syncs:  # the local Ray this connect starts passes it to every actor process
            os.environ.update(syncs.env())
        with connect(data_dir=str(path), **opts) as rt:
            start_s = time.perf_counter() - started
            # phase 1: every soul's first turn (activation + first writes), on the instant stand-in
            lat: list[float] = []
            res: list[Any] = []
            errors: dict[str, int] = {}
            examples: dict[str, str] = {}
            calls0 = standin.stats() if standin else None
            synced0, commits0 = synced(), committed()
            with sampler:
                wall = asyncio.run(_drive(rt, [(sid, utterance(rng)) for sid in ids], max(active), lat, res,
                                          progress, "first turns", at0, errors=errors, examples=examples))
            synced1, commits1 = synced(), committed()
            over = asyncio.run(_overheads(rt, rng.sample(res, min(overhead_sample, len(res))), embed_ms))
            first = _phase("first turns", max(active), wall, lat, over)
            first["fsyncs_per_turn"] = _per(synced0, synced1, len(lat))
            first.update(_server_figures(commits0, commits1, len(lat)))
            first["activations_per_s"] = first["turns_per_s"]
            first.update(errors=errors, error_examples=examples, runtime=sampler.report())
            if standin:
                first["model_delay_s"] = 0.0
                first["model_calls"] = _calls_delta(calls0, standin.settle(), len(lat))
            phases.append(first)
            clock = at0 + max(1e5, souls + 1)  # each phase's turns later than the last one's
            cursor = 0  # where in the rotation of souls the next phase starts
            # phase 2: turns in rotation at each level of concurrency (each wait_writes, each model delay)
            for level in sorted(set(active)) if turns else ():
                n_jobs = max(level, MIN_PHASE_CLIENTS) * turns if standin_model else souls * turns
                for wait in waits:
                    for delay in delays:
                        if standin is not None and delay is not None:
                            standin.set_delay(delay)
                        jobs = [(ids[((cursor + k) * 7919) % souls], utterance(rng)) for k in range(n_jobs)]
                        cursor += n_jobs
                        label = f"{level} in flight" + ("" if delay is None else f", {delay:g} s stand-in") + \
                            ("" if len(waits) == 1 else f", wait_writes={wait}")
                        phases.append(_turns_phase(rt, jobs, level, label, wait, delay, clock, sampler, standin,
                                                   synced, committed, rng, progress, overhead_sample, embed_ms))
                        clock += max(1e5, n_jobs + 1)
            if reactivate:  # phase 3: the next turn of souls picked at random, one at a time (most are passivated)
                if standin is not None:
                    standin.set_delay(0.0)
                before = host_counters(rt)
                picked = rng.sample(ids, min(reactivate, souls))
                lat, res, errors = [], [], {}
                wall = asyncio.run(_drive(rt, [(sid, utterance(rng)) for sid in picked], 1, lat, res, progress,
                                          "reactivations", clock, errors=errors))
                after = host_counters(rt)
                react = _phase("next turn of a random soul", 1, wall, lat, [])
                react["activations"] = after.get("activations", 0) - before.get("activations", 0)
                react["errors"] = errors
                phases.append(react)
            counters = host_counters(rt)
            procs = process_table(exclude=sampler.exclude)
            disk = dir_bytes(path)
            closed = closed_soul_bytes(path)
            fs = fsyncs.file_system(path)
            stats = rt.stats()
    finally:
        _restore_env(saved_env)
        import shutil
        shutil.rmtree(work, ignore_errors=True)
        if standin is not None:
            _stop_standin(standin, standin_info)
        if own_dir:
            shutil.rmtree(path, ignore_errors=True)
    _vs_instant(phases)
    steady = [p for p in phases if p["phase"] == "turns"] or [first]
    best = max(steady, key=lambda p: (p["active"], p.get("model_delay_s") or 0.0))
    react_phase = next((p for p in phases if p["phase"].startswith("next turn")), None)
    return {
        "souls": souls, "active": sorted(set(active)), "turns_per_soul": turns, "embedder": embedder, "local_channels": local_channels,
        "model": model, "model_delays_s": [d for d in delays if d is not None], "wait_writes": waits,
        "embed_ms_per_text": round(embed_ms, 3), "runtime_start_s": round(start_s, 2),
        "data_dir": None if own_dir else str(path), "storage": redacted(storage), "file_system": fs,
        "fsyncs_per_turn": best.get("fsyncs_per_turn"), "fsyncs_measured": syncs is not None,
        "server_commits_per_turn": best.get("server_commits_per_turn"),
        "server_cpu_ms_per_turn": best.get("server_cpu_ms_per_turn"),
        "turns_per_s": best["turns_per_s"], "turn_p50_ms": best["turn_p50_ms"], "turn_p99_ms": best["turn_p99_ms"],
        "overhead_p50_ms": best["overhead_p50_ms"],
        "first_turns_per_s": first["turns_per_s"], "activations_per_s": first["activations_per_s"],
        **_reactivation_figures(react_phase), **_call_figures(counters),
        "cpu_ms_per_turn": best.get("cpu_ms_per_turn"),
        "load_avg_1min": best.get("runtime", {}).get("load_avg_1min"),
        "errors": _sum_errors(phases),
        "active_at_end": stats.get("active"), "hosts": rt.cfg.hosts, "host_threads": rt.cfg.host_threads,
        **_process_figures(procs),
        "in_process_turns_per_s": baseline["turns_per_s"], "in_process_timings_p50_ms": baseline["timings_p50_ms"],
        "processes": procs, "disk_bytes_per_soul": disk // souls, "disk_bytes": disk, "phases": phases,
        **_closed_figures(closed),
        "overhead_method": "client latency - trace model time (inference, + persist_decision + extract when the "
                           "turn waited for its writes) - 2 x embed_ms_per_text",
        "standin": standin_info or None,
        "machine": {"cpus": os.cpu_count()},
    }


def _levels(standin_model: bool, wait_writes: Sequence[bool] | None, model_delays: Sequence[float]
            ) -> tuple[list[bool], list[float | None]]:
    """The ``wait_writes`` values each level runs with (default: True for the offline model, False for the
    stand-in) and the model delays (the stand-in's: 0 s first, then each other delay; None: the offline model)."""
    waits = list(dict.fromkeys(wait_writes)) if wait_writes else [not standin_model]
    if not standin_model:
        return waits, [None]
    return waits, [0.0, *sorted({float(d) for d in model_delays} - {0.0})]


def _capacities(host_capacity: int | None, store_capacity: int | None) -> dict[str, int]:
    """The capacities asked for (none: the runtime's defaults)."""
    return {k: v for k, v in (("host_capacity", host_capacity), ("store_capacity", store_capacity)) if v}


def _check_run(souls: int, active: Sequence[int], turns: int, reactivate: int, model: str,
               model_delays: Sequence[float]) -> None:
    """InvalidInput for arguments :func:`run` cannot run with."""
    from soul_runtime.errors import InvalidInput
    if souls < 1 or not active or min(active) < 1 or turns < 0 or reactivate < 0:
        raise InvalidInput("souls and active must be positive, turns and reactivate >= 0")
    if model not in MODELS:
        raise InvalidInput(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    if any(not 0 <= d <= 3600 for d in model_delays):
        raise InvalidInput("model delays must be seconds in 0..3600")


def _start_standin(delays: Sequence[float | None], opts: dict[str, Any], progress: Progress | None
                   ) -> tuple[Any, dict[str, Any]]:
    """The Messages-API stand-in started in a process of its own, and ``opts`` set to use it through the Anthropic
    adapter; returns it and what the result says of it."""
    from soul_apps.bench.claude_path import MEMORY_MODEL, REPLY_MODEL
    from soul_apps.bench.model_standin import StandinProcess
    if progress:
        progress("starting the model stand-in", 0, 1)
    standin = StandinProcess(delay_s=0.0).start()
    timeout = max(60.0, 2 * max(d or 0.0 for d in delays) + 30)
    opts.update(model="anthropic", model_args={"base_url": standin.base_url, "api_key": "bench-standin",
                                               "model": REPLY_MODEL, "memory_model": MEMORY_MODEL,
                                               "timeout_s": f"{timeout:g}"})
    return standin, {"pid": standin.pid, "port": standin.port, "base_url": standin.base_url,
                     "reply_model": REPLY_MODEL, "memory_model": MEMORY_MODEL}


def _stop_standin(standin: Any, info: dict[str, Any]) -> None:
    try:
        info.update(standin.stats(timeout_s=10))
    except OSError:
        pass
    info["exit_code"] = standin.stop()
    info["stopped"] = not standin.alive()


def _restore_env(saved: dict[str, str | None]) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _reactivation_figures(react: dict[str, Any] | None) -> dict[str, Any]:
    return {"reactivation_p50_ms": react["turn_p50_ms"] if react else None,
            "reactivation_p99_ms": react["turn_p99_ms"] if react else None,
            "reactivated": react["activations"] if react else None}


def _call_figures(counters: dict[str, int]) -> dict[str, Any]:
    """Activations, passivations, and how many items the hosts' and shards' calls carried."""
    return {"activations": counters.get("activations", 0), "passivations": counters.get("passivations", 0),
            "shard_calls": {m: counters.get(f"shard_calls:{m}", 0) for m in ("recall_batch", "apply_batch")},
            "shard_items_per_call": {m: round(counters.get(f"shard_items:{m}", 0) / counters[f"shard_calls:{m}"], 2)
                                     for m in ("recall_batch", "apply_batch") if counters.get(f"shard_calls:{m}")},
            "turns_per_host_call": round(counters.get("turn_items", 0) / counters["turn_calls"], 2)
            if counters.get("turn_calls") else None}


def _process_figures(procs: list[dict[str, Any]]) -> dict[str, int]:
    return {"cluster_rss_bytes": sum(p["rss_bytes"] for p in procs),
            "max_open_fds": max((p["open_fds"] for p in procs), default=0)}


def _closed_figures(closed: list[int]) -> dict[str, Any]:
    return {"closed_souls": len(closed), "disk_bytes_per_closed_soul_p50": int(percentile(closed, 50)) if closed else None,
            "disk_bytes_per_closed_soul_max": max(closed) if closed else None}


def _turns_phase(rt: Any, jobs: list[tuple[str, str]], level: int, label: str, wait: bool, delay: float | None,
                 clock: float, sampler: Sampler, standin: Any, synced: Callable[[], int | None],
                 committed: Callable[[], tuple[int, float | None] | None], rng: random.Random, progress: Progress | None,
                 overhead_sample: int, embed_ms: float) -> dict[str, Any]:
    """One phase of turns in rotation: ``jobs`` with ``level`` in flight, then what they cost (CPU per turn by
    kind of process, calls per turn, fsyncs and server commits, model calls, the peak threads and RSS) and their
    overheads."""
    lat: list[float] = []
    res: list[Any] = []
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    procs0, host0, cpu0 = process_table(exclude=sampler.exclude), host_counters(rt), time.process_time()
    calls0 = standin.stats() if standin else None
    synced0, commits0 = synced(), committed()
    with sampler:
        wall = asyncio.run(_drive(rt, jobs, level, lat, res, progress, label, clock,
                                  wait_writes=wait, errors=errors, examples=examples))
        conns_end = standin.connections() if standin else None
    cpu = cpu_per_turn(procs0, process_table(exclude=sampler.exclude), len(jobs),
                       time.process_time() - cpu0 - sampler.cpu_s)
    calls1 = standin.settle() if standin else None  # the turns' memory work is done
    synced1, commits1 = synced(), committed()
    host1 = host_counters(rt)
    stages: dict[str, list[float]] = {}
    over = asyncio.run(_overheads(rt, rng.sample(res, min(overhead_sample, len(res))), embed_ms,
                                  wait, stages))
    phase = _phase("turns", level, wall, lat, over)
    phase["timings_p50_ms"] = {k: round(percentile(v, 50), 2) for k, v in sorted(stages.items())}
    phase.update(wait_writes=wait, errors=errors, error_examples=examples)
    phase["cpu_ms_per_turn"] = cpu
    phase["fsyncs_per_turn"] = _per(synced0, synced1, len(lat))
    phase.update(_server_figures(commits0, commits1, len(lat)))
    # every call a turn makes, and of those the ones that went over a local channel instead
    # of Ray
    phase["calls_per_turn"] = _per_turn(host0, host1, len(jobs), (
        ("run_batch", "turn_calls"), ("recall_batch", "shard_calls:recall_batch"),
        ("apply_batch", "shard_calls:apply_batch")))
    phase["channel_calls_per_turn"] = _per_turn(host0, host1, len(jobs), (
        ("run_batch", "channel_calls"), ("recall_batch", "shard_channel_calls:recall_batch"),
        ("apply_batch", "shard_channel_calls:apply_batch")))
    phase["runtime"] = sampler.report()
    if standin is not None:
        phase["model_delay_s"] = delay
        phase["model_calls"] = _calls_delta(calls0, calls1, len(lat))
        phase["model_connections_max"] = phase["runtime"]["model_connections_max"]
        phase["model_connections_end"] = conns_end
    return phase


def beside_offline(res: dict[str, Any], offline: dict[str, Any]) -> dict[str, Any]:
    """Per level in both runs: the instant stand-in's runtime CPU per turn (``wait_writes=False``) beside the offline
    model's (a second run of :func:`run` with ``model="offline"``, ``wait_writes=False``), and their ratio."""
    def by_level(r: dict[str, Any], instant: bool) -> dict[int, dict[str, Any]]:
        return {p["active"]: p for p in r["phases"] if p["phase"] == "turns" and p.get("wait_writes") is False
                and p.get("cpu_ms_per_turn") and (not instant or p.get("model_delay_s") == 0.0)}
    ours, theirs = by_level(res, True), by_level(offline, False)
    rows = []
    for level in sorted(set(ours) & set(theirs)):
        a, b = ours[level], theirs[level]
        ca, cb = a["cpu_ms_per_turn"]["total"], b["cpu_ms_per_turn"]["total"]
        rows.append({"active": level, "standin_turns_per_s": a["turns_per_s"], "offline_turns_per_s": b["turns_per_s"],
                     "standin_cpu_ms_per_turn": a["cpu_ms_per_turn"], "offline_cpu_ms_per_turn": b["cpu_ms_per_turn"],
                     "cpu_ratio": round(ca / cb, 3) if cb else None})
    return {"rows": rows, "offline_phases": offline["phases"]}


def _vs_instant(phases: list[dict[str, Any]]) -> None:
    """Each delayed phase's turns/s as a share of the instant stand-in's at the same level and wait_writes."""
    instant = {(p["active"], p["wait_writes"]): p["turns_per_s"] for p in phases
               if p["phase"] == "turns" and p.get("model_delay_s") == 0.0}
    for p in phases:
        if p["phase"] == "turns" and p.get("model_delay_s"):
            base = instant.get((p["active"], p["wait_writes"]))
            p["vs_instant_turns_per_s"] = round(p["turns_per_s"] / base, 4) if base else None


def _sum_errors(phases: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in phases:
        for k, v in (p.get("errors") or {}).items():
            out[k] = out.get(k, 0) + v
    return out


def _series(res: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The steady phases as lines: one per model delay (and wait_writes, when both ran)."""
    steady = [p for p in res["phases"] if p["phase"] == "turns"]
    keys = list(dict.fromkeys((p.get("model_delay_s"), p.get("wait_writes", True)) for p in steady))
    both = len({w for _, w in keys}) > 1
    out = []
    for delay, wait in keys:
        name = "offline model" if delay is None else "instant stand-in" if delay == 0 else f"{delay:g} s stand-in"
        if both:
            name += f", wait_writes={wait}"
        out.append((name, sorted((p for p in steady if (p.get("model_delay_s"), p.get("wait_writes", True))
                                  == (delay, wait)), key=lambda p: p["active"])))
    return out


def plot(res: dict[str, Any], path: str) -> None:
    from soul_apps.bench.plotting import pyplot
    plt = pyplot()

    series = _series(res)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for name, ps in series:
        xs = [p["active"] for p in ps]
        a.plot(xs, [p["turns_per_s"] for p in ps], "o-", label=name)
        line = b.plot(xs, [p["turn_p50_ms"] for p in ps], "o-", label=f"{name} p50")
        b.plot(xs, [p["turn_p99_ms"] for p in ps], "s--", color=line[0].get_color(), alpha=0.6,
               label=f"{name} p99")
        if len(series) == 1:
            b.plot(xs, [p["overhead_p50_ms"] or 0 for p in ps], "^:", label="overhead p50")
    for ax in (a, b):
        ax.set_xlabel("turns in flight")
        if len({p["active"] for _, ps in series for p in ps}) > 2:
            ax.set_xscale("log")
    a.set_ylabel("turns/s")
    a.set_title(f"throughput, {res['souls']} souls, {res['embedder']} embedder")
    b.set_ylabel("ms")
    b.set_title("turn latency at the client")
    if len(series) > 1:
        a.legend(fontsize=8)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _model_label(p: dict[str, Any]) -> str:
    d = p.get("model_delay_s")
    return "offline" if d is None else f"{d:g} s"


def summary_rows(res: dict[str, Any]) -> list[list[str]]:
    """The table's rows; with the stand-in model: phase, model delay, wait_writes, in flight, turns, turns/s,
    share of the instant stand-in's turns/s, p50 / p99, overhead p50, errors, peak threads / RSS of the runtime's
    processes and connections to the stand-in."""
    rows = []
    if res.get("model") != "stand-in":
        for p in res["phases"]:
            rows.append([p["phase"], str(p["active"]), str(p["turns"]), f"{p['turns_per_s']:.1f}",
                         f"{p['turn_p50_ms']:.0f}", f"{p['turn_p99_ms']:.0f}",
                         "—" if p["overhead_p50_ms"] is None else f"{p['overhead_p50_ms']:.1f}",
                         "—" if p.get("fsyncs_per_turn") is None else f"{p['fsyncs_per_turn']:.1f}",
                         _load(p)])
        return rows
    for p in res["phases"]:
        rt = p.get("runtime") or {}
        vs = p.get("vs_instant_turns_per_s")
        rows.append([
            "in process" if p["phase"].startswith("in process") else p["phase"], _model_label(p),
            "—" if "wait_writes" not in p else "yes" if p["wait_writes"] else "no", str(p["active"]), str(p["turns"]),
            f"{p['turns_per_s']:.1f}", "—" if vs is None else f"{vs:.3f}",
            f"{p['turn_p50_ms']:.0f}/{p['turn_p99_ms']:.0f}",
            "—" if p["overhead_p50_ms"] is None else f"{p['overhead_p50_ms']:.1f}",
            str(sum((p.get("errors") or {}).values())) if "errors" in p else "—",
            f"{rt['threads_max']}/{rt['rss_bytes_max'] / 2**20:.0f}" if rt else "—",
            str(rt.get("model_connections_max", "—"))])
    return rows


LEGEND = ("model: the stand-in's seconds per call; wait: wait_writes; ×inst: turns/s as a share of the instant "
          "stand-in's at the same level; ovh: overhead p50; thr/MiB: peak threads / RSS of the local Ray's processes "
          "and this client; conns: peak TCP connections to the stand-in")


def summary_columns(res: dict[str, Any]) -> list[str]:
    if res.get("model") == "stand-in":
        return ["phase", "model", "wait", "in flight", "turns", "turns/s", "×inst", "p50/p99 ms", "ovh ms", "errors",
                "thr/MiB", "conns"]
    return ["phase", "in flight", "turns", "turns/s", "p50 ms", "p99 ms", "overhead p50 ms", "fsyncs/turn", "load"]


def _load(p: dict[str, Any]) -> str:
    """The machine's highest 1-min load average while the phase ran (—: not sampled)."""
    load = (p.get("runtime") or {}).get("load_avg_1min")
    return "—" if not load else f"{load['max']:.1f}"


_TABLE_KINDS = ("SoulHost", "LayerShard", "RuntimeController")


def kind_rows(res: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Per phase, per kind of process (the runtime's actors; Ray's own processes together; this client): peak
    threads / peak RSS MiB summed over its processes, and the connections they held to the model stand-in."""
    ph = [p for p in res["phases"] if p.get("runtime")]

    def folded(p: dict[str, Any]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for k, v in p["runtime"]["by_kind"].items():
            name = k if k in _TABLE_KINDS else "client" if k.startswith("client") else "Ray's own"
            o = out.setdefault(name, {"processes": 0, "threads_max": 0, "rss_bytes_max": 0,
                                      "model_connections_max": 0})
            for f in o:
                o[f] += v.get(f, 0)
        return out
    per = [folded(p) for p in ph]
    kinds = [k for k in (*_TABLE_KINDS, "Ray's own", "client") if any(k in f for f in per)]
    cols = ["phase", "in flight", "model"] + [
        f"{k} ×{max(f.get(k, {}).get('processes', 0) for f in per)}" for k in kinds]
    rows = []
    for p, f in zip(ph, per, strict=True):
        cells = []
        for k in kinds:
            v = f.get(k)
            conns = f" / {v['model_connections_max']}" if v and v["model_connections_max"] else ""
            cells.append("—" if v is None else f"{v['threads_max']} / {v['rss_bytes_max'] / 2**20:.0f}{conns}")
        wait = "" if "wait_writes" not in p or len(res.get("wait_writes", [])) < 2 else \
            f", wait {str(p['wait_writes']).lower()}"
        rows.append([p["phase"] + wait, str(p["active"]), _model_label(p), *cells])
    return cols, rows
