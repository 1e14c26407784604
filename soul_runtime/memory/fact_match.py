"""Which stored fact a candidate is about: reconciliation by meaning, not only by the exact ``entity:attribute`` key.

A model names a fact's attribute in its own words ("written_in", "built_with", "language"); a later
statement about the same thing may use other words ("the Atlas launch slipped to October 2" after "the
Atlas launch date is September 14"). Before a candidate is reconciled (:func:`reconcile_fact`), the
semantic store looks for the active fact it is about, in three steps of decreasing strictness:

1. **exact** — the same key (the store's own lookup);
2. **normalised** — the same words once the entity and attribute are read together, plurals and function
   words aside, and each predicate read as its family (``built_with`` = ``written_in`` = ``language``;
   ``runs_on`` = ``hosted_on`` = ``deployed_to``; ``owner`` = ``owned_by`` = ``maintained_by`` …). Needs no
   embedder, so it works with the ``fast`` hashing embedder too;
3. **meaning** — with an embedder: the same thing (entity terms shared) and an "entity attribute" phrase
   whose embedding is close (cosine ≥ ``MemoryConfig.fact_match_similarity``, 0.85 by default with
   all-MiniLM-L6-v2, and clearly above the next best).

Every step also asks the value's type to agree (a count does not update a date, a version keeps its
product name) and refuses two attributes that name different kinds of one head ("production database" /
"staging database"). Multi-valued attributes (one fact per value: ``likes_jazz``, ``uses_redis``) and names
are only ever matched exactly. The step is pure: the caller hands in the stored facts and, for step 3,
a function giving cosines.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from soul_runtime.memory.policy_semantic import same_thing
from soul_runtime.records import Fact, FactCandidate
from soul_runtime.text import singular

MEANING_MARGIN = 0.03
"""How far the best stored fact must lead the next one for a meaning match."""

_FAMILIES = {
    "built_with": "written built implemented coded developed language framework",
    "runs_on": "run runs hosted host deployed deploy served platform infrastructure",
    "location": "location located based situated city place region lives live where",
    "schedule": "schedule scheduled date time day when happens held",
    "owner": "owner owned owns maintainer maintained managed manager belongs belong responsible handled led lead "
             "administered run_by looked",
    "price": "price cost costs priced",
}
_FAMILY_OF = {w: fam for fam, words in _FAMILIES.items() for w in words.split()}
_FUNCTION = frozenset("the a an of for to in on at by with from is are was its their our my".split())
_VERSION = re.compile(r"^(?P<name>[A-Za-z][\w+#-]*(?:\s+[A-Za-z][\w+#-]*)?)\s+v?\d+(?:\.\d+)*$")
_NUMBER = re.compile(r"^(?:about\s+|around\s+)?[\d][\d,.]*\s*(?P<unit>[^\d].*)?$")
_MONTHS = r"jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec"
_DATE = re.compile(rf"\b(?:{_MONTHS})[a-z]*\b|\b(?:mon|tues|wednes|thurs|fri|satur|sun)day|\b\d{{4}}-\d\d-\d\d\b|"
                   r"\b\d{1,2}(?:st|nd|rd|th)\b|\b\d{1,2}[:.]\d\d\b|\b\d{1,2}\s*(?:am|pm)\b|\bweek\s+\d", re.I)


def value_kind(value: str) -> str:
    """"date", "version", "number" or "text": what kind of value a fact holds."""
    v = value.strip()
    if _DATE.search(v):
        return "date"
    if _VERSION.match(v):
        return "version"
    if _NUMBER.match(v):
        return "number"
    return "text"


def compatible(old: str, new: str) -> bool:
    """Can ``new`` replace ``old`` as the value of one fact? The same kind of value, a version of the same
    product, a count in the same unit; free text only for free text."""
    a, b = value_kind(old), value_kind(new)
    if a != b:
        return False
    if a == "version":
        ma, mb = _VERSION.match(old.strip()), _VERSION.match(new.strip())
        return bool(ma and mb) and ma.group("name").lower() == mb.group("name").lower()  # type: ignore[union-attr]
    if a == "number":
        ua, ub = (_NUMBER.match(x.strip()) for x in (old, new))
        unit = [singular((m.group("unit") or "").split()[0]) if m and m.group("unit") else "" for m in (ua, ub)]
        return unit[0] == unit[1]
    return True


def _words(text: str) -> list[str]:
    return [singular(w) for w in re.findall(r"[a-z0-9]+", text.lower().replace("'s", "")) if w not in _FUNCTION]


def _read(entity: str, attribute: str) -> frozenset[str]:
    """The words of entity and attribute together, each predicate word read as its family."""
    return frozenset(_FAMILY_OF.get(w, w) for w in _words(f"{entity} {attribute.replace('_', ' ')}"))


def multi_valued(c_attribute: str, display_attribute: str) -> bool:
    """A key carrying its value's head ("likes_jazz" for "likes"): one fact per value, never merged."""
    shown = re.sub(r"[^a-z0-9]+", "_", (display_attribute or c_attribute).lower().replace("'s", "")).strip("_")
    return c_attribute in ("name",) or (bool(display_attribute) and shown != c_attribute
                                        and c_attribute.startswith(shown + "_"))


def _kinds_clash(c: FactCandidate, f: Fact) -> bool:
    """Two attributes naming different kinds of one head: "production database" / "staging database"."""
    ea, eb = set(_words(c.entity)), set(_words(f.entity))
    a = {_FAMILY_OF.get(w, w) for w in _words(c.attribute.replace("_", " "))} - eb
    b = {_FAMILY_OF.get(w, w) for w in _words(f.attribute.replace("_", " "))} - ea
    return bool(a - b) and bool(b - a) and bool(a & b)


@dataclass(frozen=True)
class Match:
    fact: Fact
    how: str  # "normalised" | "meaning"
    score: float


def phrase(entity: str, attribute: str) -> str:
    """The text a fact's subject and predicate are embedded as."""
    return f"{entity} {attribute.replace('_', ' ')}".strip()


def match_stored(c: FactCandidate, stored: Sequence[Fact],
                 cosines: Callable[[str, list[str]], list[float]] | None = None, threshold: float = 0.85) -> Match | None:
    """The active stored fact ``c`` is about when its key differs (steps 2 and 3 above), else None."""
    if multi_valued(c.attribute, c.display_attribute):
        return None
    pool = [f for f in stored if f.status == "active" and (f.entity, f.attribute) != (c.entity, c.attribute)
            and not multi_valued(f.attribute, f.display_attribute) and same_thing(f.entity, c.entity)
            and (c.kind == "retracted" or compatible(f.value, c.value)) and not _kinds_clash(c, f)]
    if not pool:
        return None
    mine = _read(c.entity, c.attribute)
    same = [f for f in pool if _read(f.entity, f.attribute) == mine]
    if len(same) == 1:
        return Match(same[0], "normalised", 1.0)
    if same or cosines is None or threshold >= 1.0:
        return None  # two stored facts read alike: not for this step to choose
    scores = cosines(phrase(c.display_entity or c.entity, c.display_attribute or c.attribute),
                     [phrase(f.display_entity or f.entity, f.display_attribute or f.attribute) for f in pool])
    ranked = sorted(zip(scores, range(len(pool)), strict=True), reverse=True)
    best, i = ranked[0]
    runner = ranked[1][0] if len(ranked) > 1 else -1.0
    if threshold < 1.0 and best >= threshold and best - runner >= MEANING_MARGIN:
        return Match(pool[i], "meaning", round(float(best), 4))
    return None
