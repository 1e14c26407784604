"""Semantic policy and reconciliation (pure).

A fact is written only on explicit confirmation, explicit correction, or when the
same value was observed in ``promotion_observations`` distinct episodes. Against
what is stored, every candidate becomes exactly one of:

* ADD    — no active fact for ``entity:attribute`` yet;
* UPDATE — a different value replaces the active one in place; the old value goes
  to history with its sources (never silently contradicted);
* DELETE — a retraction archives the active fact (kept in history, not erased);
* NOOP   — the same value again (one record; sources merged), or not enough
  evidence yet (the observation is counted).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from soul_runtime.config import MemoryConfig
from soul_runtime.records import Fact, FactCandidate, FactVersion, Op
from soul_runtime.text import normalise, terms


def same_value(a: str, b: str) -> bool:
    return normalise(a).strip(" .!") == normalise(b).strip(" .!")


def same_thing(a: str, b: str) -> bool:
    """Do two entity keys name the same thing ("checkout service" / "checkout", "deploys" / "deploy")?"""
    return a == b or bool(set(terms(a)) & set(terms(b)))


def merge_sources(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    return a + tuple(s for s in b if s not in a)


@dataclass(frozen=True)
class FactDecision:
    op: Op
    reason: str
    fact: Fact | None  # the fact as it must be stored afterwards (None: nothing to store)


def _new_fact(c: FactCandidate, now: float, sources: tuple[str, ...], confidence: float) -> Fact:
    return Fact(entity=c.entity, attribute=c.attribute, value=c.value, sources=sources, valid_from=now,
                confidence=confidence, display_entity=c.display_entity or c.entity,
                display_attribute=c.display_attribute or c.attribute.replace("_", " "))


def _replace_value(old: Fact, c: FactCandidate, now: float, reason: str, confidence: float) -> Fact:
    version = FactVersion(value=old.value, sources=old.sources, valid_from=old.valid_from, valid_to=now,
                          reason=reason)
    return replace(old, value=c.value, sources=c.sources, valid_from=now, confidence=confidence,
                   status="active", history=old.history + (version,))


def reconcile_fact(existing: Fact | None, c: FactCandidate, *, observations: int, now: float,
                   cfg: MemoryConfig) -> FactDecision:
    """Decide what one candidate does to the stored fact.

    ``existing`` is the stored fact for the key (active or archived, or None);
    ``observations`` counts the distinct episodes in which this exact value has
    been stated, this one included.
    """
    active = existing if existing is not None and existing.status == "active" else None
    if c.kind == "retracted":
        if active is None:
            return FactDecision(Op.NOOP, "retraction of an unknown fact", None)
        version = FactVersion(active.value, active.sources, active.valid_from, now, "retracted")
        archived = replace(active, status="archived", history=active.history + (version,),
                           sources=merge_sources(active.sources, c.sources))
        return FactDecision(Op.DELETE, "retracted: archived with history", archived)

    if active is not None and same_value(active.value, c.value):
        conf = min(1.0, active.confidence + (0.1 if c.kind == "confirmed" else 0.0))
        merged = replace(active, sources=merge_sources(active.sources, c.sources), confidence=conf)
        return FactDecision(Op.NOOP, f"same value {c.kind} again: sources merged", merged)

    if c.kind in ("confirmed", "corrected"):
        confidence = 1.0 if c.kind == "confirmed" else 0.95
        if active is None:
            base = _new_fact(c, now, c.sources, confidence)
            if existing is not None:  # an archived fact comes back: keep its history
                base = replace(base, history=existing.history)
            return FactDecision(Op.ADD, f"explicit {'confirmation' if c.kind == 'confirmed' else 'correction'}",
                                base)
        return FactDecision(Op.UPDATE, f"explicit {c.kind}: '{active.value}' → '{c.value}', old value archived",
                            _replace_value(active, c, now, c.kind, confidence))

    # a plain statement: counts as an observation until seen often enough
    if observations < cfg.promotion_observations:
        return FactDecision(Op.NOOP, f"observed {observations}/{cfg.promotion_observations}: not yet a fact", None)
    if active is None:
        fact = _new_fact(c, now, c.sources, 0.8)
        if existing is not None:
            fact = replace(fact, history=existing.history)
        return FactDecision(Op.ADD, f"promoted: seen in {observations} episodes", fact)
    return FactDecision(Op.UPDATE, f"promoted over '{active.value}': seen in {observations} episodes",
                        _replace_value(active, c, now, "superseded by repeated observation", 0.8))
