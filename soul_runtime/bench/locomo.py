"""`soul bench locomo`: evidence recall under a token budget on LoCoMo-format conversations.

For each conversation one soul observes every session in order (``at`` = the
session's date, message ids = ``dia_id``). For every QA item of categories 1–4,
memories are taken in rank order while their text fits the budget (tokens ≈
characters / 4); evidence recall = share of the item's evidence ids found in the
``sources`` of the memories taken. Baselines in the same run, same budgets:
BM25 and dense search (same embedder) over the raw turns.
"""

from __future__ import annotations

import math
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from soul_runtime.clock import DAY
from soul_runtime.config import MemoryConfig
from soul_runtime.embedding.base import Embedder, default_embedder
from soul_runtime.loop.ingest import Conversation, load_locomo
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.choice import make_model
from soul_runtime.records import RecalledItem
from soul_runtime.text import estimate_tokens, terms

CATEGORIES = (1, 2, 3, 4)


@dataclass(frozen=True)
class Turn:
    id: str
    speaker: str
    text: str
    at: float


@dataclass(frozen=True)
class QA:
    question: str
    evidence: tuple[str, ...]
    category: int


def conversations(data: str | Path, categories: Sequence[int] = CATEGORIES, *, captions: bool = True
                  ) -> list[tuple[Conversation, list[Turn], list[QA]]]:
    """The LoCoMo conversations in a file or directory, with their raw turns and QA items of ``categories``
    (evidence split on ';' and ','; prefixed like the message ids when a file holds several conversations)."""
    p = Path(data)
    files = sorted(p.glob("*.json")) if p.is_dir() else [p]
    out = []
    for f in files:
        for conv in load_locomo(f, captions=captions):
            turns = [Turn(m["id"], m["speaker"], m["text"], float(m["at"])) for b in conv.batches for m in b.messages]
            prefix = f"{conv.sample_id}:" if turns and turns[0].id.startswith(f"{conv.sample_id}:") else ""
            if len(files) > 1:
                conv = replace(conv, sample_id=f"{f.stem}-{conv.sample_id}")
            qas = []
            for q in conv.qa:
                if q.get("category") not in categories:
                    continue
                ev = tuple(prefix + e.strip() for item in q["evidence"] for e in re.split(r"[;,]", item) if e.strip())
                if ev:
                    qas.append(QA(q["question"], ev, int(q["category"])))
            out.append((conv, turns, qas))
    return out


