"""Retention and passivation run by themselves: pure decisions with an explicit clock, timers that call them.

No Ray: the host and shard classes are used as plain objects (their timers are plain threads).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from actors import soul_host
from actors.layer_shard import LayerShard
from actors.placement import store_of
from actors.schedule import (
    PART_HOLD_MAX_S,
    SizeTable,
    Ticker,
    beyond_capacity,
    over_capacity,
    part_hold,
    sweep_due,
    to_passivate,
    within_capacity,
)
from actors.settings import RuntimeConfig, fd_capacity, process_capacity
from actors.soul_host import SoulHost
from soul_runtime.clock import DAY
from soul_runtime.config import MemoryConfig, SoulConfig
from soul_runtime.embedding.choice import default_embedder
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.offline import OfflineModel

T0 = 1_780_000_000.0


def test_passivation_policy_takes_idle_then_least_recently_used() -> None:
    last = {"a": 0.0, "b": 50.0, "c": 90.0, "d": 99.0}  # LRU order
    assert to_passivate(last, 100.0, idle_s=40, capacity=10) == ["a", "b"]
    assert to_passivate(last, 100.0, idle_s=600, capacity=2) == ["a", "b"]
    assert to_passivate(last, 100.0, idle_s=30, capacity=1) == ["a", "b", "c"]
    assert to_passivate(last, 100.0, idle_s=600, capacity=10) == []
    assert sweep_due(None, 5.0, 10.0) and not sweep_due(0.0, 5.0, 10.0) and sweep_due(0.0, 10.0, 10.0)
    assert not sweep_due(None, 5.0, 0.0)  # 0: off


def test_capacity_counts_bytes_as_well_as_entries() -> None:
    lru = ["a", "b", "c", "d"]  # oldest first
    sizes = {"a": 10, "b": 500, "c": 20, "d": 30}
    assert beyond_capacity(lru, sizes, capacity=10, max_bytes=0) == []
    assert beyond_capacity(lru, sizes, capacity=3, max_bytes=0) == ["a"]
    assert beyond_capacity(lru, sizes, capacity=10, max_bytes=555) == ["a"]  # 560 is over, 550 fits
    assert beyond_capacity(lru, sizes, capacity=10, max_bytes=100) == ["a", "b"]  # drop until 50 fits
    assert beyond_capacity(lru, sizes, capacity=10, max_bytes=25) == ["a", "b", "c"]  # d alone is over: it stays
    assert beyond_capacity(lru, {}, capacity=10, max_bytes=1) == []  # unknown sizes count 0
    table = SizeTable()
    for k, v in sizes.items():
        table[k] = v
    table["b"] = 100  # replaced, not added
    table.pop("c")
    table.pop("zz")  # absent: nothing changes
    del table["a"]
    assert table.total == sum(table.values()) == 130
    assert within_capacity(2, table.total, capacity=2, max_bytes=130) and within_capacity(2, table.total, 2, 0)
    assert not within_capacity(3, table.total, capacity=2, max_bytes=0)
    assert not within_capacity(2, table.total, capacity=2, max_bytes=129)
    assert over_capacity({"b": 0, "d": 0}, table, capacity=2, max_bytes=130) == []
    assert over_capacity({"b": 0, "d": 0}, table, capacity=2, max_bytes=129) == ["b"]  # oldest goes first
    last = {"a": 0.0, "b": 50.0, "c": 90.0, "d": 99.0}
    assert to_passivate(last, 100.0, idle_s=600, capacity=10, sizes=sizes, max_bytes=100) == ["a", "b"]
    assert to_passivate(last, 100.0, idle_s=40, capacity=10, sizes=sizes, max_bytes=40) == ["a", "b", "c"]


def test_episodic_shards_split_the_cores_between_their_embedders(tmp_path: Path) -> None:
    from actors.layer_shard import embed_threads
    from soul_runtime.embedding.choice import make_embedder
    from soul_runtime.embedding.minilm import MiniLMEmbedder
    assert embed_threads(2, 2) == 1 and embed_threads(8, 2) == 2 and embed_threads(1, 4) == 1 and embed_threads(4, 0) == 2
    one = make_embedder("default", threads=1)
    assert isinstance(one, MiniLMEmbedder) and one._threads == 1
    import numpy as np
    assert np.allclose(make_embedder("default").embed(["the same vectors"]), one.embed(["the same vectors"]), atol=1e-5)


def test_automatic_capacity_follows_the_open_file_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """0 (the default) sizes host and store capacities to the process's open-file limit: 3 fds a soul beside a
    reserve, bounded both ways; a number given is kept."""
    assert fd_capacity(1024) == (1024 - 256) // 3 == 256
    assert fd_capacity(20_000) == 4096 and fd_capacity(10**9) == 4096  # at most MAX_AUTO_CAPACITY
    assert fd_capacity(100) == 16  # a tiny limit still hosts a few souls
    assert all(3 * fd_capacity(n) + 256 <= n for n in (1024, 4096, 20_000, 65_536))  # the fds fit the limit
    import resource
    monkeypatch.setattr(resource, "getrlimit", lambda which: (2048, 4096))
    assert process_capacity(0) == fd_capacity(2048) == 597 and process_capacity(7) == 7
    assert LayerShard("semantic", str(tmp_path), asdict(MemoryConfig()), 0).capacity == 597
    clock = Clock()
    h = host(tmp_path, clock, monkeypatch, host_capacity=0)
    assert h.capacity == 597
    assert RuntimeConfig(data_dir=str(tmp_path)).host_capacity == 0


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class NoMemory:
    """The host's memory port without store actors (these tests only activate and passivate souls)."""

    def __init__(self, soul_id: str, stores: object, directory: object = None) -> None:
        self.fenced: list[int] = []

    def fence(self, epoch: int) -> None:
        self.fenced.append(epoch)


