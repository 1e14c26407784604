"""`soul bench beam DIR`: what a model is shown from memory of real long chats (BEAM), under a token budget.

Each chat (:mod:`soul_apps.bench.beam_data`) is observed by one soul session by session through the public
write path (``Soul.observe``: offline model, the default embedder), then every probing question recalls
``TurnConfig.recall_k`` items 30 days after the last session, packed into the budget exactly as for a turn
(:func:`soul_runtime.loop.context.pack_memory`). Credited is exactly the text the model would be shown:

* **evidence recall** — the share of the question's evidence message ids among the sources of the lines shown;
* **key-phrase recall** — the share of the rubric's content words found among the words of the lines shown.

Baselines in the same run, same budgets, the same token count for every line (chars/4 + 1 per line): BM25 over
whole messages (the first that does not fit is shown clipped), BM25 over ~400-character sentence chunks of every
message (what plain RAG shows), and dense retrieval over the same chunks with the same embedder. Also reported:
messages refused, packings that failed, ingest rate, recall latency and the process's resident memory.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from soul_apps.bench.ablation import LABELS as ABLATION_LABELS
from soul_apps.bench.ablation import packed, variants
from soul_apps.bench.beam_data import DAY, Chat, Question, content_words, load
from soul_apps.bench.locomo import BM25, take_within
from soul_apps.bench.longchat import chunks, plot_systems, rss_mib, take_clipped
from soul_runtime.config import MemoryConfig, TurnConfig
from soul_runtime.embedding.base import Embedder
from soul_runtime.embedding.choice import default_embedder
from soul_runtime.errors import SoulError
from soul_runtime.loop.context import line_tokens
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.choice import make_model
from soul_runtime.records import RecalledItem

SYSTEMS = ("soul", "soul_recall_order", "soul_rerank_only", "soul_digests_only", "bm25_chunks", "dense_chunks",
           "bm25_messages")
LABELS = {"soul": "soul-runtime (what a turn shows)", "bm25_chunks": "BM25 over ~400-character chunks",
          "dense_chunks": "dense over the same chunks", "bm25_messages": "BM25 over whole messages",
          **ABLATION_LABELS}
ASK_AFTER = 30 * DAY
Lines = Sequence[tuple[str, tuple[str, ...]]]


def evidence_recall(q: Question, taken: Lines) -> float | None:
    if not q.evidence:
        return None
    found = {s for _, srcs in taken for s in srcs}
    return sum(1 for e in q.evidence if e in found) / len(q.evidence)


def key_phrase_recall(q: Question, taken: Lines) -> float | None:
    if not q.key_words:
        return None
    shown = set(content_words("\n".join(line for line, _ in taken)))
    return sum(1 for w in q.key_words if w in shown) / len(q.key_words)


METRICS = {"evidence_recall": evidence_recall, "key_phrase_recall": key_phrase_recall}


class Tally:
    """Every question's figures per system, budget and kind."""

    def __init__(self) -> None:
        self.vals: dict[tuple[str, int, str, str], list[float]] = {}
        self.tok: dict[tuple[str, int], list[int]] = {}

    def add(self, system: str, budget: int, q: Question, taken: Lines) -> None:
        for name, metric in METRICS.items():
            v = metric(q, taken)
            if v is not None:
                self.vals.setdefault((system, budget, q.kind, name), []).append(v)
        self.tok.setdefault((system, budget), []).append(sum(line_tokens(line) for line, _ in taken))

    def mean(self, system: str, budget: int, metric: str, kind: str | None = None) -> float | None:
        vals = [v for (s, b, k, m), vs in self.vals.items() if s == system and b == budget and m == metric
                and (kind is None or k == kind) for v in vs]
        return round(statistics.fmean(vals), 4) if vals else None

    def summary(self, system: str, budget: int) -> dict[str, Any]:
        kinds = sorted({k[2] for k in self.vals if k[0] == system and k[1] == budget})
        toks = self.tok.get((system, budget), [])
        return {**{m: self.mean(system, budget, m) for m in METRICS},
                "tokens_mean": round(statistics.fmean(toks), 1) if toks else None,
                "by_kind": {kind: {m: self.mean(system, budget, m, kind) for m in METRICS} for kind in kinds}}


