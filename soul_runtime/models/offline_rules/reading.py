"""Clause-level reading: a message's opening markers, its pronouns, and predicates with typed values.

* Openings: interjections ("hmm", "wait", "oh"), negations ("no", "nope", "not quite", "that's wrong") and
  labels ("Fix:", "Update —", "Quick note:") are peeled off the front of a message; a negation or a label
  that names a change marks what follows as a correction, any other label or lead-in is only dropped.
* Pronouns: "it" at the head of a clause is the thing the message (or the conversation) was last about;
  "he" / "she" the person last named.
* Predicates: counts with units ("has 12 shards"), transitive predicates ("requires Rust 1.80", "targets
  ARM64"), versions ("is version 2.7") and who owns a thing ("owned by", "belongs to", "X owns Y") read
  as (entity, attribute, value), the attribute named from the predicate, never from the value.
"""

from __future__ import annotations

import re

from soul_runtime.models.offline_rules.cleaning import clean_value, split_sentences
from soul_runtime.models.offline_rules.relations import trim_time
from soul_runtime.models.offline_rules.values import Statement, _bad_entity, _value
from soul_runtime.models.offline_rules.words import STOPWORDS, memo

_SEP = r"(?:\s*[,.!:;\u2014\u2013]+\s*|\s+-+\s+|\s+)"
_INTERJECTION = re.compile(r"^(?i:hmm+|hm+|wait|oh|ah+|ugh|erm+|um+|uh+|eh|mm+|oops|sorry|hold on|well|okay|ok|so|"
                           r"and|also|oh well|right|argh|huh)(?=\W)" + _SEP)
_NEGATION = re.compile(r"^(?i:no(?:[\s,]+no)*|nope|nah|not quite|not really|not exactly|not so|wrong|incorrect|"
                       r"that's (?:not (?:right|correct|it|true|quite right)|wrong|incorrect|off)|"
                       r"that is (?:not (?:right|correct)|wrong|incorrect)|that was wrong|my bad|my mistake|"
                       r"i was wrong|i misspoke|scratch that|i got (?:that|it) wrong)"
                       r"(?:\s*[,.!:;\u2014\u2013]+\s*|\s+-+\s+|$)(?!\s*(?i:but|and|thanks|worries|problem)\b)")
_LABEL = re.compile(r"^(?P<label>[A-Za-z][\w'/-]*(?:\s+[\w'/-]+){0,7}?)\s*(?::|\s[\u2014\u2013]|\s-+)\s+(?=\S)")
_CLAUSE = re.compile(r"\b(?:is|are|was|were|has|have|had|'s|'re|uses?|runs?|lives?|works?|hosts?|requires?|targets?|"
                     r"belongs?|owns?|costs?|[a-z]{3,}(?:ed|es))\b", re.I)
_COPULA = re.compile(r"\b(?i:is|are|was|were|'s|'re|am|has|have|i|we|my|our|steps?|confirm\w*)\b|\d")
_CHANGE_LABEL = re.compile(r"\b(?i:fix\w*|correct\w*|chang\w*|updat\w*|edit\w*|amend\w*|revis\w*|errat\w*|"
                           r"new info\w*|news|wrong|mistake|typo|rectif\w*|adjust\w*)\b")
_NOT_LABEL = re.compile(r"\b(?i:is|are|was|were|am|has|have|had|'s|'re|'m|i|we|you|it|they|my|our|the|his|her|their|"
                        r"your|step|steps|confirm\w*)\b|\d")


@memo
def read_opening(text: str) -> tuple[str, str]:
    """(the text without its opening markers, the kind of correction they mark): "fix" for a label naming a
    change (a label such as "Fix:"), "no" for a negation or interjection (such as "nope"), ""."""
    s, marked = text.strip().replace("\u2019", "'"), ""
    for _ in range(6):
        m = _NEGATION.match(s)
        if m:
            s, marked = s[m.end():].strip(), marked or "no"
            continue
        m = _INTERJECTION.match(s)
        if m and m.end() < len(s):
            s = s[m.end():].strip()
            continue
        m = _LABEL.match(s)
        short = m and not _NOT_LABEL.search(m.group("label")) and len(m.group("label").split()) <= 6
        if m and (short or (not _COPULA.search(m.group("label")) and _CLAUSE.search(s[m.end():])
                            and not re.match(r"^(?i:my|our|the)\b", m.group("label")))):
            marked = "fix" if _CHANGE_LABEL.search(m.group("label")) else marked
            s = s[m.end():].strip()
            continue
        break
    return (s[:1].upper() + s[1:] if s else s), marked


_NAME = re.compile(r"(?<![\w'-])(?:(?:Dr|Mr|Mrs|Ms)\.\s+)?[A-Z][a-z\u00e0-\u00ff]+(?:\s+[A-Z][a-z\u00e0-\u00ff]+)?(?![\w'-])")
_LEAD_VERB = frozenset("meet met talked talk spoke speak ask asked say tell told ping pinged call called hired hire welcome "
                       "thanks thank congrats with and".split())