def host(tmp: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch, **cfg: object) -> SoulHost:
    monkeypatch.setattr(soul_host, "RemoteMemory", NoMemory)
    conf = {"data_dir": str(tmp), "idle_passivate_s": 60, "host_capacity": 8, "model": "offline", **cfg}
    return SoulHost("h0", conf, model=OfflineModel(), clock=clock)


def test_host_passivates_idle_souls_by_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()

    async def main() -> None:
        h = host(tmp_path, clock, monkeypatch, idle_check_s=0.02)  # made on a running loop: its ticker runs
        try:
            for sid in ("a", "b"):
                assert await h.last_seq(sid) == 0  # activates the soul
            clock.t += 30
            await h.last_seq("b")
            await asyncio.sleep(0.2)  # many ticks: nobody is idle yet
            assert h.active_souls() == ["a", "b"] and h._ticker is not None and not h._ticker.done()
            clock.t += 45  # a: 75 s idle, b: 45 s
            deadline = time.monotonic() + 5
            while (h.active_souls() != ["b"] or not h.metrics.local["passivations:idle"]) \
                    and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert h.active_souls() == ["b"]
            assert h.metrics.local["passivations:idle"] == 1
        finally:
            await h.stop()
    asyncio.run(main())


def test_host_timer_is_off_with_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()

    async def main() -> None:
        h = host(tmp_path, clock, monkeypatch, idle_check_s=0)
        await h.last_seq("a")
        clock.t += 1000
        assert h._ticker is None and h.active_souls() == ["a"]
        assert await h.passivate_idle() == 1 and h.active_souls() == []
    asyncio.run(main())


def test_ticker_survives_a_failing_tick() -> None:
    errors: list[BaseException] = []
    calls = []

    def tick() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
    t = Ticker(0.01, tick, name="t", on_error=errors.append)
    deadline = time.monotonic() + 5
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    t.stop()
    assert len(calls) >= 3 and len(errors) == 1


def _soul_with_history(d: Path, embedder: object) -> None:
    """Old episodes, one retracted (archived) fact."""
    mem = SoulMemory(d, embedder=embedder)  # type: ignore[arg-type]
    soul = Soul("x", d, memory=mem, model=OfflineModel(), config=SoulConfig())
    soul.turn("The backup bucket for Tendril is archive-7.", user="maya", at=T0)
    soul.turn("Yes, that's right.", user="maya", at=T0 + 60)
    soul.turn("Tendril no longer uses archive-7.", user="maya", at=T0 + 120)
    soul.close()
    mem.close()


def test_shards_sweep_their_souls_on_schedule(tmp_path: Path) -> None:
    emb = default_embedder()
    cfg = MemoryConfig(episodic_ttl_days=30, archived_fact_ttl_days=10)
    souls = ["s1", "s2", "s3"]
    for sid in souls:
        _soul_with_history(tmp_path / "souls" / sid, emb)
    sem = LayerShard("semantic", str(tmp_path), asdict(cfg), 256, "default", 0, 1, 3600.0)
    epi = [LayerShard("episodic", str(tmp_path), asdict(cfg), 256, "default", i, 2, 3600.0) for i in range(2)]
    assert sorted(epi[0].my_souls() + epi[1].my_souls()) == souls
    assert all(store_of(s, "episodic", 2) == e.name for e in epi for s in e.my_souls())
    assert sem.read("s1", "stats")["archived_facts"] == 1

    got = sem.sweep_due(T0 + 5 * DAY)  # archived 5 days ago: kept
    assert got == {"facts_purged": 0, "souls_swept": 3}
    assert sem.sweep_due(T0 + 5 * DAY + 1800) == {}  # not due again yet (every hour)
    got = sem.sweep_due(T0 + 11 * DAY)
    assert got["facts_purged"] == 3 and sem.read("s2", "stats")["archived_facts"] == 0
    assert sem.metrics.local["sweeps:semantic"] == 6 and sem.metrics.local["swept:semantic,facts_purged"] == 3

    before = sum(e.read(s, "stats")["episodes"] for e in epi for s in e.my_souls())
    assert before >= 3 and all(e.sweep_due(T0 + 20 * DAY)["episodes_deleted"] == 0 for e in epi if e.my_souls())
    deleted = sum(e.sweep_due(T0 + 31 * DAY).get("episodes_deleted", 0) for e in epi)
    assert deleted == before and all(e.read(s, "stats")["episodes"] == 0 for e in epi for s in e.my_souls())


