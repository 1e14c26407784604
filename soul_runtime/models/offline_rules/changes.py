"""Changes: "we moved X to Y", "X was swapped for Y", "replaced X with Y"."""

from __future__ import annotations

import re
from dataclasses import dataclass

from soul_runtime.models.offline_rules.chat import is_hypothetical, is_question
from soul_runtime.models.offline_rules.cleaning import clean_value
from soul_runtime.models.offline_rules.correction import _BARE
from soul_runtime.models.offline_rules.relations import trim_time
from soul_runtime.models.offline_rules.words import memo

_CHANGE_MARK = re.compile(
    r"^(?i:actually|correction|update|small fix|quick fix|fix|heads up|fyi|sorry|wait|hold on|oops|no|nope|"
    r"not quite|not anymore|not any more|scratch that|my mistake|my bad|i was wrong|i meant|i misspoke|"
    r"i got (?:that|it) wrong|i was mistaken|that's wrong|that was wrong|that's not right|wrong|incorrect|"
    r"to correct myself|change of plan|news)\b[\s,:;!.\u2014\u2013-]*")
TIME_WORDS = frozenset("since recently lately nowadays currently anymore starting week month year sprint ago weve theyve "
                       "while".split())
_CHANGE_ADVERB = re.compile(r"\b(?i:now|from now on|these days|nowadays|anymore|any more|since|starting|as of|going forward|"
                            r"from (?:the )?next \w+|from today|from tomorrow|instead|"
                            r"no longer|recently|lately)\b")
_CHANGE_VERBS = (r"moved|migrated|switched|changed|relocated|upgraded|downgraded|shifted|swapped|transitioned|"
                 r"converted|ported|rewrote|rewritten|rebuilt|replaced|rescheduled|pushed|bumped|updated|traded|"
                 r"exchanged|repointed|cut over|flipped|slipped|grew|grown|rose|risen|went up|went down|gone up|"
                 r"gone down|cut|raised|lowered|increased|decreased|reduced|extended|expanded|shortened|"
                 r"transferred|reassigned|handed|passed|renewed|postponed|delayed|brought forward|(?:is|are) (?:now )?down|"
                 r"(?:is|are) (?:now )?up")
_CHANGE = re.compile(rf"^(?P<ctx>.*?)\b(?P<verb>{_CHANGE_VERBS})\b(?P<obj>.*?)\s+(?:over\s+|back\s+)?"
                     rf"(?P<prep>to|for|with|in|into|onto|by|until|till|from \S+ to)\s+(?P<new>.+)$", re.I)
_TOOK_OVER = re.compile(r"^(?P<new>[A-Z][\w.-]*(?:\s+[A-Z][\w.-]*){0,2})\s+(?:has\s+)?(?:took|taken|takes)\s+over\s+"
                        r"(?P<ctx>.+?)(?:\s+from\s+(?P<old>.+))?$")
_SWAP = re.compile(r"^(?P<ctx>.*?)\b(?:sold|dropped|ditched|gave up|left|quit|retired|cancelled|canceled)\s+"
                   r"(?P<old>.+?)\s+and\s+(?:\w+\s+)?(?:bought|got|picked up|adopted|joined|went with|switched to|"
                   r"moved to|started using|signed up (?:for|with))\s+(?P<new>.+)$", re.I)
_ITS_NOW = re.compile(r"^(?P<ctx>.*?)(?:,|;|\s[\u2014\u2013-])\s*(?:and\s+)?(?:it's|it is|now it's|it's now|"
                      r"they're|they are)\s+(?:now\s+)?(?P<new>.+)$", re.I)
_NOT_OLD = re.compile(r",?\s+(?:and\s+)?not\s+(?P<old>[^,]+)$", re.I)


@dataclass(frozen=True)
class Change:
    context: str  # the words that name what changed ("checkout", "the quarterly audit")
    value: str  # the new value
    old_hint: str = ""  # the old value when named
    marked: bool = False  # an explicit marker ("actually", "correction", "not X")
    verb: bool = False  # said with a verb of change ("moved", "switched", "replaced")


def strip_change_marker(clause: str) -> tuple[str, bool]:
    s, marked = clause.strip().replace("\u2019", "'"), False
    while True:
        m = _CHANGE_MARK.match(s)
        if not m or m.end() == 0:
            return s, marked
        s, marked = s[m.end():].strip(), True


@memo
def parse_change(clause: str, marked: bool = False) -> Change | None:
    """A change of an earlier fact stated with a verb of change or a replacement, marked or not (``marked``: the
    message opened with a correction marker)."""
    s, own_mark = strip_change_marker(re.sub(r"^(?i:so|and|but)\s+(?=(?i:now|these days|nowadays|i|we)\b)", "", clause.strip()))
    marked = marked or own_mark
    if not s or is_question(s) or is_hypothetical(s):
        return None
    old = ""
    m = _NOT_OLD.search(s)
    if m and len(m.group("old").split()) <= 4:
        old, s = clean_value(m.group("old")), s[: m.start()]
    m = _TOOK_OVER.match(s)
    if m:  # "<new> took over <thing> from <old>": a new owner
        return Change(m.group("ctx"), clean_value(m.group("new")), clean_value(m.group("old") or "") or old, marked, True)
    m = _SWAP.match(s)
    if m:
        return Change(m.group("ctx"), trim_time(m.group("new")), clean_value(m.group("old")), marked, True)
    m = re.match(r"^(?P<ctx>(?i:i|we))(?:'ve| have)?\s+(?:just\s+)?(?i:started|joined|begun|began)\s+(?:(?i:at|with|in)\s+)?"
                 r"(?P<new>[A-Z].*)$", s)
    if m:  # "I've started at Northside this term": a new place of work or study
        return Change(m.group("ctx"), trim_time(m.group("new")), old, marked, True)
    m = _CHANGE.match(s)
    if m and not re.search(r"\b(?:to|in)\b\s*$", m.group("obj")):
        verb, obj, new = m.group("verb").lower(), m.group("obj").strip(), trim_time(m.group("new"))
        prep = m.group("prep").lower()
        later = re.match(r"^(?P<p>for|with|to)\s+(?P<n>.+)$", new, re.I)
        if prep in ("in", "into") and later:  # "traded the Skoda in for a Corolla": "in" was a particle
            obj, new, prep = f"{obj} {prep}", trim_time(later.group("n")), later.group("p").lower()
        if verb in ("replaced", "swapped", "traded", "exchanged") and obj and prep in ("with", "for"):
            return Change(m.group("ctx"), new, clean_value(obj) or old, marked, True)
        return Change(f"{m.group('ctx')} {obj}", new, old, marked, True)
    m = _ITS_NOW.match(s)
    if m and (marked or re.search(rf"\b(?:{_CHANGE_VERBS})\b", m.group("ctx"), re.I)):
        return Change(m.group("ctx"), trim_time(m.group("new")), old, marked, True)
    b = _BARE.match(s)
    if b and (marked or _CHANGE_ADVERB.search(s)) and not re.match(r"^(?i:it's|it is|that's|that is)\s+(?:a|an|the|my|our|"
                                                                    r"not|no|so|very|too|really)\b", s):
        return Change("", re.sub(r"^(?:at|on|in)\s+(?=[A-Z0-9])", "", trim_time(b.group("val"))), old, True)
    if marked or old or _CHANGE_ADVERB.search(s):  # a restatement: parse it, then bind it
        return Change(re.sub(r"^(?i:these days|nowadays|now|lately|recently|from now on|as of \w+|since \w+)[,\s]+", "",
                             s), "", old, marked or bool(old))
    return None
