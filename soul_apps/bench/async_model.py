"""``soul bench async-model``: a user's own model, named by import path, at a remote model's latency.

The model (:class:`WaitingModel`, or :class:`BlockingWaitingModel` for the plain baseline) answers as the offline
model does after waiting ``delay`` seconds a call (its reply and its memory decision). The delay is read per call
from a file the benchmark writes (``delay_file`` in ``model_args``), so every soul's first turn runs on an
instant model and the turns measured after it at the delay. Both models are made by the runtime from their import
path (``connect(model="soul_apps.bench.async_model:WaitingModel")``), as a user's would be.

Each model gets a fresh embedded runtime: every soul's first turn at 0 s (activation, first writes), then a round
of turns at 0 s (the CPU bound of this run), then rounds at the delay, ``in_flight`` turns in flight, each
returning after its reply (``wait_writes=False``; the memory decision's call runs beside it). A phase ends when
its replies are back (its turns/s and latencies) and its memory work has landed (its CPU a turn counts that work;
none of it runs in the next phase, at the next phase's delay). The bound of a
phase at the delay is ``in_flight / delay`` turns/s (one model call on a turn's path), or the instant phase's
turns/s when lower. Per phase: turns/s, latency p50/p99, the most model calls waiting at once (counted in the
soul-host processes and reported through the model's ``model_id``-keyed file), and the threads of each soul-host
process at its peak.

The phase at the delay runs twice. **In lockstep**, every client sends its first turn at once: at a constant delay
the turns then stay together, and every ``delay`` seconds a wave of all of them reaches each stage of a turn at
once. **Ramped**, the clients start one after another over one delay (as users arriving would), and the turns stay
spread. For each, beside turns/s over the whole phase (whose last wave, partly full, takes a whole delay: with
2,000 turns at 300 in flight, 7 waves of time for 6.67 waves of turns), the **steady** turns/s: turns answered
from the moment every client has had its first answer until the first client finds no turn left to send, while
all ``in_flight`` are out. The floor's figure is the ramped steady one; the others stand beside it.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from soul_runtime.models import base
from soul_runtime.models.offline import OfflineModel

Progress = Callable[[str, int, int], None]


def _control(path: str) -> tuple[float, str]:
    """The delay and the phase's name, as the benchmark last wrote them (``"3 phase-2"``)."""
    try:
        delay, _, phase = Path(path).read_text().partition(" ")
        return float(delay or 0), phase
    except (OSError, ValueError):
        return 0.0, ""


CONTROL_EVERY_S = 0.05
"""How often a model reads the benchmark's control file (and writes its peak, when it rose): at most once in
this long, so the model's calls, awaited on the host's event loop, do no file I/O of their own (each read would
stall the loop, and every turn on it, while the host's threads hold the interpreter lock)."""


class _Waits:
    """The calls waiting at once in this process, and their peak in the current phase (written to
    ``<delay_file>.peak.<phase>.<pid>``)."""

    def __init__(self, delay_file: str) -> None:
        self.delay_file = delay_file
        self.now = self.peak = self.written = 0
        self.delay, self.phase = 0.0, ""
        self.read_at = self.write_at = float("-inf")

    def enter(self) -> float:
        t = time.monotonic()
        if t >= self.read_at:
            self.read_at = t + CONTROL_EVERY_S
            self.delay, phase = _control(self.delay_file)
            if phase != self.phase:
                self.phase, self.peak, self.written = phase, 0, 0
        self.now += 1
        self.peak = max(self.peak, self.now)
        self._write(t)
        return self.delay

    def leave(self) -> None:
        self.now -= 1
        self._write(time.monotonic())

    def _write(self, t: float) -> None:
        if self.peak != self.written and t >= self.write_at:
            self.write_at = t + CONTROL_EVERY_S
            self.written = self.peak
            Path(f"{self.delay_file}.peak.{self.phase}.{os.getpid()}").write_text(str(self.peak))


class WaitingModel(base.AsyncLanguageModel):
    """The offline model's answers after awaiting the delay (a remote model over an async client)."""

    model_id = "bench-waiting-async"

    def __init__(self, delay_file: str) -> None:
        self.inner = OfflineModel()
        self.waits = _Waits(delay_file)

    async def _wait(self) -> None:
        try:
            await asyncio.sleep(self.waits.enter())
        finally:
            self.waits.leave()

    async def reply(self, request: base.ReplyRequest) -> base.ModelReply:
        await self._wait()
        return self.inner.reply(request)

    async def decide(self, exchange: base.Exchange) -> base.MemoryDecision:
        await self._wait()
        return self.inner.decide(exchange)

    async def classify_task(self, text: str, known: tuple[str, ...]) -> base.TaskClassification:
        return self.inner.classify_task(text, known)