class Baselines:
    """The plain retrievers over one chat's raw messages: BM25 over messages and over chunks, dense over chunks."""

    def __init__(self, chat: Chat, embedder: Embedder, batch: int = 128, cache: Path | None = None,
                 dense: bool = True) -> None:
        """``cache``: a file that keeps the chunks' vectors for the next run (read when it holds this chat's chunks
        embedded by this embedder); ``dense`` False: the lexical baselines only (no chunk is embedded)."""
        msgs = chat.messages
        self.raw = [(f"{m['speaker']}: {m['text']}", (m["id"],)) for m in msgs]
        self.pieces = [(f"{m['speaker']}: {c}", (m["id"],)) for m in msgs for c in chunks(m["text"])]
        self.bm_msg, self.bm_chunk = BM25([t for t, _ in self.raw]), BM25([t for t, _ in self.pieces])
        self.embedder = embedder
        texts = [t for t, _ in self.pieces]
        self.vectors: np.ndarray | None = None
        if not dense:
            return
        key = hashlib.blake2b("\0".join([embedder.embedder_id, *texts]).encode(), digest_size=16).hexdigest()
        if cache is not None and cache.exists():
            with np.load(cache) as kept:
                if str(kept["key"]) == key:
                    self.vectors = kept["vectors"]
                    return
        self.vectors = np.vstack([embedder.embed(texts[i:i + batch]) for i in range(0, len(texts), batch)]) \
            if texts else np.zeros((0, embedder.dim), np.float32)
        if cache is not None:
            with cache.open("wb") as f:
                np.savez(f, key=np.array(key), vectors=self.vectors)

    def ranked(self, question: str) -> dict[str, Lines]:
        out: dict[str, Lines] = {"bm25_messages": [self.raw[i] for i in np.argsort(-self.bm_msg.scores(question), kind="stable")],
               "bm25_chunks": [self.pieces[i] for i in np.argsort(-self.bm_chunk.scores(question), kind="stable")]}
        if self.vectors is not None:
            qv = self.embedder.embed([question])[0]
            out["dense_chunks"] = [self.pieces[i] for i in np.argsort(-(self.vectors @ qv), kind="stable")]
        return out


ASKER = "user"
"""Who asks the probing questions: the chat's user (its messages' speaker), as in a turn."""


def shown(items: Sequence[RecalledItem], budget: int, now: float, question: str, rerank: bool = True) -> Lines:
    """What a turn would show of ``items`` at ``budget`` tokens when the chat's user asks: the lines and their
    sources."""
    return packed(items, budget, now, question, rerank, ASKER)


def score_chat(chat: Chat, recall: Callable[[str, float], Sequence[RecalledItem]], tally: Tally,
               budgets: Sequence[int], baselines: Baselines | None, failures: list[str],
               progress: Callable[[str, int, int], None] | None = None,
               before: Sequence[Sequence[RecalledItem]] | None = None) -> list[float]:
    """Every question of ``chat`` at every budget, the soul beside the baselines; the recall latencies (ms). A
    packing that raises is counted in ``failures`` (and scored as showing nothing). ``before``: each question's
    recall before the digests were written, to score the ablations beside the soul
    (:mod:`soul_apps.bench.ablation`)."""
    now = max(m["at"] for m in chat.messages) + ASK_AFTER
    recall_ms = []
    for qi, q in enumerate(chat.questions):
        t1 = time.perf_counter()
        items = recall(q.question, now)
        recall_ms.append((time.perf_counter() - t1) * 1000)
        ranked = baselines.ranked(q.question) if baselines else {}
        souls = variants(items, before[qi] if before is not None else None)
        for b in budgets:
            for name, (its, rr) in souls.items():
                try:
                    lines = shown(its, b, now, q.question, rr)
                except Exception as e:  # counted, never hidden: the floor is none
                    failures.append(f"{chat.chat_id} {name} q{qi} @{b}: {type(e).__name__}: {e}")
                    lines = []
                tally.add(name, b, q, lines)
            for system, order in ranked.items():
                tally.add(system, b, q, take_clipped(order, b) if system == "bm25_messages" else take_within(order, b))
        if progress:
            progress(f"chat {chat.chat_id}: questions", qi + 1, len(chat.questions))
    return recall_ms


