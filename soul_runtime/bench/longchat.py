"""`soul bench longchat`: what a model is shown from memory of long technical chats, under a token budget.

Each chat (:mod:`soul_runtime.bench.longchat_data`) is observed session by session by one soul through the
public write path (``Soul.observe``, offline model, the default embedder). Then, at the day after the last
session, every question recalls ``TurnConfig.recall_k`` items and the context assembler packs them into the
budget exactly as for a turn (:func:`soul_runtime.loop.context.pack_memory`). Two metrics, both on what is
shown:

* **evidence recall** — the share of the question's evidence message ids among the sources of the lines taken;
* **key-phrase recall** — the share of the question's key phrases (a version, a figure with its unit, a date, a
  ``setting=value``, the words of a proposal) found, case-insensitively, in the text of the lines taken.

Baselines in the same run, same budgets, same token count per line: BM25 (k1 1.2, b 0.75, the engine's own
tokenizer :func:`soul_runtime.text.terms`) over whole raw messages — the first message that does not fit is
shown clipped to what is left of the budget — and over ~400-character chunks of each message (split at
sentence ends and blank lines, packed up to 400 characters; a longer piece is cut at white space).
Also reported: sessions and messages refused, ingest rate (messages/s, characters/s) and the process's
resident memory (RSS) after each chat and at its peak.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from soul_runtime.bench.locomo import BM25, take_within
from soul_runtime.bench.longchat_data import DAY, Chat, Question, load
from soul_runtime.config import MemoryConfig, TurnConfig
from soul_runtime.embedding.base import Embedder, default_embedder
from soul_runtime.errors import SoulError
from soul_runtime.loop.context import line_tokens, pack_memory
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.choice import make_model
from soul_runtime.records import RecalledItem

SYSTEMS = ("soul", "bm25_chunks", "bm25_messages")
LABELS = {"soul": "soul-runtime", "bm25_chunks": "BM25 over ~400-character chunks",
          "bm25_messages": "BM25 over whole messages"}
CHUNK_CHARS = 400
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n")


def chunks(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """``text`` in pieces of about ``size`` characters: split at sentence ends and blank lines, consecutive
    pieces packed while they fit ``size``; a piece longer than ``size`` is cut at white space."""
    pieces: list[str] = []
    for piece in (p.strip() for p in _SENTENCE_END.split(text)):
        while len(piece) > size:
            cut = piece.rfind(" ", 0, size)
            cut = cut if cut > size // 2 else size
            pieces.append(piece[:cut].strip())
            piece = piece[cut:].strip()
        if piece:
            pieces.append(piece)
    out: list[str] = []
    for piece in pieces:
        if out and len(out[-1]) + 1 + len(piece) <= size:
            out[-1] += " " + piece
        else:
            out.append(piece)
    return out


def take_clipped(lines: Sequence[tuple[str, tuple[str, ...]]], budget: int) -> list[tuple[str, tuple[str, ...]]]:
    """Lines in rank order while they fit ``budget`` tokens; the first that does not fit is shown cut to what is
    left (whole messages are longer than most budgets), and nothing after it."""
    used, out = 0, []
    for line, sources in lines:
        t = line_tokens(line)
        if used + t <= budget:
            used += t
            out.append((line, sources))
            continue
        room = (budget - used - 1) * 4
        if room >= 40:
            out.append((line[:room], sources))
        break
    return out


def key_phrase_recall(q: Question, shown: str) -> float:
    low = shown.lower()
    return sum(1 for k in q.key_phrases if k.lower() in low) / len(q.key_phrases)


def evidence_recall(q: Question, taken: Sequence[tuple[str, tuple[str, ...]]]) -> float:
    found = {s for _, srcs in taken for s in srcs}
    return sum(1 for e in q.evidence if e in found) / len(q.evidence)


def rss_mib() -> tuple[float, float]:
    """This process's resident memory now and at its peak (MiB), from /proc."""
    now = peak = 0.0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                now = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    except OSError:
        pass
    return round(now, 1), round(peak, 1)


