"""The latency benchmark: a fast run with the hash test embedder (shape of the result, sanity, plot, table), and
its figures on a fake clock with known costs (each figure the number worked out by hand)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from soul_apps.bench import latency as bench_latency
from tests.fakes import HashEmbedder

KEYS = {"search_p50_ms", "exact_p50_ms", "search_p99_ms", "exact_p99_ms", "index_recall_at_10",
        "write_ms_per_episode", "query_embed_p50_ms", "query_embed_p99_ms", "turn_overhead_p50_ms",
        "turn_overhead_p99_ms", "turn_stages_ms", "build_s", "notes", "ratios", "recall_p50_ms", "recall_p99_ms",
        "recall_stage_p50_ms", "turn_p50_ms", "turn_embed_p50_ms"}


def test_run_small(tmp_path: Path) -> None:
    calls: list[tuple[str, int, int]] = []
    res = bench_latency.run(sizes=(200, 1000), queries=20, embedder=HashEmbedder(), cache_dir=tmp_path / "cache",
                            workdir=tmp_path / "work", turns=40, writes=20,
                            progress=lambda what, done, total: calls.append((what, done, total)))
    assert KEYS <= set(res)
    json.dumps(res)  # JSON-ready
    for key in ("search_p50_ms", "exact_p50_ms", "search_p99_ms", "exact_p99_ms", "index_recall_at_10",
                "write_ms_per_episode", "build_s", "ratios", "recall_p50_ms", "turn_p50_ms", "turn_overhead_p50_ms",
                "turn_stages_ms", "recall_stage_p50_ms"):
        assert set(res[key]) == {"200", "1000"}, key
    for s in ("200", "1000"):
        assert 0.0 <= res["index_recall_at_10"][s] <= 1.0
        assert res["search_p50_ms"][s] > 0 and res["exact_p50_ms"][s] > 0 and res["write_ms_per_episode"][s] > 0
        assert res["search_p99_ms"][s] >= res["search_p50_ms"][s]
        assert res["exact_p99_ms"][s] >= res["exact_p50_ms"][s]
        assert res["build_s"][s] > 0
        assert math.isclose(res["ratios"][s], res["search_p50_ms"][s] / res["exact_p50_ms"][s], rel_tol=1e-2)
        assert set(res["expansion_sweep"][s]) == {"160", "256", "384", "512"}
    assert 0 < res["query_embed_p50_ms"] <= res["query_embed_p99_ms"]
    for s in ("200", "1000"):  # whole recall and instant-model turns at every size, by stage
        assert 0 < res["recall_p50_ms"][s] <= res["recall_p99_ms"][s]
        assert {"embed", "dense", "lexical", "score", "semantic", "procedural", "merge"} == \
            set(res["recall_stage_p50_ms"][s])
        assert sum(res["recall_stage_p50_ms"][s].values()) <= 3 * res["recall_p99_ms"][s]
        assert 0 < res["turn_overhead_p50_ms"][s] <= res["turn_overhead_p99_ms"][s]
        assert 0 < res["recall_cpu_p50_ms"][s] <= res["recall_cpu_p99_ms"][s]
        assert 0 < res["turn_overhead_cpu_p50_ms"][s] <= res["turn_overhead_cpu_p99_ms"][s]
        assert res["recall_cpu_p50_ms"][s] <= 1.5 * res["recall_p99_ms"][s]  # CPU time of a call within its wall
        assert 0 <= res["turn_embed_p50_ms"][s] < res["turn_p50_ms"][s]
        assert {"recall", "write", "inference"} <= set(res["turn_stages_ms"][s])
    assert res["store_episodes"] >= 1000 + 20 + 15  # bulk, timed writes, and the last size's turns
    assert any(n.startswith("1M skipped") for n in res["notes"])
    assert any(what.startswith("store 1000") for what, _, _ in calls)
    # the vectors were cached: a second corpus embedding reads them back
    assert list((tmp_path / "cache").glob("*.npy"))

    png = bench_latency.plot(res, tmp_path / "latency.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    console = Console(width=200, record=True)
    console.print(bench_latency.table(res))
    assert "1,000" in console.export_text()


def test_corpus_is_deterministic_and_distinct() -> None:
    a, qa, src = bench_latency.build_corpus(3000, 50)
    b, qb, _ = bench_latency.build_corpus(3000, 50)
    assert (a, qa) == (b, qb) and src == "templates"
    assert len(set(a)) == 3000 and not set(a) & set(qa)
    assert all(8 <= len(t) <= 300 for t in a + qa)


def test_embed_cache_round_trip(tmp_path: Path) -> None:
    emb = HashEmbedder()
    texts, _, _ = bench_latency.build_corpus(500, 0)
    v1, info1 = bench_latency.embed_cached(emb, texts, tmp_path)
    v2, info2 = bench_latency.embed_cached(emb, texts, tmp_path)
    assert not info1["cached"] and info2["cached"] and (v1 == v2).all() and v1.shape == (500, emb.dim)


def test_a_bulk_loaded_store_is_reused_by_the_next_run(tmp_path: Path) -> None:
    """--reuse-stores: the second run starts each size from the first run's bulk-loaded store (same contents,
    same counts) instead of loading it again; a different corpus or parameters would not match its key."""
    kw = dict(sizes=(100, 300), queries=5, embedder=HashEmbedder(), cache_dir=tmp_path / "cache", turns=8, writes=5,
              reuse_stores=True)
    first = bench_latency.run(workdir=tmp_path / "w1", **kw)
    second = bench_latency.run(workdir=tmp_path / "w2", **kw)
    assert "stores_reused" not in first and second["stores_reused"] == [100, 300]
    assert second["store_episodes"] == first["store_episodes"] >= 300
    assert second["bulk_load_per_s"] == first["bulk_load_per_s"]
    other = bench_latency.run(workdir=tmp_path / "w3", **{**kw, "writes": 6})
    assert "stores_reused" not in other


class FakeClock:
    """The benchmark's ``time``: wall and CPU time move only when a test says so."""

    def __init__(self) -> None:
        self.wall = self.cpu = 100.0

    def advance(self, ms: float, cpu_ms: float | None = None) -> None:
        self.wall += ms / 1000
        self.cpu += (ms if cpu_ms is None else cpu_ms) / 1000

    def perf_counter(self) -> float:
        return self.wall

    def process_time(self) -> float:
        return self.cpu