class BlockingWaitingModel(base.LanguageModel):
    """The same with a blocking wait (a remote model over a blocking client): each call holds a thread."""

    model_id = "bench-waiting-blocking"

    def __init__(self, delay_file: str) -> None:
        import threading
        self.inner = OfflineModel()
        self.waits = _Waits(delay_file)
        self._lock = threading.Lock()

    def _wait(self) -> None:
        with self._lock:
            delay = self.waits.enter()
        try:
            time.sleep(delay)
        finally:
            with self._lock:
                self.waits.leave()

    def reply(self, request: base.ReplyRequest) -> base.ModelReply:
        self._wait()
        return self.inner.reply(request)

    def decide(self, exchange: base.Exchange) -> base.MemoryDecision:
        self._wait()
        return self.inner.decide(exchange)

    def classify_task(self, text: str, known: tuple[str, ...]) -> base.TaskClassification:
        return self.inner.classify_task(text, known)


MODELS = {"async": f"{__name__}:WaitingModel", "blocking": f"{__name__}:BlockingWaitingModel"}


async def _drive(rt: Any, jobs: list[tuple[str, str]], in_flight: int, ramp_s: float, at0: float,
                 errors: dict[str, int], progress: Progress | None, label: str) -> dict[str, Any]:
    """``jobs`` (soul id, text) with ``in_flight`` clients, client k sending its first turn ``k * ramp_s /
    in_flight`` seconds in; each turn returns after its reply. Returns the wall time, the latencies (ms), and the
    steady window's turns/s (see the module's doc; None when the phase is too short to have one)."""
    queue: asyncio.Queue[tuple[int, str, str]] = asyncio.Queue()
    for i, (sid, text) in enumerate(jobs):
        queue.put_nowait((i, sid, text))
    lat: list[float] = []
    answered: list[float] = []  # when each turn was answered (s from the start)
    first: list[float] = []  # when each client had its first answer
    dry: list[float] = []  # when a client first found no turn left
    t0 = time.perf_counter()

    async def client(k: int) -> None:
        await asyncio.sleep(k * ramp_s / max(1, in_flight))
        mine = 0
        while True:
            try:
                i, sid, text = queue.get_nowait()
            except asyncio.QueueEmpty:
                dry.append(time.perf_counter() - t0)
                return
            start = time.perf_counter()
            try:
                await rt.async_soul(sid).turn(text, user="user", at=at0 + i, wait_writes=False)
            except Exception as e:  # noqa: BLE001 — counted by type; one failed turn must not end the run
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            else:
                end = time.perf_counter()
                lat.append((end - start) * 1000)
                answered.append(end - t0)
            mine += 1
            if mine == 1:
                first.append(time.perf_counter() - t0)
            if progress and len(answered) % 10 == 0:
                progress(label, len(answered), len(jobs))

    await asyncio.gather(*(client(k) for k in range(max(1, in_flight))))
    wall = time.perf_counter() - t0
    steady, window = steady_rate(answered, first, dry, wall)
    return {"wall": wall, "lat": lat, "steady": steady, "window_s": window}


def steady_rate(answered: list[float], first: list[float], dry: list[float], wall: float
                ) -> tuple[float | None, tuple[float, float]]:
    """Turns a second answered while every client was sending: from the last client's first answer (``first``)
    to the first time a client found no turn left (``dry``), and that window (s from the start); None when the
    window is empty."""
    a, b = max(first, default=wall), min(dry, default=wall)
    rate = sum(1 for t in answered if a < t <= b) / (b - a) if b > a else None
    return rate, (round(a, 2), round(b, 2))


def _peaks(delay_file: Path, phase: str) -> dict[int, int]:
    """The most calls waiting at once in each process during ``phase``, by pid."""
    return {int(f.name.rsplit(".", 1)[1]): int(f.read_text() or 0)
            for f in delay_file.parent.glob(f"{delay_file.name}.peak.{phase}.*")}


def _landed(rt: Any, timeout_s: float = 120.0) -> None:
    """Wait until no soul host has memory work running (``wait_writes=False`` turns' decisions and writes)."""
    from soul_apps.bench.scale import host_counters
    end = time.monotonic() + timeout_s
    while host_counters(rt).get("memory_work", 0) and time.monotonic() < end:
        time.sleep(0.1)


def _host_threads(report: dict[str, Any]) -> list[int]:
    return [q["threads_max"] for q in report["processes"] if "SoulHost" in q["name"]]