_LEAD_OR_STOP = _LEAD_VERB | STOPWORDS
_IS_VERB = re.compile(r"\s+(?:is|was|has|works|lives|uses|runs)\b")
_PLACE_BEFORE = re.compile(r"\b(?:in|at|from|near|into)\s+$", re.I)


@memo  # each turn reads the recent history's messages again
def last_person(text: str) -> str:
    """The person last named in ``text`` ("… our new analyst, Ilse Varga." → "Ilse Varga"), else ''."""
    found = ""
    for sentence in split_sentences(text):
        for m in _NAME.finditer(sentence):
            name = m.group(0)
            words = name.split()
            if m.start() == 0 and words[0].lower() in _LEAD_OR_STOP:
                words = words[1:]
            if m.start() == 0 and len(words) == 1 and not (sentence.startswith(words[0])
                                                           and _IS_VERB.match(sentence, len(words[0]))):
                continue  # a sentence's first word alone, probably not a name
            place = _PLACE_BEFORE.search(sentence, 0, m.start())
            if words and words[0].lower() not in STOPWORDS and not place:
                found = " ".join(words)
    return found


_SUBJECT = re.compile(r"^(?P<n>[A-Z][\w.+-]*(?:\s+[A-Z][\w.+-]*){0,2})\s+(?:is|are|was|runs|uses|has|lives|works)\b")


@memo
def last_thing(text: str) -> str:
    """What ``text`` was last about: the subject of its last sentence when that is a name ("Vireo is our
    ticketing app"), else the last name in it ("Meet Orbit, our new deploy bot" → "Orbit"), else '' (also
    when the sentence is itself about "it": the thing stays what it was)."""
    sentences = split_sentences(text)
    if not sentences or re.match(r"^(?i:it|it's|its|they|they're|he|she|he's|she's)\b", sentences[-1]):
        return ""
    last = sentences[-1]
    m = _SUBJECT.match(last)
    if m and m.group("n").split()[0].lower() not in STOPWORDS:
        return m.group("n")
    names = []
    for n in re.finditer(r"(?<![\w'-])[A-Z][\w+-]*(?:\.[\w+-]+)*(?:\s+[A-Z][\w+-]*(?:\.[\w+-]+)*){0,2}", last):
        words = n.group(0).split()
        if n.start() == 0:
            words = words[1:]  # a sentence's first word: a name only as a subject (above)
        if words and words[0].lower() not in STOPWORDS:
            names.append(" ".join(words))
    return names[-1] if names else ""


_IT = re.compile(r"^(?i:it)(?P<be>'s|\s+is)?\s+(?=\S)")
_HE = re.compile(r"^(?i:he|she)(?P<be>'s|\s+is)?\s+(?=\S)")


_PREDICATE = re.compile(r"^(?:(?:now|still|also)\s+)?(?:(?:[a-z]+(?:ed|en|wn)|built|kept|held|sent|set|put|made|run|done)\s+"
                        r"(?:in|on|at|by|with|to|from|for|against|under|into|onto|using|via)\b|(?:on|in|at|from)\s+[A-Z0-9])")
_VERB = re.compile(r"^(?!(?:looks|sounds|seems|feels|means|makes|gets|takes|depends|matters|helps|happens|goes|works out|"
                   r"was|is|has been|had)\b)[a-z]+s\s+\S")
"""A present-tense verb of a thing ("it runs on …", "it weighs …"), not one of judgement ("it sounds fun")."""


def resolve_pronouns(clause: str, thing: str, person: str) -> str:
    """``clause`` with a leading "it" read as ``thing`` and "he" / "she" as ``person`` (when known)."""
    c = clause.strip().replace("\u2019", "'")
    for rx, name in ((_IT, thing), (_HE, person)):
        m = rx.match(c)
        rest = c[m.end():] if m else ""
        if m and m.group("be") and not _PREDICATE.match(rest):
            continue  # "it's <value>": a bare value, resolved against the facts it may correct
        if m and not m.group("be") and not _VERB.match(rest):
            continue  # "it can be rewarding", "it sounds fun": no fact of a thing
        if m and name and not re.match(r"^(?:was|has been|had|isn't|is not|wasn't|not|no longer|never)\b", rest):
            return f"{name}{' is' if m.group('be') else ''} {rest}"
    return c


_THIRD = re.compile(r"^(?i:he|she)(?P<be>'s|\s+is)?\s+(?P<rest>\S.*)$")
_BASE = {"has": "have", "does": "do", "goes": "go"}


def as_first_person(clause: str) -> str:
    """"He's based in <place>" → "I'm based in <place>", "she works on …" → "I work on …"; '' for other clauses."""
    m = _THIRD.match(clause.strip().replace("\u2019", "'"))
    if not m or re.match(r"^(?:was|has been|had|isn't|is not|wasn't|not|no longer|never)\b", m.group("rest")):
        return ""
    if m.group("be"):
        return "I'm " + m.group("rest")
    verb, _, tail = m.group("rest").partition(" ")
    base = _BASE.get(verb.lower()) or (verb[:-3] + "y" if verb.endswith("ies") else verb[:-2] if verb.endswith(
        ("ches", "shes", "sses", "xes")) else verb[:-1] if verb.endswith("s") and not verb.endswith("ss") else "")
    return f"I {base} {tail}".strip() if base else ""