class Tally:
    def __init__(self) -> None:
        self.vals: dict[tuple[str, int, str, str], list[float]] = {}
        self.tok: dict[tuple[str, int], list[int]] = {}

    def add(self, system: str, budget: int, q: Question, taken: Sequence[tuple[str, tuple[str, ...]]]) -> None:
        shown = "\n".join(line for line, _ in taken)
        self.vals.setdefault((system, budget, q.kind, "evidence_recall"), []).append(evidence_recall(q, taken))
        self.vals.setdefault((system, budget, q.kind, "key_phrase_recall"), []).append(key_phrase_recall(q, shown))
        self.tok.setdefault((system, budget), []).append(sum(line_tokens(line) for line, _ in taken))

    def _mean(self, pred: Callable[[tuple[str, int, str, str]], bool]) -> float | None:
        vals = [v for k, vs in self.vals.items() if pred(k) for v in vs]
        return round(statistics.fmean(vals), 4) if vals else None

    def summary(self, system: str, budget: int) -> dict[str, Any]:
        def mean(metric: str, kind: str | None = None) -> float | None:
            return self._mean(lambda k: k[0] == system and k[1] == budget and k[3] == metric
                              and (kind is None or k[2] == kind))
        kinds = sorted({k[2] for k in self.vals if k[0] == system and k[1] == budget})
        toks = self.tok.get((system, budget), [])
        metrics = ("evidence_recall", "key_phrase_recall")
        return {**{m: mean(m) for m in metrics}, "tokens_mean": round(statistics.fmean(toks), 1) if toks else None,
                "by_kind": {kind: {m: mean(m, kind) for m in metrics} for kind in kinds}}


def _sessions(chat: Chat) -> list[tuple[str, list[dict[str, Any]]]]:
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for m in chat.messages:
        if not out or out[-1][0] != m["session"]:
            out.append((m["session"], []))
        out[-1][1].append({"id": m["id"], "speaker": m["speaker"], "text": m["text"], "at": m["at"]})
    return out


def score_questions(chat: Chat, recall: Callable[[str, float], Sequence[RecalledItem]], tally: Tally,
                    budgets: Sequence[int], progress: Callable[[str, int, int], None] | None = None) -> list[float]:
    """Every question of ``chat`` at every budget: the soul's recall (``recall(question, at)``, at the day after
    the last session) packed as for a turn, beside BM25 over whole messages and over chunks; the recall
    latencies (ms)."""
    now = max(m["at"] for m in chat.messages) + DAY
    raw = [(f"{m['speaker']}: {m['text']}", (m["id"],)) for m in chat.messages]
    pieces = [(f"{m['speaker']}: {c}", (m["id"],)) for m in chat.messages for c in chunks(m["text"])]
    bm_msg, bm_chunk = BM25([t for t, _ in raw]), BM25([t for t, _ in pieces])
    recall_ms = []
    for qi, q in enumerate(chat.questions):
        t1 = time.perf_counter()
        items = recall(q.question, now)
        recall_ms.append((time.perf_counter() - t1) * 1000)
        by_msg = [raw[i] for i in np.argsort(-bm_msg.scores(q.question), kind="stable")]
        by_chunk = [pieces[i] for i in np.argsort(-bm_chunk.scores(q.question), kind="stable")]
        for b in budgets:
            tally.add("soul", b, q, [(line, it.sources) for it, line in pack_memory(items, b, now, q.question)])
            tally.add("bm25_chunks", b, q, take_within(by_chunk, b))
            tally.add("bm25_messages", b, q, take_clipped(by_msg, b))
        if progress and (qi + 1) % 10 == 0:
            progress(f"{chat.chat_id}: questions", qi + 1, len(chat.questions))
    return recall_ms


