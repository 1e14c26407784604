"""`soul bench english`: does the offline model learn the right current fact from ordinary English?

A corpus line (JSONL) is one short conversation of one user with a soul::

    {"id": "correct_verb-01", "split": "dev", "kind": "correct_verb", "user": "Eli",
     "turns": ["The Atlas launch is on September 14.", "yes", "The Atlas launch was pushed back to October 2."],
     "expect": [{"about": ["atlas", "atlas launch"], "attribute": ["date", "when", "schedule"],
                 "value": ["October 2"]}],
     "stale": ["September 14"]}

``expect`` names each fact by meaning, not by the key a model happens to choose: ``about`` lists ways to
name the thing, ``attribute`` ways to name what about it ("" = anything), ``value`` the accepted spellings
of the value. An active fact matches when its value is one of ``value`` (case, articles and punctuation
aside), every word of one ``about`` name is a word of its entity and attribute, and every word of one
``attribute`` name begins a word of them ("deploy" meets "deployed_on"). A case passes when every
expected fact is matched and no active fact holds a ``stale`` value; a case that expects nothing passes
only when no fact at all was stored. Facts beyond the expected ones are counted (``extra``), not failed.

Beside it, in the same run, the baseline: the same model with the semantic store matching candidates to
stored facts by exact and normalised keys only (``fact_match_similarity`` 1.0, no reconciliation by meaning).

The corpus is split by a fixed rule (within each kind, every second case is ``held``); the held part is
never used to tune the rules. Each case runs on a fresh in-process soul (``Soul`` + ``SoulMemory``, the
offline model, turns a minute apart or ``gap_s`` seconds).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from soul_apps.bench.phrasing import run_case
from soul_runtime.config import MemoryConfig
from soul_runtime.embedding.base import Embedder
from soul_runtime.text import singular


def load(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _value(text: str) -> str:
    t = re.sub(r"[^\w\s:./#@+-]", " ", text.lower().replace("\u2019", "'").replace("'s ", " "))
    return " ".join(w.strip(".") for w in t.split() if w.strip(".") not in ("the", "a", "an", ""))


def _words(text: str) -> list[str]:
    t = re.sub(r"[^a-z0-9]+", " ", text.lower().replace("'s", "").replace("_", " ").replace("-", " "))
    return [singular(w) for w in t.split()]


def matches(exp: dict[str, Any], fact: tuple[str, str, str]) -> bool:
    """Is the active fact (entity, attribute, value) the expected one?"""
    entity, attribute, value = fact
    if _value(value) not in {_value(v) for v in exp["value"]}:
        return False
    words = set(_words(f"{entity} {attribute}"))
    about = any(set(_words(a)) <= words for a in exp["about"])
    what = any(all(any(w.startswith(p) for w in words) for p in _words(a)) for a in exp["attribute"])
    return about and what


def stale_values(stale: list[str], facts: list[tuple[str, str, str]]) -> list[str]:
    """The stale values some active fact still holds."""
    gone = {_value(s) for s in stale}
    return [v for _, _, v in facts if _value(v) in gone]


def judge(case: dict[str, Any], facts: list[tuple[str, str, str]]) -> tuple[bool, int]:
    """(passed, facts beyond the expected ones)."""
    expect = case["expect"]
    if not expect:
        return not facts, len(facts)
    hit = [next((f for f in facts if matches(e, f)), None) for e in expect]
    extra = len([f for f in facts if f not in hit])
    return all(hit) and not stale_values(case.get("stale", []), facts), extra


def _score(cases: list[dict[str, Any]], embedder: Embedder, config: MemoryConfig) -> dict[str, Any]:
    per: dict[str, dict[str, list[int]]] = {"kind": defaultdict(lambda: [0, 0]), "split": defaultdict(lambda: [0, 0])}
    failures, extra = [], 0
    for case in cases:
        got = run_case(case, embedder, config)
        ok, more = judge(case, got)
        extra += more
        for axis in ("kind", "split"):
            per[axis][case[axis]][0] += ok
            per[axis][case[axis]][1] += 1
        if not ok:
            failures.append({"id": case["id"], "split": case["split"], "kind": case["kind"], "turns": case["turns"],
                             "expected": case["expect"], "stale": case.get("stale", []), "got": got})
    passed = sum(a for a, _ in per["kind"].values())
    return {"cases": len(cases), "passed": passed, "accuracy": round(passed / max(1, len(cases)), 3),
            "extra_facts": extra,
            "by_kind": {k: {"passed": a, "cases": n} for k, (a, n) in sorted(per["kind"].items())},
            "by_split": {k: {"passed": a, "cases": n} for k, (a, n) in sorted(per["split"].items())},
            "failures": failures}


def run(cases: list[dict[str, Any]], embedder: Embedder) -> dict[str, Any]:
    """The corpus with the stores' defaults, and beside it (``baseline``) the same model and corpus with the
    semantic store matching candidates to stored facts by exact and normalised keys only (no meaning)."""
    out = _score(cases, embedder, MemoryConfig())
    out["baseline"] = {k: v for k, v in _score(cases, embedder, MemoryConfig(fact_match_similarity=1.0)).items()
                       if k != "failures"}
    return out