# ---- baselines over raw turns -------------------------------------------------------------
class BM25:
    def __init__(self, docs: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.toks = [terms(d) for d in docs]
        self.k1, self.b = k1, b
        self.avg = sum(len(t) for t in self.toks) / max(1, len(self.toks))
        df: dict[str, int] = {}
        for t in self.toks:
            for w in set(t):
                df[w] = df.get(w, 0) + 1
        n = len(self.toks)
        self.idf = {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}

    def scores(self, query: str) -> np.ndarray:
        q = terms(query)
        out = np.zeros(len(self.toks))
        for i, t in enumerate(self.toks):
            if not t:
                continue
            tf: dict[str, int] = {}
            for w in t:
                tf[w] = tf.get(w, 0) + 1
            norm = self.k1 * (1 - self.b + self.b * len(t) / self.avg)
            out[i] = sum(self.idf.get(w, 0.0) * tf[w] * (self.k1 + 1) / (tf[w] + norm) for w in q if w in tf)
        return out


def take_within(items: Sequence[tuple[str, tuple[str, ...]]], budget: int) -> set[str]:
    """Sources of the items taken in rank order while their text fits ``budget`` tokens."""
    used = 0
    found: set[str] = set()
    for text, sources in items:
        t = estimate_tokens(text)
        if used + t > budget:
            break
        used += t
        found.update(sources)
    return found


def evidence_recall(found: set[str], evidence: tuple[str, ...]) -> float:
    return sum(1 for e in evidence if e in found) / len(evidence)


def raw_text(t: Turn) -> str:
    return f"{t.speaker}: {t.text}"


# ---- the benchmark ---------------------------------------------------------------------------
def run(data: str | Path, budgets: Sequence[int] = (500, 1000, 2000), *, embedder: Embedder | None = None,
        progress: Callable[[str, int, int], None] | None = None, workdir: str | None = None,
        config: MemoryConfig | None = None, limit: int | None = None) -> dict[str, Any]:
    embedder = embedder or default_embedder()
    model = make_model("offline")
    systems = ("soul", "bm25", "dense")
    per_item: dict[str, dict[int, list[float]]] = {s: {b: [] for b in budgets} for s in systems}
    by_cat: dict[str, dict[int, list[float]]] = {s: {c: [] for c in CATEGORIES} for s in systems}
    recall_ms: list[float] = []
    ingest_s = 0.0
    n_msgs = 0
    stored: dict[str, int] = {"episodes": 0, "facts": 0, "procedures": 0}
    tokens_full = 0
    tokens_used: list[int] = []
    root = Path(workdir or tempfile.mkdtemp(prefix="locomo-"))
    convs = conversations(data)[:limit]
    maxb = max(budgets)
    for conv, turns, qas in convs:
        name = conv.sample_id
        n_msgs += len(turns)
        full = sum(estimate_tokens(raw_text(t)) for t in turns)
        tokens_full += full * len(qas)
        mem = SoulMemory(root / name, embedder=embedder, config=config)
        soul = Soul(f"locomo-{name}", root / name, memory=mem, model=model)
        t0 = time.perf_counter()
        for bi, batch in enumerate(conv.batches):
            soul.observe(batch.messages, at=batch.at, session=batch.session)
            if progress:
                progress(f"{name}: ingest", bi + 1, len(conv.batches))
        ingest_s += time.perf_counter() - t0
        st = mem.stats()
        stored["episodes"] += st["episodes"]
        stored["facts"] += st["facts"]
        stored["procedures"] += st["procedures"]
        now = max(t.at for t in turns) + DAY
        raw = [raw_text(t) for t in turns]
        bm25 = BM25(raw)
        vecs = embedder.embed(raw)
        qvecs = embedder.embed([q.question for q in qas])
        for qi, q in enumerate(qas):
            t0 = time.perf_counter()
            items: list[RecalledItem] = mem.recall(q.question, 150, now=now)
            recall_ms.append((time.perf_counter() - t0) * 1000)
            mine = [(it.text, it.sources) for it in items]
            b_rank = np.argsort(-bm25.scores(q.question), kind="stable")
            d_rank = np.argsort(-(vecs @ qvecs[qi]), kind="stable")
            ranked: dict[str, list[tuple[str, tuple[str, ...]]]] = {"soul": mine,
                      "bm25": [(raw[i], (turns[i].id,)) for i in b_rank[:200]],
                      "dense": [(raw[i], (turns[i].id,)) for i in d_rank[:200]]}
            for s in systems:
                for b in budgets:
                    r = evidence_recall(take_within(ranked[s], b), q.evidence)
                    per_item[s][b].append(r)
                    if b == 1000 or (1000 not in budgets and b == maxb):
                        by_cat[s][q.category].append(r)
            used = 0
            for text, _ in mine:
                if used + estimate_tokens(text) > 1000:
                    break
                used += estimate_tokens(text)
            tokens_used.append(used)
            if progress and (qi + 1) % 25 == 0:
                progress(f"{name}: questions", qi + 1, len(qas))
        soul.close()
        mem.close()
    res: dict[str, Any] = {s: {str(b): round(statistics.fmean(per_item[s][b]), 4) for b in budgets} for s in systems}
    res["by_category"] = {s: {str(c): round(statistics.fmean(v), 4) if v else None for c, v in by_cat[s].items()}
                          for s in systems}
    qs = sorted(recall_ms)
    res["details"] = {
        "conversations": len(convs), "questions": len(per_item["soul"][budgets[0]]), "raw_turns": n_msgs,
        "stored": stored, "ingest_messages_per_s": round(n_msgs / ingest_s, 1) if ingest_s else None,
        "recall_p50_ms": round(qs[len(qs) // 2], 2) if qs else None,
        "recall_p99_ms": round(qs[min(len(qs) - 1, int(len(qs) * 0.99))], 2) if qs else None,
        "tokens_used_mean_at_1000": round(statistics.fmean(tokens_used), 1) if tokens_used else None,
        "full_context_tokens_mean": round(tokens_full / max(1, len(tokens_used)), 1),
        "embedder": embedder.embedder_id, "model": model.label,
    }
    d = res["details"]
    d["token_share_at_1000"] = round(d["tokens_used_mean_at_1000"] / d["full_context_tokens_mean"], 4)
    for b in budgets:
        res.setdefault("ratio_vs_bm25", {})[str(b)] = round(res["soul"][str(b)] / max(1e-9, res["bm25"][str(b)]), 3)
    return res


def plot(res: dict[str, Any], path: str | Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for s, style in (("soul", "o-"), ("bm25", "s--"), ("dense", "^--")):
        xs = sorted(int(b) for b in res[s])
        ax.plot(xs, [res[s][str(x)] for x in xs], style, label=s)
    ax.set_xlabel("memory budget (tokens)")
    ax.set_ylabel("evidence recall")
    ax.set_title("LoCoMo evidence recall vs budget")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
