"""Corrections: a marked new value or statement ("actually …", "not 15, 16")."""

from __future__ import annotations

import re
from dataclasses import dataclass

from soul_runtime.models.offline_rules.cleaning import clean_value
from soul_runtime.models.offline_rules.words import memo

_CORR_MARK = re.compile(r"^(?i:actually|correction|sorry|wait|oops|no|nope|not quite|i meant|my mistake|wrong|incorrect|"
                        r"scratch that)\b[\s,:;!.\u2014-]*(?P<rest>.*)$")
_BARE = re.compile(r"^(?i:it's|it is|it was|that's|that is|it should be|should be|make that|make it|i meant|"
                   r"it's actually|it is actually)\s+(?P<val>.+)$")
_NOT_BUT = re.compile(r"^(?i:(?:no,?\s*)?(?:it's\s+|it is\s+)?not)\s+(?P<old>.+?)(?:,\s*(?i:but\s+)?|\s+(?i:but)\s+)"
                     r"(?P<new>.+)$")
_BUT_NOT = re.compile(r"^(?i:it's|it is)\s+(?P<new>.+?),\s*(?i:not)\s+(?P<old>.+)$")


@dataclass(frozen=True)
class Correction:
    statement: str = ""  # a full statement to parse ("the Tendril production database is Postgres 16")
    value: str = ""  # a bare new value ("Postgres 16", "16")
    old_hint: str = ""  # the old value when named ("not 15, 16")


_NOT_ANYMORE = re.compile(r"^(?i:it|that)\s+(?:isn't|is not|'s not)\s+(?P<old>.+?)\s+(?:any ?more|now)(?=,)")
_ISNT = re.compile(r"^(?i:it|that)\s+isn't\b")
_NO_LEAD = re.compile(r"^(?i:no|nope|actually),?\s+(?=(?i:it|not))")


@memo
def parse_correction(clause: str, marked: bool = False) -> Correction | None:
    """A correction in ``clause``; ``marked``: the message opened with a correction marker ("no, …", "Fix: …")."""
    s = clause.strip().replace("\u2019", "'")
    s = _NOT_ANYMORE.sub(r"it is not \g<old>", s)
    s = _ISNT.sub("it is not", s)
    for rx in (_BUT_NOT, _NOT_BUT):
        m = rx.match(_NO_LEAD.sub("", s))
        if m and len(m.group("new").split()) <= 6 and clean_value(m.group("new")):
            return Correction(value=clean_value(re.sub(r"^(?i:it's|it is)\s+", "", m.group("new"))),
                              old_hint=clean_value(m.group("old")))
    if re.search(r"\s(?i:is|are) actually\s", s):
        return Correction(statement=re.sub(r"\s+actually\b", "", s, count=1, flags=re.I))
    m = _CORR_MARK.match(s)
    if (not m or not m.group("rest")) and not marked:
        return None
    rest = clean_value(m.group("rest") if m and m.group("rest") else s)
    b = _BARE.match(rest)
    if b or re.search(r"\s(?:is|are)\s", rest):
        return Correction(value=clean_value(b.group("val"))) if b else Correction(statement=rest)
    bare = len(rest.split()) <= 4 and not re.match(r"^(?i:i|we|thanks|thank|worries|problem|way|idea)\b", rest)
    return Correction(value=rest) if bare else None


def replace_number(old: str, new_number: str) -> str:
    """The last number of ``old`` replaced ("Postgres 15", "16" → "Postgres 16")."""
    nums = list(re.finditer(r"\d+(?:\.\d+)*", old))
    return old[:nums[-1].start()] + new_number + old[nums[-1].end():] if nums else new_number
