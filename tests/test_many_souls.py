"""Thousands of souls on a small runtime: eviction, passivation and reactivation run for real.

Capacities are set low (16 active souls per host, 16 open stores per shard), so nearly every turn
activates a passivated soul and reopens its stores; each soul must still see exactly its own history.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

SOULS = 2000
IN_FLIGHT = 32


@pytest.fixture(scope="module")
def small_runtime(runtime):  # noqa: ARG001 - the session runtime starts Ray; this one shares it
    import soul_runtime
    data = Path(tempfile.mkdtemp(prefix="soul-many-"))
    rt = soul_runtime.connect(data_dir=str(data), namespace="many-souls", embedder="fast", host_capacity=16,
                              store_capacity=16, model="offline")
    yield rt
    rt.shutdown_actors()
    rt.close()
    shutil.rmtree(data, ignore_errors=True)  # its actors are gone: the 2,000 souls' files go too


def _text(i: int) -> str:
    return f"Note for ledger {i}: the delivery window for order {i * 7 + 3} moved to dock {i % 13}."


async def _first_turns(rt, ids: list[str]) -> list:
    sem = asyncio.Semaphore(IN_FLIGHT)

    async def one(i: int, sid: str):
        async with sem:
            return await rt.async_soul(sid).turn(_text(i), user="ops", at=1_780_000_000 + i)
    return await asyncio.gather(*(one(i, sid) for i, sid in enumerate(ids)))


def test_two_thousand_souls_each_keep_exactly_their_own_history(small_runtime) -> None:
    from actors import raycalls
    from actors.controller import host_name

    rt = small_runtime
    ids = [f"many-{i:05d}" for i in range(SOULS)]
    t0 = time.perf_counter()
    results = asyncio.run(_first_turns(rt, ids))
    elapsed = time.perf_counter() - t0
    assert [r.seq for r in results] == [1] * SOULS
    print(f"\n{SOULS} first turns in {elapsed:.1f} s ({SOULS / elapsed:.1f} turns/s, {IN_FLIGHT} in flight)")

    active = sum(len(raycalls.get(raycalls.call(raycalls.get_actor(host_name(i), rt.cfg.namespace),
                                                "active_souls"))) for i in range(rt.cfg.hosts))
    assert active <= 16 * rt.cfg.hosts  # the rest were passivated
    counters = [raycalls.get(raycalls.call(raycalls.get_actor(host_name(i), rt.cfg.namespace), "metrics_snapshot"))
                for i in range(rt.cfg.hosts)]
    assert sum(c.get("passivations", 0) for c in counters) >= SOULS - 16 * rt.cfg.hosts

    # reactivate a sample: each soul's trace holds its own words, and its next turn is its second
    rng = random.Random(11)
    for i in rng.sample(range(SOULS), 40):
        h = rt.soul(ids[i])
        (tr,) = h.traces(last=1)
        assert tr.query == _text(i) and tr.seq == 1
        r = h.turn(f"Where does order {i * 7 + 3} arrive?", user="ops", at=1_780_100_000 + i)
        assert r.seq == 2
        shown = " ".join(item.text for item in r.recalled)
        for j in rng.sample([j for j in range(SOULS) if j != i], 5):
            assert f"ledger {j}:" not in shown and f"order {j * 7 + 3} " not in shown
    assert len(rt.souls()) >= SOULS
