"""Latency of one soul as its store grows: ``run()`` measures, ``table()``/``plot()`` show, ``main()`` is the CLI.

Real text throughout (random vectors understate HNSW recall): LoCoMo sentences (``locomo_dir``, read at run
time, never copied) recombined, or a deterministic template generator; embedded by the default embedder and
cached as ``.npy`` keyed by corpus + embedder. Per store size N: a production :class:`VectorIndex` vs an exact
numpy scan (p50/p99, recall@10, an ``expansion_search`` sweep); one-episode writes through a real
:class:`EpisodicStore` (vectors from a lookup table, so it times storage, not embedding); query-embedding
time; and the per-turn overhead of an in-process :class:`Soul` with an instant model, split by stage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from soul_apps.bench import fsyncs
from soul_runtime.config import MemoryConfig, SoulConfig
from soul_runtime.embedding.base import Embedder
from soul_runtime.embedding.choice import default_embedder
from soul_runtime.embedding.fast import FastEmbedder
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.episodic import EpisodicStore
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.memory.vector_index import IndexParams, VectorIndex
from soul_runtime.models.base import (
    Exchange,
    LanguageModel,
    MemoryDecision,
    ModelReply,
    ReplyRequest,
    TaskClassification,
)
from soul_runtime.owner_only import make_dir, private_umask, restrict, write_file
from soul_runtime.records import Extraction, Op, WriteRequest

__all__ = ["run", "table", "plot", "main", "build_corpus", "InstantModel"]

Progress = Callable[[str, int, int], None]
EF_TRIES = (160, 256, 384, 512)
T0 = 1_700_000_000.0  # episode timestamps start here (Nov 2023), 10 minutes apart
_NAMES = ("Alice Bruno Chen Dana Elif Farah Gustavo Hana Ivan Jun Kemal Lena Marta Nico Olu Priya Quinn Rosa Sven "
          "Tariq Uma Viktor Wen Ximena Yusuf Zoe Amara Boris Carmen Dmitri Esther Femi").split()
_VERBS = ("adopted visited cooked painted repaired bought sold lost found booked cancelled finished started "
          "recommended borrowed returned photographed planned discussed reviewed rehearsed organised skipped").split()
_OBJECTS = ("a rescue dog|the old bicycle|a lasagna for the team|a trip to Lisbon|the quarterly report|a pottery class|"
            "the garden fence|a used piano|tickets for the jazz festival|a sourdough loaf|the database migration|"
            "a birthday party for her niece|the leaking kitchen tap|a camping trip|a marathon training plan|"
            "the wedding playlist|a job interview|a charity bake sale|the new apartment lease|a vegan cookbook|"
            "a watercolour of the harbour|the flight to Osaka|the team offsite|a chess tournament|the car insurance|"
            "a volunteer shift at the shelter|the thesis chapter|a guitar lesson|a hiking route in the Alps").split("|")
_TIMES = ("last Monday|yesterday evening|two weeks ago|at the weekend|this morning|in March|before the holidays|"
          "on her birthday|after work|last summer|on {d} {m}|around {d} {m}").split("|")
_TAILS = ("| with her sister| because the deadline moved| after a long meeting| and felt relieved| for the first time"
          "| despite the rain| with two colleagues| on a tight budget| again").split("|")
_MONTHS = "January February March April May June July August September October November December".split()
_JOIN = (", and ", " because ", ", while ", " after ", "; later ", ", so ", " when ")
_FRAME = ("{n}: {s}", "{n} said {s}", "{n} mentioned that {s}", "{s}")


def _pct(xs: Sequence[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(xs, dtype=np.float64), q)), 4) if len(xs) else float("nan")


def _template(rng: random.Random) -> str:
    t = rng.choice(_TIMES).format(d=rng.randint(1, 28), m=rng.choice(_MONTHS))
    return f"{rng.choice(_NAMES)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {t}{rng.choice(_TAILS)}."


def _locomo_sentences(locomo_dir: str | Path) -> tuple[list[str], list[str]]:
    from soul_apps.bench.embedders import load_locomo

    convs = load_locomo(locomo_dir, categories=())
    speakers = sorted({s for c in convs for _, s, _ in c.turns if s})
    sents = [s.strip() for c in convs for _, _, t in c.turns for s in re.split(r"(?<=[.!?])\s+", t)]
    return list(dict.fromkeys(s for s in sents if 4 <= len(s.split()) and len(s) <= 200)), speakers


def _vary(s: str, rng: random.Random, speakers: Sequence[str]) -> str:
    for sp in speakers:
        if sp in s:
            s = s.replace(sp, rng.choice(_NAMES))
    s = re.sub(r"\b\d{1,4}\b", lambda m: str(max(1, int(m.group()) + rng.randint(-3, 3))), s)
    return re.sub(r"\b(" + "|".join(_MONTHS) + r")\b", lambda m: rng.choice(_MONTHS), s)


def build_corpus(n: int, held_out: int, locomo_dir: str | Path | None = None,
                 seed: int = 7) -> tuple[list[str], list[str], str]:
    """``n`` distinct episode-like texts (≤ 300 chars), ``held_out`` distinct query texts not among them, source."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[str] = []
    queries: list[str] = []

    def take(t: str, into: list[str]) -> None:
        t = " ".join(t.split())
        if 8 <= len(t) <= 300 and t not in seen:
            seen.add(t)
            into.append(t)

    if locomo_dir is not None:
        sents, speakers = _locomo_sentences(locomo_dir)
        if len(sents) < 100:
            raise ValueError(f"{locomo_dir}: only {len(sents)} usable sentences")
        rng.shuffle(sents)
        hold = min(held_out, len(sents) // 4)
        for j, s in enumerate(sents):
            take(s, queries if j < hold else out)
        pool = sents[hold:]
        guard = 0
        while len(out) < n and guard < 50 * n:
            guard += 1
            base = rng.choice(pool).rstrip(".!?")
            parts = [p.strip() for p in re.split(r",|;| but | and | because ", rng.choice(pool)) if len(p.split()) >= 3]
            if not parts:
                continue
            clause = rng.choice(parts).rstrip(".!?")
            clause = clause if clause[:2] == "I " or clause[:2].isupper() else clause[:1].lower() + clause[1:]
            s = base + rng.choice(_JOIN) + clause + "."
            take(rng.choice(_FRAME).format(n=rng.choice(_NAMES), s=_vary(s, rng, speakers)), out)
        source = f"locomo-recombined ({len(sents)} sentences from {locomo_dir})"
    else:
        source = "templates"
    while len(queries) < held_out:
        take(_template(rng), queries)
    while len(out) < n:
        take(_template(rng), out)
    return out[:n], queries[:held_out], source


def embed_cached(embedder: Embedder, texts: list[str], cache_dir: Path,
                 progress: Progress | None = None, chunk: int = 4096) -> tuple[np.ndarray, dict[str, Any]]:
    """Vectors of ``texts`` (cached as .npy keyed by corpus + embedder), and how fast they were embedded."""
    h = hashlib.sha256("\x00".join([embedder.embedder_id, str(embedder.dim), *texts]).encode("utf-8"))
    key = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', embedder.embedder_id)}-{len(texts)}-{h.hexdigest()[:16]}"
    npy, meta = cache_dir / f"{key}.npy", cache_dir / f"{key}.json"
    if npy.exists() and meta.exists():
        if (vecs := np.load(npy)).shape == (len(texts), embedder.dim):
            return vecs, {**json.loads(meta.read_text()), "cached": True, "cache_file": str(npy)}
    make_dir(cache_dir)
    vecs = np.zeros((len(texts), embedder.dim), np.float32)
    t0 = time.perf_counter()
    for start in range(0, len(texts), chunk):
        vecs[start:start + chunk] = embedder.embed(texts[start:start + chunk])
        if progress:
            progress("embedding corpus", min(start + chunk, len(texts)), len(texts))
    secs = time.perf_counter() - t0
    info = {"embedded": len(texts), "embed_s": round(secs, 2), "embeds_per_s": round(len(texts) / max(secs, 1e-9), 1)}
    with private_umask():
        np.save(npy.with_suffix(".tmp.npy"), vecs)
    restrict(npy.with_suffix(".tmp.npy"))
    os.replace(npy.with_suffix(".tmp.npy"), npy)
    write_file(meta, json.dumps(info), durable=False)
    return vecs, {**info, "cached": False, "cache_file": str(npy)}


class LookupEmbedder(Embedder):
    """Returns precomputed vectors for known texts (a lookup table); other texts go to the real embedder."""

    def __init__(self, base: Embedder, texts: Sequence[str], vectors: np.ndarray) -> None:
        self.embedder_id, self.dim = base.embedder_id, base.dim
        self._base, self._vectors = base, vectors
        self._row = {t: i for i, t in enumerate(texts)}
        self.misses = 0
        self.ms = 0.0
        """Milliseconds spent embedding (lookups and real model calls), summed."""

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        t0 = time.perf_counter()
        try:
            return self._lookup(texts)
        finally:
            self.ms += (time.perf_counter() - t0) * 1000

    def _lookup(self, texts: list[str]) -> np.ndarray:
        rows = [self._row.get(t, -1) for t in texts]
        out = self._vectors[np.maximum(rows, 0)].copy()
        unknown = [i for i, r in enumerate(rows) if r < 0]
        if unknown:
            self.misses += len(unknown)
            out[unknown] = self._base.embed([texts[i] for i in unknown])
        return out


class InstantModel(LanguageModel):
    """Replies "ok" at once, always persists, extracts the user text as a short event episode."""

    model_id = "instant-bench"
    offline = True

    def reply(self, request: ReplyRequest) -> ModelReply:
        return ModelReply("ok")

    def decide(self, exchange: Exchange) -> MemoryDecision:
        return MemoryDecision(True, ("event",), "bench: always persist",
                              Extraction(episode=exchange.user_text[:300], event=True))

    def classify_task(self, text: str, known: tuple[str, ...]) -> TaskClassification:
        return TaskClassification(None)


def _req(key: str, text: str, at: float, session: str, epoch: int = 0) -> WriteRequest:
    return WriteRequest(turn_key=key, now=at, actor="user", sources=(f"m-{key}",), session=session,
                        extraction=Extraction(episode=text, event=True), epoch=epoch)


def _index_part(n: int, vecs: np.ndarray, qv: np.ndarray, embedder_id: str, tmp: Path, res: dict[str, Any]) -> None:
    """Production index of the first ``n`` vectors vs an exact scan, per ``expansion_search``: latency, recall@10."""
    s, mat, default_ef = str(n), vecs[:n], IndexParams().expansion_search
    vi = VectorIndex(tmp / f"bench-{n}.usearch", dim=vecs.shape[1], embedder_id=embedder_id)
    t0 = time.perf_counter()
    vi.rebuild(((i, mat[i].tobytes()) for i in range(n)), 0)
    res["build_s"][s] = round(time.perf_counter() - t0, 3)
    exact_ms: list[float] = []
    exact: list[set[int]] = []
    sweep: dict[str, dict[str, float]] = {}
    for ef in sorted({default_ef, *EF_TRIES}):
        vi.index.expansion_search = ef  # type: ignore[misc]  # usearch has this setter; its stub hides it
        ms, recalls = [], []
        for qi, q in enumerate(qv):
            t0 = time.perf_counter()  # exact top 10 (matrix @ q, argpartition, sort) before each search at every ef:
            sims = mat @ q  # same load for both, and every search starts with caches as cold as in a real turn
            top = np.argpartition(-sims, 10)[:10] if n > 10 else np.arange(n)
            top = top[np.argsort(-sims[top])]
            exact_ms.append((time.perf_counter() - t0) * 1000)
            if qi == len(exact):
                exact.append({int(i) for i in top})
            t0 = time.perf_counter()
            got = vi.search(q, 10)
            ms.append((time.perf_counter() - t0) * 1000)
            recalls.append(len({k for k, _ in got} & exact[qi]) / max(len(exact[qi]), 1))
        recall = round(float(np.mean(recalls)), 4)
        sweep[str(ef)] = {"recall_at_10": recall, "p50_ms": _pct(ms, 50), "p99_ms": _pct(ms, 99)}
        if ef == default_ef:
            res["search_p50_ms"][s], res["search_p99_ms"][s], res["index_recall_at_10"][s] = \
                _pct(ms, 50), _pct(ms, 99), recall
    res["exact_p50_ms"][s], res["exact_p99_ms"][s] = _pct(exact_ms, 50), _pct(exact_ms, 99)
    res["ratios"][s] = round(res["search_p50_ms"][s] / max(res["exact_p50_ms"][s], 1e-9), 3)
    res["expansion_sweep"][s] = sweep
    res["expansion_search_needed"][s] = min((int(e) for e, v in sweep.items() if v["recall_at_10"] >= 0.95), default=None)


SNAPSHOT_VERSION = 1
"""Part of a stored store's key: raise it when what the bench writes before a snapshot changes."""


def _snapshot_key(corpus_file: str, sizes: Sequence[int], writes: int, turns_per_size: int) -> str:
    from soul_runtime.memory.episodic import MIGRATIONS

    parts = [str(SNAPSHOT_VERSION), Path(corpus_file).name, ",".join(map(str, sizes)), str(writes),
             str(turns_per_size), MIGRATIONS[-1][0]]
    return f"{sizes[-1]}-" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _save_snapshot(sdir: Path, snap: Path, meta: dict[str, Any]) -> None:
    """Copy the closed store in ``sdir`` to ``snap`` (whole, or not at all)."""
    tmp = snap.with_name(snap.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    make_dir(tmp)
    shutil.copytree(sdir, tmp / "soul")
    write_file(tmp / "bench.json", json.dumps(meta), durable=False)
    shutil.rmtree(snap, ignore_errors=True)
    os.replace(tmp, snap)


def _soul_part(n: int, sdir: Path, emb: LookupEmbedder, queries: Sequence[str], turn_texts: Sequence[str],
               at: float, k: int, res: dict[str, Any], say: Progress) -> int:
    """Whole three-layer recall (by stage) and instant-model turns (by stage, embedder time apart) on the store
    in ``sdir`` (``n`` episodes). Returns how many episodes the turns added."""
    s = str(n)
    mem = SoulMemory(sdir, embedder=emb)
    before = mem.episodic.stats()["episodes"]
    whole: list[float] = []
    cpu: list[float] = []
    stages: dict[str, list[float]] = {}
    for i, q in enumerate(queries):
        tm: dict[str, float] = {}
        c0, t0 = time.process_time(), time.perf_counter()
        mem.recall(q, k, at=at, timings=tm)
        whole.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        for name, v in tm.items():
            stages.setdefault(name, []).append(v)
        if i % 20 == 0 or i + 1 == len(queries):
            say(f"store {n}: recall", i + 1, len(queries))
    res["recall_p50_ms"][s], res["recall_p99_ms"][s] = _pct(whole, 50), _pct(whole, 99)
    res["recall_cpu_p50_ms"][s], res["recall_cpu_p99_ms"][s] = _pct(cpu, 50), _pct(cpu, 99)
    res["recall_stage_p50_ms"][s] = {name: _pct(v, 50) for name, v in stages.items()}
    res["recall_stage_p99_ms"][s] = {name: _pct(v, 99) for name, v in stages.items()}
    soul = Soul("bench", sdir, memory=mem, model=InstantModel())
    synced: list[int | None] = []
    timed_s = 0.0
    per_turn: list[float] = []
    overhead: list[float] = []
    overhead_cpu: list[float] = []
    embed_ms: list[float] = []
    tstages: dict[str, list[float]] = {}
    for j, t in enumerate(turn_texts):
        e0 = emb.ms
        if j == 3:
            synced.append(fsyncs.current())
        c0, t0 = time.process_time(), time.perf_counter()
        r = soul.turn(t, user="bench", at=at + 30 * (j + 1))
        dt = (time.perf_counter() - t0) * 1000
        dc = (time.process_time() - c0) * 1000
        if j >= 3:  # the first turns warm caches and are not timed
            timed_s += dt / 1000
            per_turn.append(dt)
            embed_ms.append(emb.ms - e0)
            overhead.append(dt - (emb.ms - e0))
            overhead_cpu.append(max(0.0, dc - (emb.ms - e0)))
            tm = soul.trace(r.turn_id).timings_ms
            for name, v in tm.items():
                tstages.setdefault(name, []).append(v)
            tstages.setdefault("checkpoint_and_other", []).append(dt - sum(tm.values()))
        if j % 20 == 0 or j + 1 == len(turn_texts):
            say(f"store {n}: turns", j + 1, len(turn_texts))
    synced.append(fsyncs.current())
    soul.close()
    added = mem.episodic.stats()["episodes"] - before
    first, last = synced[0], synced[-1]
    res.setdefault("turns_per_s", {})[s] = round(len(per_turn) / timed_s, 2) if timed_s else None
    res.setdefault("turn_fsyncs", {})[s] = round((last - first) / len(per_turn), 2) \
        if first is not None and last is not None and per_turn else None
    mem.close()
    res["turn_p50_ms"][s], res["turn_p99_ms"][s] = _pct(per_turn, 50), _pct(per_turn, 99)
    res["turn_embed_p50_ms"][s] = _pct(embed_ms, 50)
    res["turn_overhead_p50_ms"][s], res["turn_overhead_p99_ms"][s] = _pct(overhead, 50), _pct(overhead, 99)
    res["turn_overhead_cpu_p50_ms"][s] = _pct(overhead_cpu, 50)
    res["turn_overhead_cpu_p99_ms"][s] = _pct(overhead_cpu, 99)
    res["turn_stages_ms"][s] = {name: _pct(v, 50) for name, v in tstages.items()}
    return int(added)


def run(sizes: Sequence[int] = (1000, 10000, 100000), *, try_million: bool = False, queries: int = 200,
        progress: Progress | None = None, embedder: Embedder | None = None, locomo_dir: str | Path | None = None,
        cache_dir: str | Path | None = None, workdir: str | Path | None = None, writes: int = 100,
        turns: int = 200, million_budget_s: float = 1800.0, recall_k: int | None = None,
        reuse_stores: bool = False) -> dict[str, Any]:
    """Measure one soul's latencies at each store size; see the module docstring. Returns a JSON-ready dict.

    ``reuse_stores``: keep each size's bulk-loaded store in ``cache_dir/stores`` (keyed by the corpus, the
    embedder, the sizes so far, ``writes`` and the turns per size) and start from a copy of it next time; the
    bulk-load rate is then the one measured when it was built (listed in ``stores_reused``)."""
    sizes = sorted({int(n) for n in sizes})
    recall_k = recall_k or SoulConfig().turn.recall_k
    if not sizes or sizes[0] < 20 or queries < 1:
        raise ValueError("sizes must be >= 20 and queries >= 1")
    emb = embedder or default_embedder()
    cache = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "soul-runtime" / "bench"
    tmp = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="soul-bench-"))  # the stores create it
    notes: list[str] = []
    say: Progress = progress or (lambda what, done, total: None)
    res: dict[str, Any] = {k: {} for k in (
        "search_p50_ms search_p99_ms exact_p50_ms exact_p99_ms index_recall_at_10 write_ms_per_episode write_p99_ms "
        "build_s ratios expansion_sweep expansion_search_needed index_save_ms bulk_load_per_s recall_p50_ms "
        "recall_p99_ms recall_stage_p50_ms recall_stage_p99_ms turn_p50_ms turn_p99_ms turns_per_s turn_fsyncs "
        "turn_embed_p50_ms "
        "turn_overhead_p50_ms turn_overhead_p99_ms turn_stages_ms recall_cpu_p50_ms recall_cpu_p99_ms "
        "turn_overhead_cpu_p50_ms turn_overhead_cpu_p99_ms").split()}
    res["load_avg_1min"] = loads = {"start": round(os.getloadavg()[0], 2)}  # the box may be shared: load per phase
    emb.embed(["warm up the model"])
    n_max, slack = sizes[-1], max(50, sizes[-1] // 50)
    texts, held, source = build_corpus(n_max + slack + writes * len(sizes), queries + turns, locomo_dir)
    per_size = turns // len(sizes)  # each size gets its own turn texts (a repeated text is not written again)
    qtexts, turn_texts = held[:queries], held[queries:]
    vecs, einfo = embed_cached(emb, texts + qtexts, cache, progress)
    cvecs, qv = vecs[:len(texts)], vecs[len(texts):]
    res["corpus"] = {"source": source, "texts": len(texts), "queries": len(qtexts), **einfo,
                     "examples": texts[:3] + qtexts[:2]}
    res["embeds_per_s"] = einfo["embeds_per_s"]
    qe: list[float] = []
    for t in qtexts:
        t0 = time.perf_counter()
        emb.embed_one(t)
        qe.append((time.perf_counter() - t0) * 1000)
    res["query_embed_p50_ms"], res["query_embed_p99_ms"] = _pct(qe, 50), _pct(qe, 99)
    for n in sizes:  # 1. index vs exact scan
        say(f"index {n}: build + search", 0, 1)
        loads[f"index {n}"] = round(os.getloadavg()[0], 2)
        _index_part(n, cvecs, qv, emb.embedder_id, tmp, res)
    ok = [int(e) for e, v in res["expansion_sweep"][str(n_max)].items() if v["recall_at_10"] >= 0.95 and v["p50_ms"] <= 5]
    res["expansion_search_recommended"] = min(ok) if ok else None
    notes.append(f"expansion_search for recall@10 >= 0.95 with p50 <= 5 ms at {n_max}: "
                 + (str(min(ok)) if ok else "none of " + ", ".join(map(str, EF_TRIES)))
                 + f" (production default {IndexParams().expansion_search})")
    # 2. writes through the real EpisodicStore
    sdir = tmp / "soul"
    store = EpisodicStore(sdir, lookup := LookupEmbedder(emb, texts, cvecs), MemoryConfig())
    count, nxt, tail, merged = 0, 0, len(texts) - writes * len(sizes), 0
    for si, n in enumerate(sizes):
        snap = cache / "stores" / _snapshot_key(einfo["cache_file"], sizes[:si + 1], writes, per_size)
        if reuse_stores and (snap / "bench.json").exists():  # this size's bulk-loaded store, built by an earlier run
            store.close()
            shutil.rmtree(sdir)
            shutil.copytree(snap / "soul", sdir)
            meta = json.loads((snap / "bench.json").read_text())
            count, nxt, merged = meta["count"], meta["nxt"], meta["merged"]
            res["bulk_load_per_s"][str(n)] = meta["bulk_load_per_s"]
            res.setdefault("stores_reused", []).append(n)
            store = EpisodicStore(sdir, lookup, MemoryConfig())
        else:
            t0, loaded = time.perf_counter(), 0
            while count < n and nxt < tail:
                batch = list(range(nxt, min(tail, nxt + min(1000, n - count))))
                done = store.apply_many([_req(f"b{i}", texts[i], T0 + 600 * i, f"s{i // 25}", store.epoch)
                                         for i in batch])
                adds = sum(1 for ws in done for w in ws if w.op is Op.ADD)
                count, nxt, loaded, merged = count + adds, nxt + len(batch), loaded + adds, merged + len(batch) - adds
                say(f"store {n}: bulk load", count, n)
            res["bulk_load_per_s"][str(n)] = round(loaded / max(time.perf_counter() - t0, 1e-9), 1)
            if reuse_stores:
                store.close()
                _save_snapshot(sdir, snap, {"count": count, "nxt": nxt, "merged": merged,
                                            "bulk_load_per_s": res["bulk_load_per_s"][str(n)]})
                store = EpisodicStore(sdir, lookup, MemoryConfig())
        store.flush()
        loads[f"writes {n}"] = round(os.getloadavg()[0], 2)
        ms = []
        for j in range(writes):
            i = tail + si * writes + j
            req = _req(f"w{i}", texts[i], T0 + 600 * nxt + j, f"live-{n}", store.epoch)
            t0 = time.perf_counter()
            got = store.apply(req)
            ms.append((time.perf_counter() - t0) * 1000)
            count += sum(1 for w in got if w.op is Op.ADD)
        res["write_ms_per_episode"][str(n)], res["write_p99_ms"][str(n)] = _pct(ms, 50), _pct(ms, 99)
        t0 = time.perf_counter()
        store.flush()
        res["index_save_ms"][str(n)] = round((time.perf_counter() - t0) * 1000, 1)
        store.close()  # 3. recall and turns of an in-process Soul at this size
        loads[f"recall {n}"] = round(os.getloadavg()[0], 2)
        at = T0 + 600 * (nxt + writes) + 86400.0 * (si + 1)
        count += _soul_part(n, sdir, LookupEmbedder(emb, texts, cvecs), qtexts, turn_texts[si * per_size:(si + 1) * per_size], at,
                            recall_k,
                            res, say)
        if si + 1 < len(sizes):
            store = EpisodicStore(sdir, lookup, MemoryConfig())
    res["store_episodes"] = count
    notes.append(f"bulk load: {merged} near-duplicate texts merged into stored episodes (not counted); "
                 f"{lookup.misses} texts missed the vector lookup table and were embedded")
    notes.append("write p50/p99 exclude the index save that runs every 2000 writes (index_save_ms, amortised "
                 "index_save_ms/2000 per write)")
    notes.append(f"recall: {len(qtexts)} held-out queries per size through SoulMemory.recall (k={recall_k}, the "
                 "turn's), query embedded by the real embedder; stages: embed, dense (HNSW), lexical (FTS5 BM25), "
                 "score (candidate rows, scoring, reading the kept), semantic, procedural, merge")
    notes.append(f"turns: {per_size} per size (new texts at each size; the first 3 untimed) through an in-process Soul with an "
                 "instant model; overhead = turn time minus the embedder's time in that turn (query + episode key, "
                 "real model); checkpoint_and_other = turn time minus the trace's stages")
    notes.append("cpu: the same recalls and turns in CPU time of the whole process (time.process_time: every "
                 "thread, so a large store's lexical query on its own thread counts), which a busy machine inflates "
                 "far less than wall time; it leaves out waiting on fsync")
    # 4. 1M, only if it fits the time budget
    res["million_estimate_s"] = est = round(_million_estimate(res, sizes, einfo), 1)
    if not try_million:
        notes.append(f"1M skipped: not requested (try_million=False); estimated {est:.0f} s to embed and build")
    elif est > million_budget_s:
        notes.append(f"1M skipped: estimated {est:.0f} s to embed and build (> budget {million_budget_s:.0f} s)")
    else:
        mv, _ = embed_cached(emb, build_corpus(1_000_000, queries + turns, locomo_dir)[0], cache, progress)
        _index_part(1_000_000, mv, qv, emb.embedder_id, tmp, res)
        notes.append("1M: index vs exact scan only (no store write benchmark at 1M)")
    loads["end"] = round(os.getloadavg()[0], 2)
    if not workdir:  # ours: drop the stores (≈400 MB at 100k)
        shutil.rmtree(tmp, ignore_errors=True)
    res["floors"] = _floors(res, sizes)
    res["notes"] = notes
    res["params"] = {**IndexParams().__dict__, "embedder": emb.embedder_id, "dim": emb.dim, "queries": len(qtexts),
                     "writes": writes, "turns_per_size": per_size, "recall_k": recall_k, "cpus": os.cpu_count()}
    return res


def _million_estimate(res: dict[str, Any], sizes: list[int], einfo: dict[str, Any]) -> float:
    n = sizes[-1]
    per = res["build_s"][str(n)] / n
    if len(sizes) > 1:  # per-vector build cost grows with N: extrapolate the growth seen between the last two sizes
        m = sizes[-2]
        growth = per / max(res["build_s"][str(m)] / m, 1e-12)
        per *= growth ** (np.log(1e6 / n) / np.log(n / m))
    return float(per * 1e6 + (1e6 - n) / max(einfo["embeds_per_s"], 1e-9))


def _floors(res: dict[str, Any], sizes: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if 100000 in sizes:
        out["search_100k_p50_le_5ms_recall_ge_0.95"] = bool(res["search_p50_ms"]["100000"] <= 5
                                                            and res["index_recall_at_10"]["100000"] >= 0.95)
    if 10000 in sizes:
        out["search_10k_le_2x_exact"] = bool(res["ratios"]["10000"] <= 2)
    if 100000 in sizes:
        out["recall_100k_p50_le_10ms"] = bool(res["recall_p50_ms"]["100000"] <= 10)
        out["turn_overhead_100k_p50_le_10ms"] = bool(res["turn_overhead_p50_ms"]["100000"] <= 10)
    if 1000 in sizes and 100000 in sizes:
        out["write_100k_le_2x_1k"] = bool(res["write_ms_per_episode"]["100000"] <= 2 * res["write_ms_per_episode"]["1000"])
    return out


def table(result: dict[str, Any]) -> Table:
    """A rich Table: one row per store size, the stage breakdowns and notes in the caption."""
    t = Table(title="soul bench latency (one soul; ms unless noted)")
    cols = (("episodes", None), ("search p50", "search_p50_ms"), ("search p99", "search_p99_ms"),
            ("exact p50", "exact_p50_ms"), ("recall@10", "index_recall_at_10"), ("write p50", "write_ms_per_episode"),
            ("write p99", "write_p99_ms"), ("index save", "index_save_ms"), ("recall p50", "recall_p50_ms"),
            ("recall p99", "recall_p99_ms"), ("recall cpu p50", "recall_cpu_p50_ms"), ("turn p50", "turn_p50_ms"),
            ("turn p99", "turn_p99_ms"), ("turns/s", "turns_per_s"), ("fsyncs/turn", "turn_fsyncs"),
            ("turn embed p50", "turn_embed_p50_ms"), ("overhead p50", "turn_overhead_p50_ms"),
            ("overhead p99", "turn_overhead_p99_ms"), ("overhead cpu p50", "turn_overhead_cpu_p50_ms"))
    for c, _ in cols:
        t.add_column(c, justify="right")
    for s in sorted(result["search_p50_ms"], key=int):
        def g(key: str, s: str = s) -> str:
            v = result.get(key, {}).get(s)
            return "—" if v is None else (f"{v:,}" if isinstance(v, int) else f"{v:.3g}")
        t.add_row(f"{int(s):,}", *(g(key) for _, key in cols[1:] if key))

    def stages(key: str) -> str:
        return "; ".join(f"{int(s):,}: " + ", ".join(f"{k} {v:.2f}" for k, v in d.items())
                         for s, d in sorted(result.get(key, {}).items(), key=lambda kv: int(kv[0])))
    t.caption = "\n".join([
        f"query embedding p50 {result['query_embed_p50_ms']:.2f} / p99 {result['query_embed_p99_ms']:.2f} ms; "
        f"corpus embedding {result.get('embeds_per_s', 0):.0f}/s",
        f"recall stages p50: {stages('recall_stage_p50_ms')}",
        f"turn stages p50 (instant model): {stages('turn_stages_ms')}",
        f"load (1-min average) by phase: {result.get('load_avg_1min', {})}",
        f"floors: {result.get('floors', {})}", *result.get("notes", [])])
    return t


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Search, exact-scan, write, whole-recall and turn-overhead p50 vs store size, log-log, as a PNG."""
    from soul_apps.bench.plotting import pyplot
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in (("search_p50_ms", "HNSW search p50"), ("exact_p50_ms", "exact numpy scan p50"),
                       ("write_ms_per_episode", "write one episode p50"),
                       ("recall_p50_ms", "whole 3-layer recall p50"),
                       ("turn_overhead_p50_ms", "turn overhead p50 (instant model, embedder excluded)"),
                       ("recall_cpu_p50_ms", "whole recall p50, CPU time"),
                       ("turn_overhead_cpu_p50_ms", "turn overhead p50, CPU time")):
        pts = sorted((int(s), v) for s, v in result.get(key, {}).items())
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="episodes in the soul's store", ylabel="latency (ms)",
           title=f"one soul; query embedding p50 {result.get('query_embed_p50_ms', 0):.1f} ms")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=120)
    plt.close(fig)
    return Path(path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="soul bench latency", description=__doc__.splitlines()[0] if __doc__ else "")
    ap.add_argument("--sizes", default="1000,10000,100000", help="comma-separated store sizes")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--json", help="write the result dict here")
    ap.add_argument("--plot", help="write a PNG here")
    ap.add_argument("--locomo", help="LoCoMo directory to draw sentences from (else templates)")
    ap.add_argument("--cache-dir", help="embedding cache (default ~/.cache/soul-runtime/bench)")
    ap.add_argument("--million", action="store_true", help="try 1M if the estimated time allows")
    ap.add_argument("--turns", type=int, default=200, help="instant-model turns in all (split among the sizes)")
    ap.add_argument("--reuse-stores", action="store_true",
                    help="keep each size's bulk-loaded store in the cache dir and start from it next time")
    ap.add_argument("--embedder", choices=("default", "fast"), default="default",
                    help="default: MiniLM (real text embeddings); fast: the deterministic hashing embedder")
    fsyncs.add_storage_args(ap)
    a = ap.parse_args(argv)
    if a.fsyncs:  # the stores write in this process: run it again with the counter preloaded
        fsyncs.run_counted("soul_apps.bench.latency", list(sys.argv[1:] if argv is None else argv),
                           a.data_dir or tempfile.gettempdir())
    from soul_runtime.memory.sqlite_db import use_storage
    use_storage(a.storage)  # every store this process opens from now on
    if a.plot:
        from soul_apps.bench.plotting import require
        require()

    def prog(what: str, done: int, total: int) -> None:
        print(f"\r{what}: {done:,}/{total:,}", end="\n" if done >= total else "", file=sys.stderr, flush=True)

    res = run([int(x) for x in a.sizes.split(",") if x.strip()], try_million=a.million, queries=a.queries,
              progress=prog, locomo_dir=a.locomo, cache_dir=a.cache_dir, turns=a.turns,
              reuse_stores=a.reuse_stores, workdir=a.data_dir,
              embedder=FastEmbedder() if a.embedder == "fast" else None)
    res["storage"] = a.storage
    res["fsyncs_measured"] = fsyncs.current() is not None
    fsyncs.done()
    if a.data_dir:
        from soul_apps.bench.fsyncs import file_system
        res["data_dir"], res["file_system"] = a.data_dir, file_system(a.data_dir)
    if a.json:
        write_file(a.json, json.dumps(res, indent=2), durable=False)
    if a.plot:
        plot(res, a.plot)
    Console(width=160).print(table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