# ---- predicates with typed values -------------------------------------------------
_NP = r"(?:(?:[Tt]he|[Oo]ur|[Mm]y|[Tt]heir|[Yy]our)\s+)?(?P<np>[\w.+-]+(?:\s+[\w.+-]+){0,3}?)"
_NUM = r"\d[\d,.]*"
_COUNT = re.compile(rf"^{_NP}\s+(?:now\s+)?(?:has|have|holds|employs|runs|keeps|counts)\s+(?:now\s+)?(?:about\s+|around\s+)?"
                    rf"(?P<n>{_NUM})\s+(?P<unit>[A-Za-z][\w-]*(?:\s+(?:of\s+)?[a-z][a-z-]*)?)$")
_MEASURE = re.compile(rf"^{_NP}\s+(?P<verb>costs?|weighs?|takes?|lasts?)\s+(?P<val>(?:about\s+)?{_NUM}.*)$")
_TRANSITIVE = re.compile(rf"^{_NP}\s+(?:now\s+)?(?P<verb>requires|needs|targets|supports|depends on|relies on)\s+"
                         r"(?P<val>[A-Z0-9].*)$")
_DUE = re.compile(rf"^{_NP}\s+(?:is|are)\s+(?:now\s+)?due\s+(?:on|by|in)\s+(?P<val>.+)$")
_VERSION = re.compile(rf"^{_NP}\s+(?:is|are)\s+(?:now\s+)?(?:at\s+|on\s+)?(?P<val>(?:version|v)\s*\d[\w.]*)$", re.I)
_OWNED = re.compile(rf"^{_NP}\s+(?:is|are)\s+(?:now\s+)?(?:owned|maintained|managed|run|led|handled|administered|"
                    r"administrated|looked after|written|registered|owned and run)\s+(?:by|to)\s+(?P<val>.+)$")
_BELONGS = re.compile(rf"^{_NP}\s+(?:now\s+)?belongs?\s+to\s+(?P<val>.+)$")
_OWNS = re.compile(r"^(?P<val>[A-Z][\w.-]*(?:\s+[A-Z][\w.-]*){0,2})\s+(?:now\s+)?(?:owns|maintains|manages|runs|leads|"
                   r"handles|administers|writes|is responsible for|looks after)\s+(?:the|our|my)\s+"
                   r"(?P<np>[\w.+-]+(?:\s+[\w.+-]+){0,3})$")
_UNIT_ALIAS = {"people": "people", "person": "people", "folk": "people", "staff": "people"}
OWNER = "owner"


def _unit(unit: str) -> str:
    words = unit.lower().split()
    return _UNIT_ALIAS.get(words[-1], words[-1])


def _owner_value(raw: str) -> str:
    return _value(re.sub(r"\s+(?:now|these days|from now on|going forward)$", "", clean_value(raw)))


def parse_predicate(s: str, subject: str) -> list[Statement]:
    """A count, a measure, a transitive predicate, a version or an owner stated of a thing, else []."""
    s = clean_value(re.sub(r"\s+(?:now|these days|nowadays|from now on|going forward|since \w+)$", "", clean_value(s)))
    m = _OWNS.match(s)
    if m and not _bad_entity(m.group("val"), True) and _owner_value(m.group("val")):
        return [Statement(m.group("np"), OWNER, _owner_value(m.group("val")))]
    for rx in (_OWNED, _BELONGS):
        m = rx.match(s)
        if m and _owner_value(m.group("val")):
            return [Statement(m.group("np"), OWNER, _owner_value(m.group("val")))]
    m = _COUNT.match(s)
    if m:
        np = m.group("np")
        ent = subject if np.lower() in ("i", "we") and subject else np
        if ent.lower() not in ("i", "we", "it", "they", "he", "she"):
            return [Statement(ent, _unit(m.group("unit")), f"{m.group('n')} {m.group('unit')}")]
    m = _MEASURE.match(s)
    if m and m.group("np").lower() not in ("i", "we", "it", "they", "he", "she"):
        verb = m.group("verb").lower().rstrip("s")
        att = {"cost": "price", "weigh": "weight", "take": "duration", "last": "duration"}[verb]
        return [Statement(m.group("np"), att, clean_value(m.group("val")))]
    m = _TRANSITIVE.match(s)
    if m and m.group("np").lower() not in ("i", "we", "it", "they", "he", "she") and _value(trim_time(m.group("val"))):
        return [Statement(m.group("np"), m.group("verb").lower(), _value(trim_time(m.group("val"))))]
    m = _DUE.match(s)
    if m and m.group("np").lower() not in ("it", "they", "he", "she") and _value(m.group("val")):
        return [Statement(m.group("np"), "due date", _value(trim_time(m.group("val"))))]
    m = _VERSION.match(s)
    if m and m.group("np").lower() not in ("it", "they", "he", "she"):
        return [Statement(m.group("np"), "version", re.sub(r"^(?i:v)\s*(?=\d)", "version ", m.group("val")))]
    return []
