"""`soul bench cli`: wall time of `soul` commands on the embedded default, as a user runs them.

Every command is a fresh process (``python -m soul_apps.cli.main``) on a fresh data dir.
In the same run: the baseline — each command starting a private Ray of its own
(``SOUL_LOCAL_RUNTIME=per-call``, what every command cost before the local runtime) — then
the first command on the local runtime (it starts it) and ``rounds`` rounds of
turn / facts / recall / stats / trace attaching to it, then ``soul down`` and a check
that no process of the runtime is left. The client's CPU seconds are reported beside the
wall time, and the load average, since on a shared machine wall time mostly measures the
neighbours.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SOUL = "bench"
FLOOR_S, P50_FLOOR_S = 2.0, 1.5

# (label, argv after `soul`): what a user types after the first command
ROUND = (
    ("turn", ["turn", SOUL, "Our billing service is written in Go."]),
    ("facts", ["facts", SOUL]),
    ("recall", ["recall", SOUL, "billing service", "-k", "3"]),
    ("stats", ["stats", SOUL]),
    ("trace", ["trace", SOUL, "--last", "1"]),
)


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    """(wall s, client CPU s, exit code, stderr tail) of one `soul` command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "soul_apps.cli.main", *argv], env=env, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, p.returncode, p.stderr.strip()[-300:]


def _summary(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"n": len(xs), "p50": round(statistics.median(xs), 3), "max": round(xs[-1], 3),
            "p90": round(xs[min(len(xs) - 1, int(0.9 * len(xs)))], 3), "mean": round(statistics.fmean(xs), 3)}


def run(rounds: int = 3, baseline: bool = True, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    from soul_apps.cluster import local_runtime as background
    say = progress or (lambda _: None)
    data = tempfile.mkdtemp(prefix="soul-bench-cli-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SOUL_", "RAY_AUTH"))}
    env |= {"SOUL_DATA_DIR": data, "COLUMNS": "120"}
    out: dict[str, Any] = {"data_dir": data, "rounds": rounds, "load_before": os.getloadavg()}
    failures: list[str] = []

    def timed(label: str, argv: list[str], e: dict[str, str]) -> tuple[float, float]:
        say(label)
        wall, cpu, rc, err = _run(argv, e)
        if rc != 0:
            failures.append(f"{label}: exit {rc}: {err}")
        return wall, cpu

    try:
        if baseline:  # the same first two commands, each on a private Ray of its own
            per_call = env | {"SOUL_LOCAL_RUNTIME": "per-call"}
            base = [timed(f"per-call {label}", argv, per_call) for label, argv in ROUND[:2]]
            out["per_call"] = {"wall": _summary([w for w, _ in base]), "cpu": _summary([c for _, c in base])}
        first = timed("first command (starts the local runtime)", ROUND[0][1], env)
        out["first"] = {"wall": round(first[0], 3), "cpu": round(first[1], 3)}
        per: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in ROUND}
        for r in range(rounds):
            for label, argv in ROUND:
                per[label].append(timed(f"round {r + 1}/{rounds}: {label}", argv, env))
        walls = [w for xs in per.values() for w, _ in xs]
        out["attached"] = {"wall": _summary(walls), "cpu": _summary([c for xs in per.values() for _, c in xs]),
                           "per_command": {k: _summary([w for w, _ in xs]) for k, xs in per.items()}}
        out["floor"] = {"max_s": FLOOR_S, "p50_s": P50_FLOOR_S,
                        "met": max(walls) <= FLOOR_S and statistics.median(walls) <= P50_FLOOR_S}
        pids = list(_head_pids(background.state_dir(data)))
        down = timed("soul down", ["down"], env)
        out["down"] = {"wall": round(down[0], 3)}
        time.sleep(0.5)
        from soul_apps.cluster.local_cluster import pid_alive
        out["left_behind"] = [p for p in pids if pid_alive(p)]
    finally:
        background.stop(data)  # whatever happened above, no runtime outlives the bench
        out["load_after"] = os.getloadavg()
        shutil.rmtree(data, ignore_errors=True)
    out["failures"] = failures
    return out


def _head_pids(state_dir: Path) -> list[int]:
    from soul_apps.cluster import local_cluster as lc
    status = lc.head_status(state_dir)
    return list(status["pids_alive"]) if status else []