def test_shards_without_a_ttl_never_sweep(tmp_path: Path) -> None:
    _soul_with_history(tmp_path / "souls" / "s1", default_embedder())
    sem = LayerShard("semantic", str(tmp_path), asdict(MemoryConfig()), 256, "default", 0, 1, 3600.0)
    proc = LayerShard("procedural", str(tmp_path), asdict(MemoryConfig(archived_fact_ttl_days=1)), 256, "default", 0, 1,
                      3600.0)
    assert sem.retention_every_s == 0 and proc.retention_every_s == 0
    assert sem.sweep_due(T0 + 1000 * DAY) == {} and sem.read("s1", "stats")["archived_facts"] == 1


def test_a_shard_closes_stores_beyond_its_memory_budget(tmp_path: Path) -> None:
    """Eviction by bytes: the open stores' memory (vector index + SQLite cache) stays within the budget; the
    most recently used store stays open; an evicted store reopens with its data."""
    emb = default_embedder()
    souls = ["m1", "m2", "m3", "m4"]
    for sid in souls:
        _soul_with_history(tmp_path / "souls" / sid, emb)
    probe = LayerShard("episodic", str(tmp_path), asdict(MemoryConfig()), 256, "default", 0, 1, 0.0,
                       capacity_bytes=1 << 40)
    counts = {sid: probe.read(sid, "stats")["episodes"] for sid in souls}
    assert sorted(probe.open) == souls and all(v > 0 for v in probe.sizes.values())
    biggest = max(probe.sizes.values())
    budget = int(2.5 * biggest)
    for sid in souls:
        probe._close(sid)
    shard = LayerShard("episodic", str(tmp_path), asdict(MemoryConfig()), 256, "default", 0, 1, 0.0,
                       capacity_bytes=budget)
    for sid in souls:
        assert shard.read(sid, "stats")["episodes"] == counts[sid]
        assert sum(shard.sizes.values()) <= budget and list(shard.open)[-1] == sid
    assert 1 <= len(shard.open) <= 2 and "m1" not in shard.open
    assert shard.read("m1", "stats")["episodes"] == counts["m1"]  # reopened from disk, nothing lost
    unlimited = LayerShard("episodic", str(tmp_path), asdict(MemoryConfig()), 256, "default", 0, 1, 0.0)
    for sid in souls:
        unlimited.read(sid, "stats")
    assert len(unlimited.open) == 4  # no byte budget: the count alone decides