def test_index_figures_are_the_times_the_operations_took(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Known costs in, exact figures out: a search of query i takes i+1 ms, an exact scan 10 ms, the build 750 ms."""
    from soul_runtime.memory.vector_index import IndexParams, VectorIndex

    clock = FakeClock()
    monkeypatch.setattr(bench_latency, "time", clock)
    rng = np.random.default_rng(7)
    vecs = rng.normal(size=(50, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    qv = vecs[[3, 11, 25, 40]]
    cost = {q.tobytes(): i + 1.0 for i, q in enumerate(qv)}

    class ScanCosts10ms(np.ndarray):
        def __matmul__(self, other: Any) -> Any:
            clock.advance(10)
            return np.asarray(self) @ other

    search, rebuild = VectorIndex.search, VectorIndex.rebuild

    def timed_search(self: VectorIndex, vector: np.ndarray, count: int) -> list[tuple[int, float]]:
        clock.advance(cost[np.asarray(vector).tobytes()])
        return search(self, vector, count)

    def timed_rebuild(self: VectorIndex, rows: Any, applied_seq: int) -> None:
        clock.advance(750)
        rebuild(self, rows, applied_seq)
    monkeypatch.setattr(VectorIndex, "search", timed_search)
    monkeypatch.setattr(VectorIndex, "rebuild", timed_rebuild)
    res: dict[str, Any] = {k: {} for k in ("build_s", "search_p50_ms", "search_p99_ms", "index_recall_at_10",
                                           "exact_p50_ms", "exact_p99_ms", "ratios", "expansion_sweep",
                                           "expansion_search_needed")}
    bench_latency._index_part(50, vecs.view(ScanCosts10ms), qv, "test", tmp_path, res)
    # p50 of 1, 2, 3, 4 ms is 2.5; p99 by linear interpolation is 3 + 0.97 * (4 - 3)
    assert (res["search_p50_ms"]["50"], res["search_p99_ms"]["50"]) == (2.5, 3.97)
    assert (res["exact_p50_ms"]["50"], res["exact_p99_ms"]["50"]) == (10.0, 10.0)
    assert res["ratios"]["50"] == 0.25 and res["build_s"]["50"] == 0.75
    assert res["index_recall_at_10"]["50"] == 1.0  # 50 points: the index finds the exact top 10
    efs = sorted({IndexParams().expansion_search, *bench_latency.EF_TRIES})
    assert res["expansion_sweep"]["50"] == {str(ef): {"recall_at_10": 1.0, "p50_ms": 2.5, "p99_ms": 3.97}
                                            for ef in efs}
    assert res["expansion_search_needed"]["50"] == efs[0]


def test_recall_and_turn_figures_are_the_times_they_took(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recall i takes (i+1) * 2 ms wall and half that in CPU; timed turns take 10..50 ms, 4 ms of it embedding, with
    stages of 2 + 1 + 3 ms in their traces: every recall and turn figure is the number worked out by hand."""
    from soul_runtime.memory.soul_memory import SoulMemory

    clock = FakeClock()
    monkeypatch.setattr(bench_latency, "time", clock)

    class CountingEmbedder(HashEmbedder):
        ms = 0.0

    class TimedMemory(SoulMemory):
        def recall(self, query: str, k: int, **kw: Any) -> Any:
            ms = 2.0 * (int(query.split()[-1]) + 1)
            clock.advance(ms, cpu_ms=ms / 2)
            kw["timings"].update(embed=1.0, dense=ms - 1.0)
            return []

    emb = CountingEmbedder()
    turns: list[str] = []

    class TimedSoul:
        def __init__(self, *a: Any, **kw: Any) -> None:
            pass

        def turn(self, text: str, **kw: Any) -> Any:
            j = len(turns)
            turns.append(text)
            ms = 999.0 if j < 3 else 10.0 * (j - 2)  # the first three are not timed
            clock.advance(ms, cpu_ms=ms / 2)
            emb.ms += 4.0
            return SimpleNamespace(turn_id=f"t{j}")

        def trace(self, turn_id: str) -> Any:
            return SimpleNamespace(timings_ms={"recall": 2.0, "inference": 1.0, "write": 3.0})

        def close(self) -> None:
            pass
    monkeypatch.setattr(bench_latency, "SoulMemory", TimedMemory)
    monkeypatch.setattr(bench_latency, "Soul", TimedSoul)
    keys = ("recall_p50_ms recall_p99_ms recall_cpu_p50_ms recall_cpu_p99_ms recall_stage_p50_ms "
            "recall_stage_p99_ms turn_p50_ms turn_p99_ms turn_embed_p50_ms turn_overhead_p50_ms "
            "turn_overhead_p99_ms turn_overhead_cpu_p50_ms turn_overhead_cpu_p99_ms turn_stages_ms").split()
    res: dict[str, Any] = {k: {} for k in keys}
    added = bench_latency._soul_part(100, tmp_path / "soul", emb,  # type: ignore[arg-type]
                                     [f"query {i}" for i in range(5)], [f"turn {j}" for j in range(8)], bench_latency.T0, 5, res,
                                     lambda what, done, total: None)
    assert added == 0 and len(turns) == 8
    r = {k: res[k]["100"] for k in keys}
    assert (r["recall_p50_ms"], r["recall_p99_ms"]) == (6.0, 9.92)  # of 2, 4, 6, 8, 10 ms
    assert (r["recall_cpu_p50_ms"], r["recall_cpu_p99_ms"]) == (3.0, 4.96)
    assert r["recall_stage_p50_ms"] == {"embed": 1.0, "dense": 5.0}
    assert r["recall_stage_p99_ms"] == {"embed": 1.0, "dense": 8.92}
    assert (r["turn_p50_ms"], r["turn_p99_ms"]) == (30.0, 49.6)  # of 10, 20, 30, 40, 50 ms
    assert r["turn_embed_p50_ms"] == 4.0
    assert (r["turn_overhead_p50_ms"], r["turn_overhead_p99_ms"]) == (26.0, 45.6)
    assert (r["turn_overhead_cpu_p50_ms"], r["turn_overhead_cpu_p99_ms"]) == (11.0, 20.8)  # half the wall, less 4
    assert r["turn_stages_ms"] == {"recall": 2.0, "inference": 1.0, "write": 3.0, "checkpoint_and_other": 24.0}
