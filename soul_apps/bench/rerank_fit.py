"""Reproduce the re-ranker's weights (:class:`soul_runtime.loop.rerank.RerankWeights`) on BEAM development chats.

``python -m soul_apps.bench.rerank_fit /path/to/BEAM/chats/1M --chats 3,4`` observes each chat (as
``soul bench beam`` does), recalls every question once, then packs the same candidates under every weight set of
the grid at 1,000 tokens (asked by the chat's user) and prints evidence and key-phrase recall beside chunked
BM25's. The shipped weights
were chosen from this grid on BEAM's 1M chats 3 and 4 (development data: BEAM, read and tuned against); of the
settings that lift key phrases there, the one kept is the one that also keeps LoCoMo's answer and evidence
recall over their floors (LoCoMo, CC BY-NC, was only checked against those floors, never fitted to). The
asker's weight (0.4) was set with the others fixed, on chats 3, 4 and then 10, 31, 32 (``--chats 10,31,32``).

``--widths`` instead recalls each question that asks for a summary (:data:`SUMMARY`) at 1, 2 and 3 times
``recall_k`` and packs it as a turn does (the shipped weights): the key-phrase recall of those questions and of
all, beside chunked BM25's. Twice the candidates lifted summaries on chats 3 and 4 and lowered them on chats 10,
31 and 32: a turn recalls ``recall_k`` for every question (docs/beam.md).
``--full-lines`` instead recalls every question once (digests offered, as a turn recalls) and packs it as a turn
does with each of :data:`FULL_OVER_TIME` memories shown whole for a question over time
(:data:`soul_runtime.loop.context.FULL_LINES_OVER_TIME`): evidence and key-phrase recall beside chunked BM25's,
on all questions and by kind. The shipped 9 was read from it on the nine 1M chats, checked on chats 3, 4; 6 to
9; and 10, 31, 32 apart (``--chats``).
``--stores DIR`` reads the souls ``soul bench beam --stores DIR`` kept instead of observing the chats again.
"""

from __future__ import annotations

import argparse
import itertools
import re
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from soul_apps.bench.beam import ASK_AFTER, ASKER, evidence_recall, ingest, key_phrase_recall
from soul_apps.bench.beam_data import Chat, load
from soul_apps.bench.locomo import BM25, take_within
from soul_apps.bench.longchat import chunks
from soul_runtime.config import MemoryConfig, TurnConfig
from soul_runtime.loop.context import pack_memory
from soul_runtime.loop.rerank import RerankWeights
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.choice import make_model
from soul_runtime.records import RecalledItem

GRID = {"relation": (0.0, 0.6, 0.9), "answer_type": (0.0, 0.1, 0.3), "position": (0.0, 0.3),
        "breadth": (0.0, 0.3, 0.8, 1.2), "asker": (0.0, 0.2, 0.4, 0.8)}
BUDGET = 1000
FULL_OVER_TIME = (6, 9, 12, 16, 20)
"""How many memories ``--full-lines`` shows whole for a question over time (6: as for any other question)."""
SUMMARY = re.compile(r"\b(?:summar\w*|overview|recap)\b", re.I)
"""A question that asks for a summary (what ``--widths`` recalls more candidates for)."""


def chunked_bm25(chat: Chat) -> list[tuple[float | None, float | None]]:
    """Chunked BM25's evidence and key-phrase recall on each question of ``chat``."""
    pieces = [(f"{m['speaker']}: {c}", (m["id"],)) for m in chat.messages for c in chunks(m["text"])]
    bm = BM25([t for t, _ in pieces])
    out = []
    for q in chat.questions:
        lines = take_within([pieces[i] for i in np.argsort(-bm.scores(q.question), kind="stable")[:200]], BUDGET)
        out.append((evidence_recall(q, lines), key_phrase_recall(q, lines)))
    return out


def observed(chat: Chat, workdir: Path, kept: bool, digests: bool) -> SoulMemory:
    """``chat``'s soul's memory: observed into ``workdir`` now, or (``kept``) as ``soul bench beam --stores`` kept it
    there; with its digests offered in recall (consolidated as the bench does) or none (``digests`` False: the
    weights' grid was set so)."""
    mem = SoulMemory(workdir / chat.chat_id, config=None if digests else MemoryConfig(digests_recalled=0))
    if not kept:
        soul = Soul(f"fit-{chat.chat_id}", workdir / chat.chat_id, memory=mem, model=make_model("offline"))
        ingest(chat, soul, [], None)
        soul.close()
    if digests:
        mem.consolidate(max(m["at"] for m in chat.messages) + ASK_AFTER)
    return mem



Recalled = tuple[Chat, float, list[list[RecalledItem]], list[tuple[float | None, float | None]]]


def _recalled(chats: Sequence[Chat], workdir: Path, kept: bool, digests: bool) -> list[Recalled]:
    """Each chat's memory asked each of its questions once (at the time its questions are asked), beside chunked
    BM25's scores."""
    out: list[Recalled] = []
    for chat in chats:
        mem = observed(chat, workdir, kept, digests=digests)
        now = max(m["at"] for m in chat.messages) + ASK_AFTER
        out.append((chat, now, [mem.recall(q.question, TurnConfig().recall_k, at=now) for q in chat.questions],
                    chunked_bm25(chat)))
        mem.close()
    return out


