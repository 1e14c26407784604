"""`soul bench locomo`: what a model is shown from memory, under a token budget, on LoCoMo conversations.

For each conversation one soul observes every session in order (``at`` = the session's date,
message ids = ``dia_id``). For every QA item of categories 1–4 the soul recalls
``TurnConfig.recall_k`` items at the day after the last session and the context assembler packs
them into the budget exactly as it does for a turn (:func:`soul_runtime.loop.context.pack_memory`:
rendered ``[episodic ep-N] 3 March 2024: …`` lines, tokens counted on those lines). Two metrics:

* **answer recall** (categories 1, 2, 4 with an answer): the share of the gold answer's content
  words (lower case, ``[a-z0-9]+``, stop words out) found in the lines taken: what the model can read;
* **evidence recall**: the share of the item's evidence ids found in the ``sources`` of the items
  taken: provenance, which credits a memory even when its text lost the answer.

Baselines in the same run, same budgets, same token count per line: BM25, dense (same embedder)
and hybrid (reciprocal-rank fusion of both) over the raw "Speaker: text" turns; BM25 over turns
dated like "(3 March 2024) Speaker: text"; the whole conversation (with and without dates) as the
ceiling.
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

from soul_runtime.bench.ablation import ABLATIONS, packed, variants
from soul_runtime.clock import DAY
from soul_runtime.config import MemoryConfig, TurnConfig
from soul_runtime.embedding.base import Embedder, default_embedder
from soul_runtime.loop.context import line_tokens
from soul_runtime.loop.ingest import Conversation, load_locomo
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.choice import make_model
from soul_runtime.records import RecalledItem
from soul_runtime.text import STOPWORDS, terms
from soul_runtime.timeref import day_text

CATEGORIES = (1, 2, 3, 4)
ANSWER_CATEGORIES = (1, 2, 4)  # 3 (inference) has free-text answers: not a word-match metric
SYSTEMS = ("soul", "bm25", "dense", "hybrid", "bm25_dated")
LABELS = {"soul": "soul-runtime", "bm25": "BM25 over raw turns", "dense": "dense over raw turns",
          "hybrid": "hybrid (RRF) over raw turns", "bm25_dated": "BM25 over dated raw turns",
          "full": "whole conversation", "full_dated": "whole conversation, dated"}


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
    answer: str = ""


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
                    qas.append(QA(q["question"], ev, int(q["category"]), str(q.get("answer") or "")))
            out.append((conv, turns, qas))
    return out


# ---- baselines over raw turns -------------------------------------------------------------
class BM25:
    """Okapi BM25 over ``docs`` tokenized by the engine's own :func:`soul_runtime.text.terms`."""

    def __init__(self, docs: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.toks = [terms(d) for d in docs]
        self.k1, self.b = k1, b
        self.avg = sum(len(t) for t in self.toks) / max(1, len(self.toks))
        df: dict[str, int] = {}
        self.tf: list[dict[str, int]] = []
        for t in self.toks:
            tf: dict[str, int] = {}
            for w in t:
                tf[w] = tf.get(w, 0) + 1
            self.tf.append(tf)
            for w in tf:
                df[w] = df.get(w, 0) + 1
        n = len(self.toks)
        self.idf = {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}
        self.norm = [self.k1 * (1 - self.b + self.b * len(t) / self.avg) for t in self.toks]

    def scores(self, query: str) -> np.ndarray:
        q = terms(query)
        out = np.zeros(len(self.toks))
        for i, tf in enumerate(self.tf):
            if not tf:
                continue
            norm = self.norm[i]
            out[i] = sum(self.idf.get(w, 0.0) * tf[w] * (self.k1 + 1) / (tf[w] + norm) for w in q if w in tf)
        return out


def take_within(lines: Sequence[tuple[str, tuple[str, ...]]], budget: int) -> list[tuple[str, tuple[str, ...]]]:
    """Lines taken in rank order while they fit ``budget`` tokens (one that does not fit is skipped)."""
    used = 0
    out = []
    for line, sources in lines:
        t = line_tokens(line)
        if used + t <= budget:
            used += t
            out.append((line, sources))
    return out


def evidence_recall(found: set[str], evidence: tuple[str, ...]) -> float:
    return sum(1 for e in evidence if e in found) / len(evidence)


_WORD = re.compile(r"[a-z0-9]+")


def content_words(text: str) -> set[str]:
    """Lower-cased ``[a-z0-9]+`` words without stop words: what answer recall compares."""
    return {w for w in _WORD.findall(text.lower()) if w not in STOPWORDS}


def answer_recall(answer: str, shown: str) -> float | None:
    """Share of the answer's content words present in the text shown; None when the answer has none."""
    want = content_words(answer)
    return len(want & content_words(shown)) / len(want) if want else None


def raw_text(t: Turn) -> str:
    return f"{t.speaker}: {t.text}"


def dated_text(t: Turn) -> str:
    return f"({day_text(t.at)}) {t.speaker}: {t.text}"


def rrf(*rankings: np.ndarray, k: int = 60) -> np.ndarray:
    """Reciprocal-rank fusion of rankings (arrays of indices, best first) into one ranking."""
    score = np.zeros(len(rankings[0]))
    for r in rankings:
        score[r] += 1.0 / (k + 1 + np.arange(len(r)))
    return np.argsort(-score, kind="stable")


class _Tally:
    """Per system × budget × category: evidence recall, answer recall, tokens."""

    def __init__(self) -> None:
        self.ev: dict[tuple[str, int, int], list[float]] = {}
        self.ans: dict[tuple[str, int, int], list[float]] = {}
        self.tok: dict[tuple[str, int], list[int]] = {}

    def add(self, system: str, budget: int, qa: QA, taken: Sequence[tuple[str, tuple[str, ...]]],
            evidence: bool = True) -> None:
        if evidence:
            found = {s for _, srcs in taken for s in srcs}
            self.ev.setdefault((system, budget, qa.category), []).append(evidence_recall(found, qa.evidence))
        self.tok.setdefault((system, budget), []).append(sum(line_tokens(line) for line, _ in taken))
        if qa.category in ANSWER_CATEGORIES:
            r = answer_recall(qa.answer, "\n".join(line for line, _ in taken))
            if r is not None:
                self.ans.setdefault((system, budget, qa.category), []).append(r)

    @staticmethod
    def _mean(d: dict[Any, list[float]], pred: Callable[[Any], bool]) -> float | None:
        vals = [v for k, vs in d.items() if pred(k) for v in vs]
        return round(statistics.fmean(vals), 4) if vals else None

    def summary(self, system: str, budget: int) -> dict[str, Any]:
        def mine(k: Any) -> bool:
            return bool(k[0] == system and k[1] == budget)

        def of(cat: int) -> Callable[[Any], bool]:
            return lambda k: mine(k) and k[2] == cat
        cats = sorted({k[2] for k in self.ev if mine(k)} | {k[2] for k in self.ans if mine(k)})
        toks = self.tok.get((system, budget), [])
        return {"evidence_recall": self._mean(self.ev, mine), "answer_recall": self._mean(self.ans, mine),
                "tokens_mean": round(statistics.fmean(toks), 1) if toks else None,
                "by_category": {str(c): {"evidence_recall": self._mean(self.ev, of(c)),
                                         "answer_recall": self._mean(self.ans, of(c))} for c in cats}}


# ---- the benchmark ---------------------------------------------------------------------------
def run(data: str | Path, budgets: Sequence[int] = (500, 1000, 2000), *, embedder: Embedder | None = None,
        progress: Callable[[str, int, int], None] | None = None, workdir: str | None = None,
        config: MemoryConfig | None = None, turn: TurnConfig | None = None, limit: int | None = None,
        consolidate: bool = True, ablation: bool = False) -> dict[str, Any]:
    """Every system at every budget; the soul recalls ``turn.recall_k`` items and packs them as the loop does.
    The headline budget is ``turn.memory_tokens`` (the loop's default). After a conversation is observed its
    memory is consolidated (``consolidate``; timed apart from ingest); ``ablation``: the soul's parts are also
    scored apart (:mod:`soul_runtime.bench.ablation`)."""
    embedder = embedder or default_embedder()
    turn = turn or TurnConfig()
    model = make_model("offline")
    budgets = sorted(set(budgets))
    tally = _Tally()
    recall_ms: list[float] = []
    ingest_s = consolidate_s = 0.0
    n_msgs = 0
    stored: dict[str, int] = {"episodes": 0, "facts": 0, "procedures": 0}
    full_tokens: list[int] = []
    full_dated_tokens: list[int] = []
    root = Path(workdir or tempfile.mkdtemp(prefix="locomo-"))
    convs = conversations(data)[:limit]
    for conv, turns, qas in convs:
        name = conv.sample_id
        n_msgs += len(turns)
        mem = SoulMemory(root / name, embedder=embedder, config=config)
        soul = Soul(f"locomo-{name}", root / name, memory=mem, model=model)
        t0 = time.perf_counter()
        for bi, batch in enumerate(conv.batches):
            soul.observe(batch.messages, at=batch.at, session=batch.session)
            if progress:
                progress(f"{name}: ingest", bi + 1, len(conv.batches))
        ingest_s += time.perf_counter() - t0
        st = mem.stats()
        for key in stored:
            stored[key] += st[key]
        now = max(t.at for t in turns) + DAY
        before = [mem.recall(q.question, turn.recall_k, at=now) for q in qas] if ablation else None
        t0 = time.perf_counter()
        if consolidate:
            mem.consolidate(now)
        consolidate_s += time.perf_counter() - t0
        raw = [(raw_text(t), (t.id,)) for t in turns]
        dated = [(dated_text(t), (t.id,)) for t in turns]
        bm25 = BM25([text for text, _ in raw])
        vecs = embedder.embed([text for text, _ in raw])
        qvecs = embedder.embed([q.question for q in qas])
        for qi, q in enumerate(qas):
            t0 = time.perf_counter()
            items: list[RecalledItem] = mem.recall(q.question, turn.recall_k, at=now)
            recall_ms.append((time.perf_counter() - t0) * 1000)
            b_rank = np.argsort(-bm25.scores(q.question), kind="stable")
            d_rank = np.argsort(-(vecs @ qvecs[qi]), kind="stable")
            ranked = {"bm25": [raw[i] for i in b_rank], "dense": [raw[i] for i in d_rank],
                      "hybrid": [raw[i] for i in rrf(b_rank, d_rank)], "bm25_dated": [dated[i] for i in b_rank]}
            for b in budgets:
                for system, (its, rr) in variants(items, before[qi] if before is not None else None).items():
                    tally.add(system, b, q, packed(its, b, now, q.question, rr))
                for s, lines in ranked.items():
                    tally.add(s, b, q, take_within(lines, b))
            tally.add("full", 0, q, raw, evidence=False)
            tally.add("full_dated", 0, q, dated, evidence=False)
            full_tokens.append(sum(line_tokens(text) for text, _ in raw))
            full_dated_tokens.append(sum(line_tokens(text) for text, _ in dated))
            if progress and (qi + 1) % 25 == 0:
                progress(f"{name}: questions", qi + 1, len(qas))
        soul.close()
        mem.close()
    head = turn.memory_tokens if turn.memory_tokens in budgets else budgets[len(budgets) // 2]
    res: dict[str, Any] = {"budgets": budgets, "headline_budget": head, "recall_k": turn.recall_k,
                           "systems": {s: {str(b): tally.summary(s, b) for b in budgets}
                                       for s in SYSTEMS + (tuple(ABLATIONS) if ablation else ())}}
    res["ceiling"] = {s: tally.summary(s, 0) for s in ("full", "full_dated")}
    res["details"] = {**_details(convs, recall_ms, res["systems"]["soul"][str(head)], full_tokens, full_dated_tokens),
                      "raw_turns": n_msgs, "stored": stored,
                      "ingest_messages_per_s": round(n_msgs / ingest_s, 1) if ingest_s else None,
                      "consolidate_s": round(consolidate_s, 2),
                      "embedder": embedder.embedder_id, "model": model.label}
    res["ratios"] = {str(b): {f"answer_vs_{s}": _ratio(res["systems"]["soul"][str(b)]["answer_recall"],
                                                       res["systems"][s][str(b)]["answer_recall"])
                              for s in ("bm25", "hybrid", "bm25_dated")} for b in budgets}
    return res


def _details(convs: list[Any], recall_ms: list[float], soul_head: dict[str, Any], full_tokens: list[int],
             full_dated_tokens: list[int]) -> dict[str, Any]:
    """The run's counts, recall times and tokens beside its scores."""
    qs = sorted(recall_ms)
    full_mean = statistics.fmean(full_tokens) if full_tokens else 0.0
    return {
        "conversations": len(convs), "questions": sum(len(q) for _, _, q in convs),
        "answer_questions": sum(1 for _, _, qq in convs for q in qq
                                if q.category in ANSWER_CATEGORIES and content_words(q.answer)),
        "recall_p50_ms": round(qs[len(qs) // 2], 2) if qs else None,
        "recall_p99_ms": round(qs[min(len(qs) - 1, int(len(qs) * 0.99))], 2) if qs else None,
        "tokens_used_mean": soul_head["tokens_mean"], "full_context_tokens_mean": round(full_mean, 1),
        "full_dated_tokens_mean": round(statistics.fmean(full_dated_tokens), 1) if full_dated_tokens else None,
        "token_share": round((soul_head["tokens_mean"] or 0) / full_mean, 4) if full_mean else None,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def plot(res: dict[str, Any], path: str | Path) -> None:
    from soul_runtime.bench.plotting import pyplot
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    styles = {"soul": "o-", "bm25": "s--", "dense": "^--", "hybrid": "v--", "bm25_dated": "d:"}
    for ax, metric in zip(axes, ("answer_recall", "evidence_recall"), strict=True):
        for s, style in styles.items():
            xs = [int(b) for b in res["budgets"]]
            ys = [res["systems"][s][str(x)][metric] for x in xs]
            if all(y is not None for y in ys):
                ax.plot(xs, ys, style, label=LABELS[s])
        if metric == "answer_recall":
            for s, ls in (("full", "-."), ("full_dated", ":")):
                y = res["ceiling"][s]["answer_recall"]
                if y is not None:
                    ax.axhline(y, color="grey", linestyle=ls, label=LABELS[s])
        ax.set_xlabel("memory budget (tokens)")
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_title(f"LoCoMo {metric.replace('_', ' ')} vs budget")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
