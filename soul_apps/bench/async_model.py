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
    from soul_apps.bench.scale import Sampler, _drive, cpu_per_turn, percentile, process_table, utterance

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
        plan: list[tuple[str, float, list[str]]] = [("first turns", 0.0, ids), ("instant", 0.0, ids)]
        n = baseline_turns or souls * rounds
        plan.append((f"{delay_s:g} s a call", delay_s, [ids[k % souls] for k in range(n)]))
        for i, (label, delay, who) in enumerate(plan):
            delay_file.write_text(f"{delay:g} phase-{i}")
            time.sleep(4 * CONTROL_EVERY_S)  # every model has read it
            lat: list[float] = []
            res: list[Any] = []
            errors: dict[str, int] = {}
            procs0, cpu0 = process_table(), time.process_time()
            with sampler:
                wall = asyncio.run(_drive(rt, [(s, utterance(rng)) for s in who], in_flight, lat, res, progress,
                                          f"{kind} model, {label}", at, wait_writes=label == "first turns",
                                          errors=errors))
            _landed(rt)  # this phase's memory work is its own (its CPU here; none of it runs at the next's delay)
            cpu = cpu_per_turn(procs0, process_table(), len(who), time.process_time() - cpu0 - sampler.cpu_s)
            time.sleep(4 * CONTROL_EVERY_S)  # the models' last peaks are written
            at += 1e5
            report = sampler.report()
            phase = {"phase": label, "model_delay_s": delay, "in_flight": in_flight, "turns": len(lat),
                     "errors": errors, "wall_s": round(wall, 2), "turns_per_s": round(len(lat) / wall, 2),
                     "p50_ms": round(percentile(lat, 50), 1), "p99_ms": round(percentile(lat, 99), 1),
                     "model_calls_waiting_max": _peaks(delay_file, f"phase-{i}"), "host_threads_max": _host_threads(report),
                     "cpu_ms_per_turn": cpu["total"], "load_avg_1min": report.get("load_avg_1min")}
            phases.append(phase)
        time.sleep(max(delay_s, 0) + 1)  # the last memory decisions answer before the runtime closes
    instant, slow = phases[1]["turns_per_s"], phases[2]
    bound = min(in_flight / delay_s, instant) if delay_s > 0 else instant
    out.update(bound_turns_per_s=round(bound, 2), latency_bound_turns_per_s=round(in_flight / delay_s, 2),
               of_latency_bound=round(slow["turns_per_s"] / (in_flight / delay_s), 3),
               of_bound=round(slow["turns_per_s"] / bound, 3))
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
