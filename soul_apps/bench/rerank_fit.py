"""Reproduce the re-ranker's weights (:class:`soul_runtime.loop.rerank.RerankWeights`) on BEAM development chats.

``python -m soul_apps.bench.rerank_fit /path/to/BEAM/chats/1M --chats 3,4`` observes each chat (as
``soul bench beam`` does), recalls every question once, then packs the same candidates under every weight set of
the grid at 1,000 tokens and prints evidence and key-phrase recall beside chunked BM25's. The shipped weights
were chosen from this grid on BEAM's 1M chats 3 and 4 (development data: BEAM, read and tuned against); of the
settings that lift key phrases there, the one kept is the one that also keeps LoCoMo's answer and evidence
recall over their floors (LoCoMo, CC BY-NC, was only checked against those floors, never fitted to).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from soul_apps.bench.beam import ASK_AFTER, evidence_recall, ingest, key_phrase_recall
from soul_apps.bench.beam_data import Chat, load
from soul_apps.bench.locomo import BM25, take_within
from soul_apps.bench.longchat import chunks
from soul_runtime.config import TurnConfig
from soul_runtime.loop.context import pack_memory
from soul_runtime.loop.rerank import RerankWeights
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.choice import make_model
from soul_runtime.records import RecalledItem

GRID = {"relation": (0.0, 0.6, 0.9), "answer_type": (0.0, 0.1, 0.3), "position": (0.0, 0.3),
        "breadth": (0.0, 0.3, 0.8, 1.2)}
BUDGET = 1000


def chunked_bm25(chat: Chat) -> list[tuple[float | None, float | None]]:
    """Chunked BM25's evidence and key-phrase recall on each question of ``chat``."""
    pieces = [(f"{m['speaker']}: {c}", (m["id"],)) for m in chat.messages for c in chunks(m["text"])]
    bm = BM25([t for t, _ in pieces])
    out = []
    for q in chat.questions:
        lines = take_within([pieces[i] for i in np.argsort(-bm.scores(q.question), kind="stable")[:200]], BUDGET)
        out.append((evidence_recall(q, lines), key_phrase_recall(q, lines)))
    return out


def fit(chats: Sequence[Chat], workdir: Path) -> list[dict[str, float]]:
    """Every weight set of GRID scored on ``chats``: means and ratios to chunked BM25."""
    model = make_model("offline")
    recalled: list[tuple[Chat, float, list[list[RecalledItem]], list[tuple[float | None, float | None]]]] = []
    for chat in chats:
        mem = SoulMemory(workdir / chat.chat_id)
        soul = Soul(f"fit-{chat.chat_id}", workdir / chat.chat_id, memory=mem, model=model)
        ingest(chat, soul, [], None)
        now = max(m["at"] for m in chat.messages) + ASK_AFTER
        recalled.append((chat, now, [mem.recall(q.question, TurnConfig().recall_k, at=now) for q in chat.questions],
                         chunked_bm25(chat)))
        soul.close()
        mem.close()
    rows = []
    for values in itertools.product(*GRID.values()):
        w = RerankWeights(*values)
        ev, kp, bev, bkp = [], [], [], []
        for chat, now, items, base in recalled:
            for q, its, (be, bk) in zip(chat.questions, items, base, strict=True):
                lines = [(line, it.sources) for it, line in pack_memory(its, BUDGET, now, q.question, w)]
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


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="BEAM chats/1M (development chats only)")
    ap.add_argument("--chats", default="3,4")
    args = ap.parse_args(argv)
    chats = [c for c in load(args.data) if c.chat_id in args.chats.split(",")]
    rows = fit(chats, Path(tempfile.mkdtemp(prefix="rerank-fit-")))
    for r in sorted(rows, key=lambda r: -r["key_phrases"]):
        print(" ".join(f"{k}={v:.3f}" for k, v in r.items()))


if __name__ == "__main__":
    main()
