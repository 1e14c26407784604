"""`soul bench phrasing`: does the offline model get the current facts right on ordinary phrasing?

A corpus line (JSONL) is one short conversation of one user with a soul::

    {"id": "k03", "split": "tuning-1", "kind": "correct", "user": "Lena",
     "turns": ["My phone is a Pixel 7.", "yes", "I upgraded to a Pixel 9 last month."],
     "expect": [["phone", "Pixel 9"]]}

A case about tasks (kinds ``task`` and ``save``) also says which procedures it should leave::

    "expect_procedures": [{"task": "backup", "steps": 3, "words": ["drive", "rsync", "checksums"]}]

Each case runs on a fresh in-process soul (``Soul`` + ``SoulMemory``, the offline model); turns are a
minute apart, a day apart for ``kind`` ``repeat`` and ``task`` (the same fact said again, or the same
task run again, in later sessions), or ``gap_s`` seconds when the case sets it.
A case passes when the soul's current facts are exactly the expected ones: as many facts as expected,
and for each ``[hint, value]`` an active fact with that value whose entity and attribute contain the
hint's words; and its active procedures are exactly the expected ones (none when the case names
none): as many, and for each one a procedure whose task class contains ``task``, with ``steps`` steps,
each of ``words`` found in one of them. Accuracy is reported per kind and per split: ``tuning-1`` …
``tuning-6`` hold the cases the offline rules were fitted to; ``holdout-1`` … ``holdout-3`` cases kept apart
from that fitting; ``blind`` cases kept apart whose failures were never read either (the fairest estimate
of the rules on new wording).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from soul_runtime.config import MemoryConfig
from soul_runtime.embedding.base import Embedder

T0 = 1_780_000_000.0
# each case opens a fresh soul: on a RAM-backed directory when there is one (the judge is the same; only the
# fsyncs of hundreds of throw-away stores are saved)
_SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def load(path: str | Path) -> list[dict[str, Any]]:
    """The corpus's cases (JSON lines)."""
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


def judge_procedures(expect: list[dict[str, Any]], procs: list[tuple[str, tuple[str, ...]]]) -> bool:
    """Exactly the expected active procedures: the same number, each matched by one (task class, steps)."""
    if len(procs) != len(expect):
        return False

    def fits(e: dict[str, Any], task: str, steps: tuple[str, ...]) -> bool:
        low = [s.lower() for s in steps]
        return (str(e["task"]).lower() in task.lower().replace("_", " ").replace("-", " ")
                or str(e["task"]).lower() in task.lower()) and len(steps) == int(e["steps"]) \
            and all(any(str(w).lower() in s for s in low) for w in e.get("words", ()))
    return all(any(fits(e, t, st) for t, st in procs) for e in expect)


def run_case(case: dict[str, Any], embedder: Embedder, config: MemoryConfig | None = None) -> list[tuple[str, str, str]]:
    """The current facts (entity, attribute, value) after the case's turns."""
    return run_case_full(case, embedder, config)[0]


def run_case_full(case: dict[str, Any], embedder: Embedder, config: MemoryConfig | None = None
                  ) -> tuple[list[tuple[str, str, str]], list[tuple[str, tuple[str, ...]]]]:
    """The current facts (entity, attribute, value) and active procedures (task class, steps) after the turns."""
    from soul_runtime.loop.soul import Soul
    from soul_runtime.memory.soul_memory import SoulMemory
    from soul_runtime.models.offline import OfflineModel
    d = Path(tempfile.mkdtemp(prefix="soul-phrasing-", dir=_SCRATCH))
    mem = SoulMemory(d, embedder=embedder, config=config)
    soul = Soul("phrasing", d, memory=mem, model=OfflineModel())
    try:
        gap = float(case.get("gap_s") or (86_400.0 if case["kind"] in ("repeat", "task") else 60.0))
        for i, text in enumerate(case["turns"]):
            soul.turn(text, user=case["user"], at=T0 + gap * i)
        return ([(f.entity, f.attribute, f.value) for f in mem.facts()],
                [(p.task_class, tuple(p.steps)) for p in mem.procedures() if p.status == "active"])
    finally:
        soul.close()
        mem.close()
        shutil.rmtree(d, ignore_errors=True)


def run(cases: list[dict[str, Any]], embedder: Embedder) -> dict[str, Any]:
    per: dict[str, dict[str, list[int]]] = {"kind": defaultdict(lambda: [0, 0]), "split": defaultdict(lambda: [0, 0])}
    failures = []
    for case in cases:
        got, procs = run_case_full(case, embedder)
        ok = judge(case["expect"], got) and judge_procedures(case.get("expect_procedures", []), procs)
        for axis in ("kind", "split"):
            per[axis][case.get(axis, "-")][0] += ok
            per[axis][case.get(axis, "-")][1] += 1
        if not ok:
            failures.append({"id": case["id"], "split": case.get("split", "-"), "kind": case["kind"],
                             "turns": case["turns"], "expected": case["expect"], "got": got,
                             **({"expected_procedures": case.get("expect_procedures", []),
                                 "got_procedures": procs} if procs or case.get("expect_procedures") else {})})
    passed = sum(ok for ok, _ in per["kind"].values())
    return {"cases": len(cases), "passed": passed, "accuracy": round(passed / max(1, len(cases)), 3),
            "by_kind": {k: {"passed": a, "cases": n} for k, (a, n) in sorted(per["kind"].items())},
            "by_split": {k: {"passed": a, "cases": n} for k, (a, n) in sorted(per["split"].items())},
            "failures": failures}
