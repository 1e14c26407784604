"""Procedures described in ordinary words: a title and two or more steps."""

from __future__ import annotations

import re

from soul_runtime.models.offline_rules.chat import is_hypothetical, is_question
from soul_runtime.models.offline_rules.cleaning import _STOP_NORM, clean_value, split_sentences, strip_fillers
from soul_runtime.models.offline_rules.tasks import _clean_step, parse_steps
from soul_runtime.models.offline_rules.words import PRONOUNS, memo
from soul_runtime.text import fold as normalise

# "To reset the router I unplug it, wait a minute and plug it back in." / "Tuned the bike today:
# oiled the chain, trued the wheel, pumped the tyres. Worked fine." A description is a title (what the task
# is) and two or more steps; its class is the title's content words, stemmed and in a fixed order, so the
# same task named in other words ("tuned the bike" / "the bike tune") gets the same class.
_LIGHT = frozenset("do did does done doing make made makes making finish finished complete completed get got have had "
                   "another again once more one two three four five third second first last next same whole today "
                   "tonight yesterday morning afternoon evening week month year weekly daily monthly nightly time "
                   "round bit usual quick here how process routine procedure steps step way drill like goes go "
                   "went this that these those there out".split())
_COMPOUND = {"backup": "back", "setup": "set", "cleanup": "clean", "rollout": "roll", "signup": "sign", "login": "log",
             "checkup": "check", "shutdown": "shut", "startup": "start", "teardown": "tear", "walkthrough": "walk"}
_STEP_LEAD = re.compile(r"^(?:(?:and|then|first(?:ly)?|next|finally|lastly|after that|afterwards|once that's done|"
                        r"\d{1,2}[.)])[,\s]+|(?:i|we)\s+(?=[a-z]))+", re.I)
_NOT_VERB = frozenset("the a an my our your their his her its this that these those it i we you he she they there "
                      "some any all every each no not one two three".split())


def task_stem(word: str) -> str:
    """A crude stem shared by a verb and its nouns: approved / approval → approv; migration / migrate → migrat."""
    w = word.lower().strip("'-")
    w = _COMPOUND.get(w, w)
    for suf, rep in (("ations", "at"), ("ation", "at"), ("ments", ""), ("ment", ""), ("als", ""), ("al", ""),
                     ("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", ""), ("e", "")):
        if w.endswith(suf) and len(w) - len(suf) >= 3:
            w = w[: -len(suf)] + rep
            break
    return w[:-1] if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "ls" else w


_LIGHT_STEMS = frozenset(task_stem(w) for w in _LIGHT)
_COMPOUND_OF = {(stem, part): word for word, stem in _COMPOUND.items()
                for part in ("up", "out", "down", "in", "through") if word == stem + part}


def title_class(title: str) -> str:
    """The task class a title names: its content words in order, without light verbs, times and fillers."""
    words = normalise(title).split()
    words = [_COMPOUND_OF.get((task_stem(w), nxt), w) for w, nxt in zip(words, [*words[1:], ""][:len(words)],
                                                                             strict=True)]
    words = [w for w in words if w.isalpha() and len(w) > 1 and w not in _LIGHT
             and w not in _STOP_NORM and w not in PRONOUNS and task_stem(w) not in _LIGHT_STEMS]
    return " ".join(list(dict.fromkeys(words))[:5])


def similar_task(a: str, b: str) -> bool:
    """Two titled classes name the same task: one's stems contain the other's, or they share most of them."""
    x, y = {task_stem(w) for w in a.split()}, {task_stem(w) for w in b.split()}
    if not x or not y:
        return False
    common = len(x & y)
    return (common >= 1 and (x <= y or y <= x)) or common / len(x | y) >= 0.5


def _split_items(body: str) -> list[str]:
    parts = re.split(r",\s*(?:and\s+|then\s+|and then\s+)?|;\s*|\s+(?:and then|then)\s+", body)
    out: list[str] = []
    for p in parts:  # "printed the form and signed it": two steps when both halves start like a verb phrase
        halves = re.split(r"\s+and\s+(?=[a-z][a-z-]*\s+\S)", p)
        if len(halves) > 1 and all(_verbish(h) for h in halves):
            out += halves
        else:
            out.append(p)
    return out


def _verbish(item: str) -> bool:
    first = _STEP_LEAD.sub("", item.strip()).split()
    return bool(first) and bool(re.fullmatch(r"[a-z][a-z-]*", first[0])) and first[0] not in _NOT_VERB and len(first) >= 2


def _list_steps(body: str, speaker: str) -> tuple[str, ...]:
    """Steps of a run-on list ("unplug it, wait a minute and plug it back in"); () unless ≥ 2 look
    like verb phrases and none is a bare noun."""
    body = split_sentences(body)[0] if split_sentences(body) else body
    items = [i for i in (x.strip(" .") for x in _split_items(body.rstrip(". "))) if i]
    if len(items) < 2 or not all(_verbish(i) or _verbish(i[:1].lower() + i[1:]) for i in items):
        return ()
    steps = tuple(s for s in (_clean_step(_STEP_LEAD.sub("", i), speaker) for i in items) if s)
    return steps if len(steps) >= 2 else ()