def test_an_evicted_store_closes_off_the_callers_path_and_its_soul_waits_for_the_close(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The call that makes room does not wait for the evicted store's close (it runs on the shard's closing
    thread); a call for the evicted soul waits for that close, then reopens the store with its data."""
    import threading

    from soul_runtime.memory.semantic import SemanticStore
    shard = LayerShard("semantic", str(tmp_path), asdict(MemoryConfig()), 1, "default", 0, 1, 0.0)
    for sid in ("a", "b"):  # souls that exist (a read of an unknown soul creates nothing)
        (tmp_path / "souls" / sid).mkdir(parents=True)
    facts = {sid: shard.read(sid, "stats") for sid in ("a", "b")}  # b's opening evicted a
    shard.wait_closed()
    gate, closing = threading.Event(), threading.Event()
    real_close = SemanticStore.close

    def slow_close(self: SemanticStore) -> None:
        closing.set()
        assert gate.wait(10)
        real_close(self)
    monkeypatch.setattr(SemanticStore, "close", slow_close)
    assert shard.read("a", "stats") == facts["a"]  # evicts b, whose close now hangs at the gate: a call returns
    assert closing.wait(10) and list(shard.open) == ["a"]
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(shard.read("b", "stats")))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not got  # b's call waits for b's close
    gate.set()
    waiter.join(10)
    assert got == [facts["b"]] and shard.wait_closed() == 1 and list(shard.open) == ["b"]
    assert set(shard.locks) <= {"b"}  # no lock entry left behind for a closed store


def test_a_host_closes_evicted_souls_off_the_activating_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """An activation beyond capacity passivates the least recently used soul on the host's closing thread:
    the activating call does not wait for it, the victim leaves the active souls at once, and it is
    passivated (counted, files closed) once the closer ran; with nothing due, no pass over the souls."""
    import threading

    from soul_runtime.loop.soul import Soul as SoulClass
    clock = Clock()

    async def main() -> None:
        h = host(tmp_path, clock, monkeypatch, host_capacity=2)
        for sid in ("a", "b"):
            await h.last_seq(sid)
        gate = threading.Event()
        real_close = SoulClass.close

        closed: list[str] = []

        def slow_close(self: SoulClass) -> None:
            assert gate.wait(10)
            real_close(self)
            closed.append(self.soul_id)
        monkeypatch.setattr(SoulClass, "close", slow_close)
        assert await h.last_seq("c") == 0  # returns while a's close waits at the gate
        assert h.active_souls() == ["b", "c"] and h.metrics.local["passivations:capacity"] == 1 and closed == []
        gate.set()
        await h.wait_closed()
        assert closed == ["a"] and await h.last_seq("a") == 0  # reactivates from its closed files
        await h.wait_closed()
        assert h.active_souls() == ["c", "a"] and closed == ["a", "b"]
        clock.t += 30  # nobody idle (60 s), within capacity: nothing to do
        assert await h._evict() == 0 and h.active_souls() == ["c", "a"]
        clock.t += 31  # c idle for 61 s: the same call passivates it
        await h.last_seq("a")
        assert await h._evict() == 1 and h.active_souls() == ["a"]
    asyncio.run(main())


def test_a_host_over_capacity_by_count_takes_its_oldest_souls_without_a_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An activation beyond capacity passivates the least recently used souls straight from the front of the
    LRU (no pass over every active soul, which grew with the capacity); idle souls still go by the policy."""
    clock = Clock()

    async def main() -> None:
        h = host(tmp_path, clock, monkeypatch, host_capacity=3)
        for sid in ("a", "b", "c"):
            await h.last_seq(sid)
            clock.t += 1
        await h.last_seq("a")  # a is the most recent now: b is the oldest

        def no_pass(*a: object, **k: object) -> list[str]:
            raise AssertionError("a pass over every active soul")
        real = soul_host.to_passivate
        monkeypatch.setattr(soul_host, "to_passivate", no_pass)
        await h.last_seq("d")
        await h.wait_closed()
        assert h.active_souls() == ["c", "a", "d"] and h.metrics.local["passivations:capacity"] == 1
        monkeypatch.setattr(soul_host, "to_passivate", real)
        clock.t += 600  # c, a and d idle past idle_passivate_s (60 s): the policy decides
        assert await h._evict() == 3 and h.active_souls() == []
    asyncio.run(main())



def test_a_finished_turns_answer_waits_a_few_milliseconds_at_most_for_its_batch() -> None:
    assert part_hold(0.0) == 0.0 and part_hold(-1.0) == 0.0  # an instant batch: nothing held
    assert part_hold(0.04) == pytest.approx(0.002)  # 5 % of the time the batch has run
    assert part_hold(0.1) == part_hold(60.0) == PART_HOLD_MAX_S


@pytest.mark.parametrize("hold_s", [0.0, 0.4])
def test_a_hosts_answers_in_parts_carry_the_turns_that_finish_together(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hold_s: float) -> None:
    """Turns of one batch that finish within the hold of the first travel in one part; a turn that finishes
    well after (a cold soul, a slow model call) comes alone, and no answer waits for it."""
    monkeypatch.setattr(soul_host, "part_hold", lambda running_s: hold_s)
    done_at = [0.0, 0.1, 0.1, 1.5]

    async def main() -> None:
        h = host(tmp_path, Clock(), monkeypatch)

        async def run_one(item: tuple[str, str, int | None, str, dict[str, object]]) -> str:
            await asyncio.sleep(done_at[int(item[0])])
            return f"answer {item[0]}"
        monkeypatch.setattr(h, "_run_one", run_one)
        got = [part async for part in h.run_stream([(str(i), "turn", None, f"r{i}", {}) for i in range(4)])]
        parts = [[i for i, _ in part] for part in got]
        assert parts == [[0, 1, 2], [3]] if hold_s else parts[0] == [0] and parts[-1] == [3], parts
        assert [answer for part in got for _, answer in part] == [f"answer {i}" for i in range(4)]
        await h.stop()

    asyncio.run(main())