def ingest(chat: Chat, soul: Soul, refused: list[str], progress: Callable[[str, int, int], None] | None) -> float:
    """Observe ``chat`` session by session; seconds taken."""
    t0 = time.perf_counter()
    for si, (name, batch) in enumerate(chat.sessions):
        try:
            soul.observe(list(batch), session=name)
        except SoulError as e:  # counted, never hidden: the floor is none
            refused.append(f"{chat.chat_id}/{name}: {type(e).__name__}: {e}")
        if progress:
            progress(f"chat {chat.chat_id}: ingest", si + 1, len(chat.sessions))
    return time.perf_counter() - t0


def run(data: str | Path, budgets: Sequence[int] = (500, 1000, 2000), *, embedder: Embedder | None = None,
        progress: Callable[[str, int, int], None] | None = None, workdir: str | None = None,
        config: MemoryConfig | None = None, turn: TurnConfig | None = None, limit: int | None = None,
        chats: Sequence[str] | None = None, baselines: bool = True, dense: bool = True, consolidate: bool = True,
        ablation: bool = False, stores: str | Path | None = None) -> dict[str, Any]:
    """Every system at every budget on the BEAM chats under ``data`` (``chats``: only these chat ids). After a
    chat is observed its memory is consolidated (``consolidate``; timed apart from ingest); ``ablation``: the
    soul's parts are also scored apart (:mod:`soul_apps.bench.ablation`), recall asked before and after
    consolidation. ``stores``: keep each chat's soul under ``stores/<chat>``; a chat an earlier run observed there
    to the end (:data:`OBSERVED`) is not observed again: its ingest figures are that run's, marked so."""
    embedder = embedder or default_embedder()
    turn = turn or TurnConfig()
    model = make_model("offline")
    budgets = sorted(set(budgets))
    tally = Tally()
    root = Path(stores or workdir or tempfile.mkdtemp(prefix="beam-"))
    loaded = [c for c in load(data) if not chats or c.chat_id in chats][:limit]
    per_chat: list[dict[str, Any]] = []
    refused: list[str] = []
    failures: list[str] = []
    ingest_s = 0.0
    n_msgs = n_chars = 0
    for chat in loaded:
        built = _observed(root, chat) if stores else None
        before_mem = None
        if built is not None and ablation:  # digests are there already: recall "before" them with none offered
            before_mem = SoulMemory(root / chat.chat_id, embedder=embedder,
                                    config=replace(config or MemoryConfig(), digests_recalled=0))
        mem = SoulMemory(root / chat.chat_id, embedder=embedder, config=config)
        soul = Soul(f"beam-{chat.chat_id}", root / chat.chat_id, memory=mem, model=model)
        took = ingest(chat, soul, refused, progress) if built is None else float(built["ingest_s"])
        if built is None and stores:
            (root / f"{chat.chat_id}{OBSERVED}").write_text(json.dumps({"ingest_s": took,
                                                                        "messages": len(chat.messages)}))
        ingest_s += took
        n_msgs += len(chat.messages)
        n_chars += chat.chars
        rss, peak = rss_mib()

        def recall(q: str, at: float, m: SoulMemory = mem) -> list[RecalledItem]:
            return m.recall(q, turn.recall_k, at=at)
        asked = max(m["at"] for m in chat.messages) + ASK_AFTER
        before, before_ms = None, []
        if ablation:
            before = []
            for q in chat.questions:
                t1 = time.perf_counter()
                before.append(recall(q.question, asked, before_mem or mem))
                before_ms.append((time.perf_counter() - t1) * 1000)
            if before_mem is not None:
                before_mem.close()
        t1 = time.perf_counter()
        done = mem.consolidate(asked) if consolidate else {}
        consolidate_s = time.perf_counter() - t1
        base = Baselines(chat, embedder, cache=root / f"{chat.chat_id}.chunks.npz" if stores else None,
                         dense=dense) if baselines else None
        recall_ms = score_chat(chat, recall, tally, budgets, base, failures, progress, before)
        st = mem.stats()
        per_chat.append({"chat": chat.chat_id, "messages": len(chat.messages), "chars": chat.chars,
                         "questions": len(chat.questions), "ingest_s": round(took, 2),
                         "messages_per_s": round(len(chat.messages) / took, 2), "rss_mib": rss, "rss_peak_mib": peak,
                         "observed_by_an_earlier_run": built is not None,
                         "episodes": st["episodes"], "facts": st["facts"],
                         "recall_p50_ms": round(statistics.median(recall_ms), 2) if recall_ms else None,
                         "recall_p50_ms_before_digests": round(statistics.median(before_ms), 2) if before_ms else None,
                         "consolidate_s": round(consolidate_s, 2), "sessions": len(chat.sessions),
                         "consolidate_s_per_session": round(consolidate_s / max(1, len(chat.sessions)), 3),
                         "digests": done.get("digests", 0), "stored_bytes": _stored_bytes(root / chat.chat_id),
                         "digest_bytes": _digest_bytes(mem)})
        soul.close()
        mem.close()
    res = summary(tally, budgets, turn)
    res["details"] = {"chats": [c.chat_id for c in loaded], "questions": sum(len(c.questions) for c in loaded),
                      "messages": n_msgs, "chars": n_chars, "refused": refused, "failed_packings": failures,
                      "ingest_messages_per_s": round(n_msgs / ingest_s, 2) if ingest_s else None,
                      "ingest_chars_per_s": round(n_chars / ingest_s) if ingest_s else None,
                      "rss_peak_mib": max((c["rss_peak_mib"] for c in per_chat), default=None),
                      "embedder": embedder.embedder_id, "model": model.label, "per_chat": per_chat}
    return res