_TITLE_SEP = re.compile(r"\s*(?::|\s[\u2014\u2013-]\s)\s*")
_LIST_ITEM = re.compile(r"^\s*(?:[-*\u2022]|\d{1,2}[.)])\s")
"""A text that opens with a list item ("- auth: pin httpx and re-run the tests", "1. billing: …"): its "name:" is
the item's subject in a list of several, not the title of one procedure told with its steps."""
_TITLE_LEAD = re.compile(r"^(?:(?:here's|here is|this is|that's) how (?:i|we)\s+|(?:i|we)\s*(?:need|have|want|am going|'m going|"
                         r"'re going|are going|plan|planned|got|'ve got|must|'ll|will|should)\s+(?:to\s+)?|time to\s+|gotta\s+|"
                         r"let's\s+|(?:my|our) (?:process|routine|procedure|"
                         r"way|checklist|steps?) (?:for|to|when)\s+|steps? (?:to|for)\s+|how (?:i|we|to)\s+)", re.I)
_TITLE_TAIL = re.compile(r"\s+(?:goes like this|works like this|is done like this|is like this|looks like this|"
                         r"process|routine|procedure|checklist|steps)$", re.I)


def _title(raw: str) -> str:
    t = clean_value(re.sub(r"^(?:ok(?:ay)?|so|well|alright)[,\s]+", "", raw.strip(), flags=re.I))
    t = _TITLE_TAIL.sub("", _TITLE_LEAD.sub("", t))
    return t


@memo
def parse_procedure(text: str, speaker: str = "") -> tuple[str, tuple[str, ...]] | None:
    """(title, steps) of a task described or reported with its steps; title '' when it only lists steps."""
    t = text.replace("\u2019", "'").strip()
    sentences = split_sentences(t)
    if not sentences or is_hypothetical(sentences[0]) or re.match(r"^(?i:hypothetically|in theory|i guess|"
                                                                  r"i suppose)\b", sentences[0]):
        return None
    first = strip_fillers(sentences[0])
    # "To X, I a, b and c." / "When X, we a, b, c." / "For X I a, b, c." / "I X by a-ing, b-ing and c-ing."
    m = re.match(r"^(?P<lead>to|when|whenever|for|before|after)\s+(?P<title>.+?),?\s+(?:i|we)\s+(?P<body>(?!\w+\s+(?:it|"
                 r"that|this)\s*$).+)$", first, re.I)
    if m and not re.match(r"^(?:a|an)\s+\w+$", m.group("title")):
        steps = _list_steps(m.group("body"), speaker)
        if steps:
            return _title(m.group("title")), steps
    m = re.match(r"^(?:i|we)\s+(?P<title>.+?)\s+by\s+(?P<body>\w+ing\b.+)$", first, re.I)
    if m:
        steps = _list_steps(m.group("body"), speaker)
        if steps:
            return _title(m.group("title")), steps
    # "TITLE: a, b, c" / "TITLE - a, b, c" / numbered / first … then …
    m = _TITLE_SEP.search(t)
    if m and len(t[: m.start()].split()) <= 12 and "\n" not in t[: m.start()] and not _LIST_ITEM.match(t):
        head, body = t[: m.start()], t[m.end():]
        head = strip_fillers(split_sentences(head)[-1]) if split_sentences(head) else head
        steps = parse_steps(body, speaker) or _list_steps(re.sub(r"^(?:i|we)\s+", "", body, flags=re.I), speaker)
        if steps and not is_question(head):
            steps = tuple(_cut(_STEP_LEAD.sub("", s)) for s in steps)
            return _title(re.sub(r"^(?i:done|finished|all done)\W*$", "", head)), steps
    # "TITLE. (First) I a, (then) b, (and) c."
    for i, sentence in enumerate(sentences[1:3], start=1):
        body = strip_fillers(sentence)
        steps = parse_steps(body, speaker) or _list_steps(re.sub(r"^(?:i|we)\s+", "", body, flags=re.I), speaker)
        if steps:
            head = strip_fillers(sentences[i - 1])
            return ("" if re.fullmatch(r"(?i:done|finished|all done|completed|ok|okay)?\W*", head) or is_question(head)
                    else _title(head)), tuple(_cut(_STEP_LEAD.sub("", s)) for s in steps)
    # a list with no title at all: "Done! I printed the form, signed it and posted it."
    body = re.sub(r"^(?i:done|finished|all done|completed)\W+(?:(?:i|we)\s+)?", "", first)
    if body != first:
        steps = _list_steps(body, speaker)
        if steps:
            return "", steps
    return None


def _cut(step: str) -> str:
    """A step without a following sentence ("posted it. Everything went through" → the first part)."""
    return clean_value(re.split(r"(?<=[a-z0-9])\.\s+(?=[A-Z])", step)[0])
