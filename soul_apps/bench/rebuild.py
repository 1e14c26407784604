"""``soul bench rebuild``: how long a soul takes to open on a node with no cache of it, with a PostgreSQL storage
(its layers' caches rebuilt from the server's rows: SQLite tables, full-text index, vector index) — and, in the
same run, how long it takes to open from a cache that is there (the node that served it last).

The episodes are LoCoMo's messages (the development conversations), cycled with their position appended until
there are as many as asked, imported into one soul (an export built here, the fast embedder's vectors)."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack

from soul_apps.bench.locomo import conversations
from soul_runtime.memory.export import pack_export
from soul_runtime.records import Store

OPEN_QUERY = "what did they say about the weekend trip"


def export_of(texts: Sequence[str], embedder: Any, at0: float = 1_700_000_000.0) -> bytes:
    """An export of one soul holding an episode per text (sessions of 20, an hour apart)."""
    rows, sessions = [], []
    for start in range(0, len(texts), 512):
        chunk = list(texts[start:start + 512])
        vecs = embedder.embed(chunk)
        for j, (text, vec) in enumerate(zip(chunk, vecs, strict=True)):
            i = start + j
            session = f"s{i // 20}"
            if i % 20 == 0:
                sessions.append([session, i // 20, at0 + i * 3600.0])
            rows.append([i + 1, at0 + i * 3600.0, "user", text, msgpack.packb([f"m{i}"]), msgpack.packb([]),
                         msgpack.packb([]), session, i // 20, 0, f"t{i}", vec.astype("float32").tobytes(), 0, text])
    empty: dict[str, list[Any]] = {"applied": []}
    return pack_export({Store.EPISODIC: {"embedder_id": embedder.embedder_id, "dim": embedder.dim, "episodes": rows,
                                         "sessions": sessions, "applied": []},
                        Store.SEMANTIC: {"facts": [], "observations": [], **empty},
                        Store.PROCEDURAL: {"procedures": [], "runs": [], **empty}})


def texts_from(locomo: str | Path, n: int) -> list[str]:
    said = [t.text for _, turns, _ in conversations(locomo) for t in turns if t.text.strip()]
    return [f"{said[i % len(said)]} ({i})" for i in range(n)]


def run(storage: str, locomo: str | Path, sizes: Sequence[int] = (1000, 10_000, 100_000), repeats: int = 5,
        progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    from soul_runtime.embedding.choice import make_embedder
    from soul_runtime.memory.soul_memory import SoulMemory
    from soul_runtime.memory.sqlite_db import use_storage

    use_storage(storage)
    embedder = make_embedder("fast")
    root = Path(tempfile.mkdtemp(prefix="soul-bench-rebuild-"))
    out: list[dict[str, Any]] = []
    try:
        for n in sizes:
            soul = f"rebuild-{n}-{int(time.time())}"
            t0 = time.perf_counter()
            m = SoulMemory(root / "writer" / "souls" / soul, embedder=embedder)
            m.import_(export_of(texts_from(locomo, n), embedder))
            m.close()
            progress(f"{n} episodes imported ({time.perf_counter() - t0:.1f} s)")
            cold, warm = [], []
            for r in range(repeats):
                node = root / f"node{r}" / "souls" / soul
                t0 = time.perf_counter()
                m = SoulMemory(node, embedder=embedder)
                got = m.recall(OPEN_QUERY, 8, at=1_700_000_000.0 + n * 3600.0)
                cold.append(time.perf_counter() - t0)
                mirror = getattr(m.episodic.db, "mirror", None)
                assert got and mirror is not None and mirror.rebuilt
                m.close()
                t0 = time.perf_counter()
                m = SoulMemory(node, embedder=embedder)  # the cache this node now has
                m.recall(OPEN_QUERY, 8, at=1_700_000_000.0 + n * 3600.0)
                warm.append(time.perf_counter() - t0)
                m.close()
                shutil.rmtree(root / f"node{r}")
            out.append({"episodes": n, "no_cache_p50_s": round(statistics.median(cold), 3),
                        "no_cache_max_s": round(max(cold), 3), "cache_p50_s": round(statistics.median(warm), 3),
                        "repeats": repeats})
            progress(f"{n} episodes: no cache {out[-1]['no_cache_p50_s']} s, cache {out[-1]['cache_p50_s']} s (p50)")
    finally:
        use_storage("local")
        shutil.rmtree(root, ignore_errors=True)
    return {"what": "opening a soul and its first recall on a node with no cache (rebuilt from PostgreSQL) and "
                    "with the cache there; LoCoMo messages cycled (development data), fast embedder",
            "sizes": out}
