"""Faults on a real local Ray: SIGKILL a soul host, a store actor or the controller mid-stream (turns do not
pass through the controller: killing it must not disturb them).

Every acknowledged turn must be present exactly once afterwards (trace, episode,
fact), the turn in flight must be completed or cleanly retried, and the soul must
keep serving. Seeded and repeatable.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from actors import raycalls
from actors.placement import shard_index, store_name
from soul_runtime.errors import RuntimeUnavailable, TurnFailed

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TURNS = 18
SEED = 20261129


def _victim(runtime, soul_id: str, kind: str):
    if kind == "host":
        return raycalls.get_actor(runtime.placement(soul_id)["host"], runtime.cfg.namespace)
    if kind == "controller":
        return runtime.controller
    layer = {"episodic-store": "episodic", "semantic-store": "semantic"}[kind]
    name = store_name(layer, shard_index(soul_id, runtime.cfg.shards(layer), layer))
    return raycalls.get_actor(name, runtime.cfg.namespace)


def _sigkill(handle, log: list[int]) -> None:
    try:
        pid = int(raycalls.get(raycalls.call(handle, "pid"), timeout=30))
        os.kill(pid, signal.SIGKILL)
        log.append(pid)
    except Exception:  # the actor may be restarting already; the fault is then a no-op
        pass


def _turn_with_retries(soul, text: str, rid: str, deadline: float):
    while True:
        try:
            return soul.turn(text, user="ops", request_id=rid)
        except (RuntimeUnavailable, TurnFailed):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@pytest.mark.parametrize("kind", ["host", "episodic-store", "semantic-store", "controller"])
def test_sigkill_mid_stream_loses_nothing_acknowledged(runtime, soul_id, kind) -> None:
    rng = random.Random(f"{SEED}-{kind}")
    soul = runtime.soul(soul_id)
    kill_at = set(rng.sample(range(2, TURNS - 1), 2))
    killed: list[int] = []
    timers: list[threading.Timer] = []
    results = []
    deadline = time.monotonic() + 240
    for i in range(TURNS):
        rid = f"{soul_id}-req-{i}"
        text = f"Confirmed: the owner of Svc{i} is team Falcon{i}."
        if i in kill_at:  # kill while this turn is in flight
            timers.append(threading.Timer(rng.uniform(0.0, 0.04), _sigkill, (_victim(runtime, soul_id, kind), killed)))
            timers[-1].start()
        results.append(_turn_with_retries(soul, text, rid, deadline))
    for t in timers:  # every fault was injected (and its thread is done) before the checks
        t.join(60)
    assert len(killed) >= 1, "no fault was injected"

    # acknowledged turns: dense, ordered, each exactly once
    assert [r.seq for r in results] == list(range(1, TURNS + 1))
    traces = soul.traces(last=TURNS + 5)
    assert [t.seq for t in traces] == list(range(1, TURNS + 1))
    assert [t.request_id for t in traces] == [f"{soul_id}-req-{i}" for i in range(TURNS)]
    # their writes: one fact per turn, one episode per turn, no duplicates
    facts = {f.entity: f for f in soul.facts()}
    for i in range(TURNS):
        f = facts[f"svc{i}"]
        assert f.value == f"team Falcon{i}" and f.sources == (f"{soul_id}/{i + 1}/user",)
    sources = [s for e in soul.episodes() for s in e.sources]
    assert sorted(sources) == sorted(f"{soul_id}/{i + 1}/user" for i in range(TURNS))
    stats = soul.stats()
    assert stats["facts"] == TURNS and stats["episodes"] == TURNS and stats["indexed"] == TURNS
    # and the soul keeps serving, reading what it wrote
    after = soul.turn("Who owns Svc3?", user="ops")
    assert after.seq == TURNS + 1 and any("Falcon3" in it.text for it in after.recalled)