def run(data: str | Path, budgets: Sequence[int] = (500, 1000, 2000), *, embedder: Embedder | None = None,
        progress: Callable[[str, int, int], None] | None = None, workdir: str | None = None,
        config: MemoryConfig | None = None, turn: TurnConfig | None = None, limit: int | None = None
        ) -> dict[str, Any]:
    """Every system at every budget on the chats in ``data`` (a directory of chat files or one file)."""
    embedder = embedder or default_embedder()
    turn = turn or TurnConfig()
    model = make_model("offline")
    budgets = sorted(set(budgets))
    tally = Tally()
    root = Path(workdir or tempfile.mkdtemp(prefix="longchat-"))
    chats = load(data)[:limit]
    per_chat: list[dict[str, Any]] = []
    ingest_s = 0.0
    n_msgs = n_chars = 0
    refused: list[str] = []
    for chat in chats:
        mem = SoulMemory(root / chat.chat_id, embedder=embedder, config=config)
        soul = Soul(f"longchat-{chat.seed}", root / chat.chat_id, memory=mem, model=model)
        sessions = _sessions(chat)
        t0 = time.perf_counter()
        for si, (name, batch) in enumerate(sessions):
            try:
                soul.observe(batch, session=name)
            except SoulError as e:  # counted, never hidden: the floor is none
                refused.append(f"{chat.chat_id}/{name}: {type(e).__name__}: {e}")
            if progress:
                progress(f"{chat.chat_id}: ingest", si + 1, len(sessions))
        took = time.perf_counter() - t0
        ingest_s += took
        n_msgs += len(chat.messages)
        n_chars += chat.chars
        rss, peak = rss_mib()

        def recall(q: str, at: float, m: SoulMemory = mem) -> list[RecalledItem]:
            return m.recall(q, turn.recall_k, at=at)
        recall_ms = score_questions(chat, recall, tally, budgets, progress)
        st = mem.stats()
        per_chat.append({"chat": chat.chat_id, "messages": len(chat.messages), "chars": chat.chars,
                         "tokens": chat.chars // 4, "questions": len(chat.questions),
                         "ingest_s": round(took, 2), "messages_per_s": round(len(chat.messages) / took, 2),
                         "chars_per_s": round(chat.chars / took), "rss_mib": rss, "rss_peak_mib": peak,
                         "episodes": st["episodes"], "facts": st["facts"], "procedures": st["procedures"],
                         "recall_p50_ms": round(sorted(recall_ms)[len(recall_ms) // 2], 2) if recall_ms else None})
        soul.close()
        mem.close()
    res = summary(tally, budgets, turn)
    res["details"] = {"chats": len(chats), "seeds": sorted({c.seed for c in chats}),
                      "questions": sum(len(c.questions) for c in chats), "messages": n_msgs, "chars": n_chars,
                      "refused": refused, "ingest_messages_per_s": round(n_msgs / ingest_s, 2) if ingest_s else None,
                      "ingest_chars_per_s": round(n_chars / ingest_s) if ingest_s else None,
                      "rss_peak_mib": max((c["rss_peak_mib"] for c in per_chat), default=None),
                      "embedder": embedder.embedder_id, "model": model.label, "per_chat": per_chat}
    return res


def summary(tally: Tally, budgets: Sequence[int], turn: TurnConfig) -> dict[str, Any]:
    """Every system's figures at every budget, and the soul's ratios to the baselines."""
    head = turn.memory_tokens if turn.memory_tokens in budgets else budgets[len(budgets) // 2]
    res: dict[str, Any] = {"budgets": list(budgets), "headline_budget": head, "recall_k": turn.recall_k,
                           "systems": {s: {str(b): tally.summary(s, b) for b in budgets} for s in SYSTEMS}}
    res["ratios"] = {str(b): {f"{m}_vs_{s}": _ratio(res["systems"]["soul"][str(b)][m], res["systems"][s][str(b)][m])
                              for s in SYSTEMS[1:] for m in ("evidence_recall", "key_phrase_recall")}
                     for b in budgets}
    return res


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def plot(res: dict[str, Any], path: str | Path) -> None:
    plot_systems(res, path, LABELS, {"soul": "o-", "bm25_chunks": "s--", "bm25_messages": "^:"},
                 ("evidence_recall", "key_phrase_recall"), "long technical chats")


def plot_systems(res: dict[str, Any], path: str | Path, labels: dict[str, str], styles: dict[str, str],
                 metrics: Sequence[str], title: str) -> None:
    """One panel per metric: each system's figure against the memory budget."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4))
    for ax, metric in zip(axes, metrics, strict=True):
        xs = [int(b) for b in res["budgets"]]
        for s, style in styles.items():
            if s not in res["systems"]:
                continue
            ys = [res["systems"][s][str(x)][metric] for x in xs]
            if all(y is not None for y in ys):
                ax.plot(xs, ys, style, label=labels[s])
        ax.set_xlabel("memory budget (tokens)")
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_title(f"{title}: {metric.replace('_', ' ')}")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