def fit(chats: Sequence[Chat], workdir: Path, kept: bool = False) -> list[dict[str, float]]:
    """Every weight set of GRID scored on ``chats``: means and ratios to chunked BM25."""
    recalled = _recalled(chats, workdir, kept, digests=False)
    rows = []
    for values in itertools.product(*GRID.values()):
        w = RerankWeights(*values)
        ev, kp, bev, bkp = [], [], [], []
        for chat, now, items, base in recalled:
            for q, its, (be, bk) in zip(chat.questions, items, base, strict=True):
                lines = [(line, it.sources) for it, line in pack_memory(its, BUDGET, now, q.question, w, ASKER)]
                if (e := evidence_recall(q, lines)) is not None and be is not None:
                    ev.append(e)
                    bev.append(be)
                if (k := key_phrase_recall(q, lines)) is not None and bk is not None:
                    kp.append(k)
                    bkp.append(bk)
        rows.append({**dict(zip(GRID, values, strict=True)), "evidence": statistics.fmean(ev),
                     "key_phrases": statistics.fmean(kp), "evidence_x": statistics.fmean(ev) / statistics.fmean(bev),
                     "key_phrases_x": statistics.fmean(kp) / statistics.fmean(bkp)})
    return rows


def widths(chats: Sequence[Chat], workdir: Path, kept: bool = False, wider: Sequence[int] = (1, 2, 3)
           ) -> list[dict[str, float]]:
    """Key-phrase recall when a summary question recalls ``w`` times ``recall_k`` candidates, for each ``w``: on
    those questions and on all (the others recalled as always), with chunked BM25's beside."""
    k = TurnConfig().recall_k
    got: dict[int, list[tuple[bool, float, float]]] = {w: [] for w in wider}
    for chat in chats:
        mem = observed(chat, workdir, kept, digests=True)
        now = max(m["at"] for m in chat.messages) + ASK_AFTER
        for q, (_, bk) in zip(chat.questions, chunked_bm25(chat), strict=True):
            if bk is None or not q.key_words:
                continue
            asks_summary = bool(SUMMARY.search(q.question))
            for w in wider:
                if w > 1 and not asks_summary and got[w]:  # the others are recalled as always
                    got[w].append((False, got[1][len(got[w])][1], bk))
                    continue
                its = mem.recall(q.question, k * w if asks_summary else k, at=now)
                lines = [(line, it.sources) for it, line in pack_memory(its, BUDGET, now, q.question)]
                got[w].append((asks_summary, key_phrase_recall(q, lines) or 0.0, bk))
        mem.close()
    rows = []
    for w, vals in got.items():
        summ = [(v, b) for s, v, b in vals if s]
        rows.append({"wider": float(w), "summary_questions": float(len(summ)),
                     "summary_key_phrases_x": statistics.fmean(v for v, _ in summ) / statistics.fmean(b for _, b in summ)
                     if summ else float("nan"),
                     "key_phrases_x": statistics.fmean(v for _, v, _ in vals) / statistics.fmean(b for *_, b in vals)})
    return rows


def full_lines_over_time(chats: Sequence[Chat], workdir: Path, kept: bool = False,
                         values: Sequence[int] = FULL_OVER_TIME) -> list[dict[str, float]]:
    """Evidence and key-phrase recall (and key phrases by kind) against chunked BM25's when a question over time
    shows ``n`` memories whole, for each ``n`` of ``values``; recall asked once per question."""
    recalled = _recalled(chats, workdir, kept, digests=True)
    rows = []
    for n in values:
        got: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for chat, now, items, base in recalled:
            for q, its, (be, bk) in zip(chat.questions, items, base, strict=True):
                lines = [(line, it.sources) for it, line in
                         pack_memory(its, BUDGET, now, q.question, asker=ASKER, full_over_time=n)]
                for metric, v, b in (("evidence", evidence_recall(q, lines), be),
                                     ("key_phrases", key_phrase_recall(q, lines), bk)):
                    if v is not None and b is not None:
                        got.setdefault((metric, q.kind), []).append((v, b))

        def ratio(pairs: list[tuple[float, float]]) -> float:
            return statistics.fmean(v for v, _ in pairs) / max(1e-9, statistics.fmean(b for _, b in pairs))
        row = {"full_over_time": float(n)}
        for metric in ("evidence", "key_phrases"):
            row[f"{metric}_x"] = ratio([p for (m, _), ps in got.items() if m == metric for p in ps])
        row.update({f"kp_x_{kind}": ratio(ps) for (m, kind), ps in sorted(got.items()) if m == "key_phrases"})
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="BEAM chats/1M (development chats only)")
    ap.add_argument("--chats", default="3,4")
    ap.add_argument("--widths", action="store_true", help="the candidates a summary question recalls, not the weights")
    ap.add_argument("--full-lines", action="store_true",
                    help="how many memories a question over time shows whole, not the weights")
    ap.add_argument("--stores", metavar="DIR", help="the souls `soul bench beam --stores DIR` kept (not observed again)")
    args = ap.parse_args(argv)
    chats = [c for c in load(args.data) if c.chat_id in args.chats.split(",")]
    workdir, kept = (Path(args.stores), True) if args.stores else (Path(tempfile.mkdtemp(prefix="rerank-fit-")), False)
    if args.widths:
        for r in widths(chats, workdir, kept):
            print(" ".join(f"{k}={v:.3f}" for k, v in r.items()))
        return
    if args.full_lines:
        for r in full_lines_over_time(chats, workdir, kept):
            print(" ".join(f"{k}={v:.3f}" for k, v in r.items()))
        return
    rows = fit(chats, workdir, kept)
    for r in sorted(rows, key=lambda r: -r["key_phrases"]):
        print(" ".join(f"{k}={v:.3f}" for k, v in r.items()))


if __name__ == "__main__":
    main()
