"""Episode text: first person rewritten as a name, elliptic replies, question gists, named entities."""

from __future__ import annotations

import re

from soul_runtime.models.offline_rules.chat import is_question
from soul_runtime.models.offline_rules.cleaning import content_words, split_sentences, strip_fillers
from soul_runtime.models.offline_rules.words import STOPWORDS, memo

_PRESENT = frozenset("love like want need think feel hope know prefer enjoy work live plan try miss wish believe "
                     "hate run use paint play read write take make get keep find see mean own teach study volunteer look "
                     "guess agree remember lead manage say go do have don't haven't am".split())
_ADV = r"(?:really|also|just|still|totally|always|never|usually|often|actually|sometimes|definitely|even|only)"


def _third(verb: str) -> str:
    irregular = {"have": "has", "do": "does", "don't": "doesn't", "haven't": "hasn't", "am": "is", "go": "goes"}
    if verb in irregular or (verb.endswith("y") and verb[-2:-1] not in "aeiou"):
        return irregular.get(verb) or verb[:-1] + "ies"
    return verb + ("es" if verb.endswith(("s", "sh", "ch", "x")) else "s")


_I_CONTRACTED = re.compile(r"\b[Ii]'(?P<c>m|ve|d|ll)\b")
_I_VERB = re.compile(r"\b[Ii]\b(?!')(?P<adv>(?:\s+" + _ADV + r")*)(?P<verb>\s+[a-z']+)?")
_MYSELF = re.compile(r"\b[Mm]yself\b")
_MY = re.compile(r"\b[Mm](?:y|ine)\b")
_ME = re.compile(r"\bme\b(?!-)")


def to_third_person(text: str, name: str) -> str:
    """Rewrite first person as ``name``: I→Maya, I'm→Maya is, my→Maya's, me→Maya."""
    contractions = {"m": " is", "ve": " has", "d": " would", "ll": " will"}
    intro = r"\b(?:[Ii]'m|I am|[Mm]y name is|[Tt]his is)\s+" + re.escape(name) + r"\b"
    t = re.sub(intro + r",?\s+(?:and\s+)?(?:I'm\s+|I am\s+)?(?=an?\s)", lambda _: name + " is ",
               text.replace("\u2019", "'"))  # replacements are functions: a name is text, never a template
    t = re.sub(intro, lambda _: name + " introduced themself", t)

    def subj(m: re.Match[str]) -> str:
        verb = (m.group("verb") or "").strip()
        verb = " " + _third(verb.lower()) if verb.lower() in _PRESENT else m.group("verb") or ""
        return name + (m.group("adv") or "") + verb

    t = _I_CONTRACTED.sub(lambda m: name + contractions[m.group("c").lower()], t)
    t = _I_VERB.sub(subj, t)
    t = _MYSELF.sub("themself", t)
    t = _MY.sub(lambda _: name + "'s", t)
    return _ME.sub(lambda _: name, t)


def cap(summary: str, limit: int = 300) -> str:
    return summary if len(summary) <= limit else summary[:limit].rsplit(" ", 1)[0].rstrip(",;:") + "…"


@memo
def is_elliptic(text: str) -> bool:
    """A reply that leans on the question before it: "A sunrise, last year." / "Researching adoption agencies"."""
    s = strip_fillers((split_sentences(text) or [""])[0])
    if not s or not content_words(s):
        return False
    if len(strip_fillers(text).split()) <= 10 and not re.search(r"\b(?:I|I'm|I've|I'd|we|we're|it's|he|she|they|you)\b",
                                                                 s, re.I):
        return True
    return bool(re.match(r"^(?i:gonna|going to|planning|thinking about|hoping to|probably|definitely)\b|^[A-Z][a-z]+ing\b",
                         s)) and not re.search(r"^\S+(?:\s+\S+){0,4}\s+(?:is|are|was|were|has|sounds|looks)\b", s)


def question_gist(text: str, answerer: str) -> str:
    """The last question of a message, with "you" read as the one who answers it."""
    qs = [q for q in (strip_fillers(s) for s in split_sentences(text) if is_question(s)) if content_words(q)]
    return re.sub(r"\b[Yy]ou\b", lambda _: answerer, re.sub(r"\b[Yy]our\b", lambda _: answerer + "'s", qs[-1])) if qs else ""


@memo
def entities(text: str) -> list[str]:
    """Capitalised names and ids like incident-204; a sentence's first word only when it looks like a name."""
    found: list[str] = []
    sentences = [strip_fillers(x) for x in split_sentences(text)]
    rx = re.compile(r"(?<![\w'-])(?:[A-Z][\w+.-]*[\w+](?:\s+[A-Z][\w+-]*)*|[a-z]+-\d+)")
    mid = {m.group(0).split()[0] for s in sentences for m in rx.finditer(s) if m.start() > 0}
    for s in sentences:
        for m in rx.finditer(s):
            word = re.sub(r"^The\s+", "", m.group(0))
            common = m.start() == 0 and " " not in word and word not in mid and not s[m.end():].startswith("'s") \
                and not re.search(r"[A-Z0-9]", word[1:])  # a sentence's first word, probably not a name
            if not common and word.split()[0].lower() not in STOPWORDS and word.lower() not in map(str.lower, found):
                found.append(word)
    return found
