"""A fast run of the latency benchmark with the hash test embedder: shape of the result, sanity, plot, table."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console

from soul_runtime.bench import latency as bench_latency
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
