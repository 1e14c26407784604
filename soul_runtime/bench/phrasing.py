"""`soul bench phrasing`: does the offline model get the current facts right on ordinary phrasing?

A corpus line (JSONL) is one short conversation of one user with a soul::

    {"id": "k03", "split": "held", "kind": "correct", "user": "Lena",
     "turns": ["My phone is a Pixel 7.", "yes", "I upgraded to a Pixel 9 last month."],
     "expect": [["phone", "Pixel 9"]]}

Each case runs on a fresh in-process soul (``Soul`` + ``SoulMemory``, the offline model); turns are a
minute apart, or a day apart for ``kind == "repeat"`` (the same fact said again in later sessions).
A case passes when the soul's current facts are exactly the expected ones: as many facts as expected,
and for each ``[hint, value]`` an active fact with that value whose entity and attribute contain the
hint's words. Accuracy is reported per kind and per split (``dev``: the half the rules were tuned on;
``held``: held apart; ``fresh``: written after the tuning, never tuned on).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from soul_runtime.embedding.base import Embedder

T0 = 1_780_000_000.0


def load(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _norm(text: str) -> str:
    t = re.sub(r"[^\w\s:.]", " ", text.lower().replace("'s", "").replace("-", " ").replace("_", " "))
    return " ".join(w.strip(".") for w in t.split() if w.strip(".") not in ("the", "a", "an", ""))


def judge(expect: list[list[str]], facts: list[tuple[str, str, str]]) -> bool:
    """Exactly the expected current facts: the same number, each [hint, value] matched by one of them."""
    if len(facts) != len(expect):
        return False
    return all(any(_norm(v) == _norm(value) and set(_norm(hint).split()) <= set(_norm(f"{e} {a}").split())
                   for e, a, v in facts) for hint, value in expect)


def run_case(case: dict[str, Any], embedder: Embedder) -> list[tuple[str, str, str]]:
    """The current facts (entity, attribute, value) after the case's turns."""
    from soul_runtime.loop.soul import Soul
    from soul_runtime.memory.soul_memory import SoulMemory
    from soul_runtime.models.offline import OfflineModel
    d = Path(tempfile.mkdtemp(prefix="soul-phrasing-"))
    mem = SoulMemory(d, embedder=embedder)
    soul = Soul("phrasing", d, memory=mem, model=OfflineModel())
    try:
        gap = 86_400.0 if case["kind"] == "repeat" else 60.0
        for i, text in enumerate(case["turns"]):
            soul.turn(text, user=case["user"], at=T0 + gap * i)
        return [(f.entity, f.attribute, f.value) for f in mem.facts()]
    finally:
        soul.close()
        mem.close()
        shutil.rmtree(d, ignore_errors=True)


def run(cases: list[dict[str, Any]], embedder: Embedder) -> dict[str, Any]:
    per: dict[str, dict[str, list[int]]] = {"kind": defaultdict(lambda: [0, 0]), "split": defaultdict(lambda: [0, 0])}
    failures = []
    for case in cases:
        got = run_case(case, embedder)
        ok = judge(case["expect"], got)
        for axis in ("kind", "split"):
            per[axis][case.get(axis, "-")][0] += ok
            per[axis][case.get(axis, "-")][1] += 1
        if not ok:
            failures.append({"id": case["id"], "turns": case["turns"], "expected": case["expect"], "got": got})
    passed = sum(ok for ok, _ in per["kind"].values())
    return {"cases": len(cases), "passed": passed, "accuracy": round(passed / max(1, len(cases)), 3),
            "by_kind": {k: {"passed": a, "cases": n} for k, (a, n) in sorted(per["kind"].items())},
            "by_split": {k: {"passed": a, "cases": n} for k, (a, n) in sorted(per["split"].items())},
            "failures": failures}