OBSERVED = ".observed.json"
"""``<stores>/<chat>.observed.json``: the chat was observed to the end there (its ingest seconds, its messages)."""


def _observed(root: Path, chat: Chat) -> dict[str, Any] | None:
    """What an earlier run wrote when it had observed ``chat`` to the end under ``root`` (None: not observed)."""
    mark = root / f"{chat.chat_id}{OBSERVED}"
    if not mark.exists() or not (root / chat.chat_id).is_dir():
        return None
    got: dict[str, Any] = json.loads(mark.read_text())
    return got if got.get("messages") == len(chat.messages) else None


def _stored_bytes(directory: Path) -> int:
    """Bytes of a soul's files on disk."""
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _digest_bytes(mem: SoulMemory) -> int:
    """Characters of text the digests hold (their rows' share of the store)."""
    return sum(len(d.text.encode()) for d in mem.digests())


def summary(tally: Tally, budgets: Sequence[int], turn: TurnConfig) -> dict[str, Any]:
    """Every system's figures at every budget, and the soul's ratios to each baseline (overall and per kind)."""
    head = turn.memory_tokens if turn.memory_tokens in budgets else budgets[len(budgets) // 2]
    systems = [s for s in SYSTEMS if any(k[0] == s for k in tally.vals)]
    res: dict[str, Any] = {"budgets": list(budgets), "headline_budget": head, "recall_k": turn.recall_k,
                           "systems": {s: {str(b): tally.summary(s, b) for b in budgets} for s in systems}}
    ratios: dict[str, Any] = {}
    for b in map(str, budgets):
        soul = res["systems"]["soul"][b]
        ratios[b] = {f"{m}_vs_{s}": _ratio(soul[m], res["systems"][s][b][m]) for s in systems[1:] for m in METRICS}
        if "bm25_chunks" in systems:
            ratios[b]["by_kind_vs_bm25_chunks"] = {
                kind: {m: _ratio(v[m], res["systems"]["bm25_chunks"][b]["by_kind"].get(kind, {}).get(m))
                       for m in METRICS} for kind, v in soul["by_kind"].items()}
    res["ratios"] = ratios
    return res


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def plot(res: dict[str, Any], path: str | Path) -> None:
    plot_systems(res, path, LABELS, {"soul": "o-", "soul_recall_order": "x:", "bm25_chunks": "s--", "dense_chunks": "d-.",
                                 "bm25_messages": "^:"},
                 tuple(METRICS), "BEAM chats")
