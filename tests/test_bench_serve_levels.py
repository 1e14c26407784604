"""``soul bench serve``'s throughput levels: warm-ups first, then each path's counted turns in two halves run
in mirrored order, and turns/s from the sum of a path's own halves."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable

from soul_runtime.bench.serve import _levels, cpu_by_process_kind, machine_cpu_s, per_client


def _path(name: str, log: list[tuple[str, int, int]], pause: float) -> Callable[[int, int], Awaitable[None]]:
    async def turn(i: int, k: int) -> None:
        log.append((name, i, k))
        await asyncio.sleep(pause)
    return turn


def test_paths_run_in_mirrored_halves_after_every_warm_up() -> None:
    log: list[tuple[str, int, int]] = []
    res = asyncio.run(_levels(3, 4, {"a": _path("a", log, 0.001), "b": _path("b", log, 0.02)}))
    warm, counted = log[:6], log[6:]
    assert sorted(warm) == [("a", i, 0) for i in range(3)] + [("b", i, 0) for i in range(3)]
    runs = [counted[j][0] for j in range(0, len(counted), 6)]  # 3 clients x 2 turns a half
    assert runs == ["a", "b", "b", "a"] and len(counted) == 24
    for name in "ab":  # each client's turns 1..4 once, in order
        for i in range(3):
            assert [k for n, c, k in counted if n == name and c == i] == [1, 2, 3, 4]
    assert res["a"]["turns"] == res["b"]["turns"] == 12
    # b's turns take 20x longer: its turns/s is its own, not the level's
    assert res["b"]["turns_per_s"] < res["a"]["turns_per_s"] / 3
    assert 0.02 * 4 <= res["b"]["wall_s"] < 0.02 * 4 * 5
    assert res["b"]["p50_ms"] >= 20
    if sys.platform.startswith("linux"):  # the machine's busy CPU over b's own halves (a's may be under a tick)
        assert res["b"]["machine_cpu_ms_per_turn"] >= 0 and 0 <= res["b"]["machine_busy"] <= 1
        assert all(v > 0 for v in res["b"]["cpu_ms_per_turn"].values())


def test_cpu_by_process_kind_names_this_process_callers() -> None:
    if not sys.platform.startswith("linux"):
        return
    t0 = time.process_time()
    while time.process_time() - t0 < 0.05:
        pass
    kinds = cpu_by_process_kind()
    assert kinds["callers"] >= 0.05 and all(v >= 0 for v in kinds.values())


def test_the_machines_busy_cpu_is_counted() -> None:
    if not sys.platform.startswith("linux"):
        assert machine_cpu_s() is None
        return
    before = machine_cpu_s()
    t0 = time.process_time()
    while time.process_time() - t0 < 0.3:  # 0.3 s of this process's CPU
        pass
    after = machine_cpu_s()
    assert before is not None and after is not None
    assert after[0] - before[0] >= 0.25 and after[1] - before[1] >= after[0] - before[0]


def test_an_odd_count_and_a_single_turn_are_all_counted() -> None:
    for turns in (1, 3):
        log: list[tuple[str, int, int]] = []
        res = asyncio.run(_levels(2, turns, {"a": _path("a", log, 0), "b": _path("b", log, 0)}))
        assert sorted(k for n, c, k in log if n == "a" and c == 1) == list(range(turns + 1))
        assert res["a"]["turns"] == res["b"]["turns"] == 2 * turns


def test_low_levels_count_more_turns_per_client() -> None:
    assert per_client(1, 3, 600) == 600 and per_client(64, 3, 600) == 10 and per_client(300, 3, 600) == 3
    assert per_client(64, 3, 0) == 3