def run_model(kind: str, *, souls: int, in_flight: int, delay_s: float, rounds: int, embedder: str,
              baseline_turns: int | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """One model (``async`` or ``blocking``) on a fresh embedded runtime; returns its phases."""
    from actors.runtime import connect
    from soul_apps.bench.scale import Sampler, cpu_per_turn, percentile, process_table, utterance
    from soul_apps.bench.scale import _drive as drive_writes

    rng = random.Random(11)
    work = Path(tempfile.mkdtemp(prefix="soul-bench-async-model-"))
    delay_file = work / "delay_s"
    delay_file.write_text("0")
    ids = [f"bench-{i:05d}" for i in range(souls)]
    at = 1_780_000_000.0
    phases: list[dict[str, Any]] = []
    out: dict[str, Any] = {"model": MODELS[kind], "phases": phases}
    with connect(data_dir=str(work / "data"), model=MODELS[kind], embedder=embedder,
                 model_args={"delay_file": str(delay_file)}) as rt:
        cfg = rt.cfg
        out.update(hosts=cfg.hosts, host_threads=cfg.host_threads)
        sampler = Sampler(1.0)
        plan: list[tuple[str, float, list[str], float]] = [("first turns", 0.0, ids, 0.0), ("instant", 0.0, ids, 0.0)]
        n = baseline_turns or souls * rounds
        at_delay = [ids[k % souls] for k in range(n)]
        plan.append((f"{delay_s:g} s a call, in lockstep", delay_s, at_delay, 0.0))
        plan.append((f"{delay_s:g} s a call, ramped", delay_s, at_delay, delay_s))
        for i, (label, delay, who, ramp_s) in enumerate(plan):
            delay_file.write_text(f"{delay:g} phase-{i}")
            time.sleep(4 * CONTROL_EVERY_S)  # every model has read it
            errors: dict[str, int] = {}
            procs0, cpu0 = process_table(), time.process_time()
            with sampler:
                if label == "first turns":  # activation and first writes, each turn after its writes
                    lat: list[float] = []
                    wall = asyncio.run(drive_writes(rt, [(s, utterance(rng)) for s in who], in_flight, lat, [],
                                                    progress, f"{kind} model, {label}", at, wait_writes=True,
                                                    errors=errors))
                    got: dict[str, Any] = {"steady": None, "window_s": None}
                else:
                    got = asyncio.run(_drive(rt, [(s, utterance(rng)) for s in who], in_flight, ramp_s, at, errors,
                                             progress, f"{kind} model, {label}"))
                    wall, lat = got["wall"], got["lat"]
            _landed(rt)  # this phase's memory work is its own (its CPU here; none of it runs at the next's delay)
            cpu = cpu_per_turn(procs0, process_table(), len(who), time.process_time() - cpu0 - sampler.cpu_s)
            time.sleep(4 * CONTROL_EVERY_S)  # the models' last peaks are written
            at += 1e5
            report = sampler.report()
            phase = {"phase": label, "model_delay_s": delay, "in_flight": in_flight, "ramp_s": ramp_s,
                     "turns": len(lat), "errors": errors, "wall_s": round(wall, 2),
                     "turns_per_s": round(len(lat) / wall, 2),
                     "steady_turns_per_s": None if got["steady"] is None else round(got["steady"], 2),
                     "steady_window_s": got["window_s"],
                     "p50_ms": round(percentile(lat, 50), 1), "p99_ms": round(percentile(lat, 99), 1),
                     "model_calls_waiting_max": _peaks(delay_file, f"phase-{i}"), "host_threads_max": _host_threads(report),
                     "cpu_ms_per_turn": cpu["total"], "load_avg_1min": report.get("load_avg_1min")}
            phases.append(phase)
        time.sleep(max(delay_s, 0) + 1)  # the last memory decisions answer before the runtime closes
    instant, lockstep, ramped = phases[1]["turns_per_s"], phases[2], phases[3]
    bound = min(in_flight / delay_s, instant) if delay_s > 0 else instant
    latency_bound = in_flight / delay_s

    def of(x: float | None, b: float) -> float | None:
        return None if x is None else round(x / b, 3)
    out.update(bound_turns_per_s=round(bound, 2), latency_bound_turns_per_s=round(latency_bound, 2),
               of_latency_bound=of(ramped["steady_turns_per_s"], latency_bound),
               of_bound=of(ramped["steady_turns_per_s"], bound),
               of_latency_bound_ramped_whole_phase=of(ramped["turns_per_s"], latency_bound),
               of_latency_bound_lockstep_steady=of(lockstep["steady_turns_per_s"], latency_bound),
               of_latency_bound_lockstep_whole_phase=of(lockstep["turns_per_s"], latency_bound))
    return out


def run(*, souls: int = 1000, in_flight: int = 300, delay_s: float = 3.0, rounds: int = 2, embedder: str = "fast",
        baseline: bool = True, progress: Progress | None = None) -> dict[str, Any]:
    """The async model, then (``baseline``) the blocking one in the same run, on fresh runtimes."""
    res: dict[str, Any] = {"souls": souls, "in_flight": in_flight, "model_delay_s": delay_s, "embedder": embedder,
                           "machine": {"cpus": os.cpu_count(), "shared": "2 cores shared with other engineers' "
                                                                        "work while this ran"}}
    res["async"] = run_model("async", souls=souls, in_flight=in_flight, delay_s=delay_s, rounds=rounds,
                             embedder=embedder, progress=progress)
    if baseline:  # the blocking model waits on the hosts' threads: a short phase shows its bound
        cfg_bound = res["async"]["hosts"] * res["async"]["host_threads"]  # calls waiting at once, at most
        res["blocking"] = run_model("blocking", souls=souls, in_flight=in_flight, delay_s=delay_s, rounds=rounds,
                                    embedder=embedder, baseline_turns=max(in_flight, cfg_bound * 10),
                                    progress=progress)
        # a turn's reply and its memory decision each hold a host thread for the delay
        res["blocking"]["thread_bound_turns_per_s"] = round(cfg_bound / (2 * delay_s), 2)
    return res
