"""Episode text by rule: what a message said, as a compact, dated, third-person factual unit.

A later question needs who, what, names, numbers, places, objects and when. So the unit keeps
every sentence that carries content (fillers, greetings, compliments and questions out), not just
the first one; relative dates become absolute ones (reckoned from when the message was said); a
photo the speaker shared is kept as what it shows; an answer that leans on the question before
it is stored with that question.
"""

from __future__ import annotations

import re

from soul_runtime.models import offline_rules as rules
from soul_runtime.timeref import resolve_relative

LIMIT = 400
"""Characters of the content sentences an episode keeps of a message (the least informative dropped first beyond
it); a message of a few sentences is kept whole, and the packing shows a longer episode by its excerpt."""
_PHOTO = re.compile(r"\s*\[shares a photo: (?P<cap>[^\]]*)\]")
_CAPTION_LEAD = re.compile(r"^(?:a |an )?(?:photo|photograph|picture|image|photography|close up|closeup)s?\s+"
                           r"(?:of\s+)?", re.I)


def adds_to(line: str, text: str) -> bool:
    """Does ``text`` say something ``line`` does not: a content word or a number missing from it?"""
    def said(t: str) -> set[str]:
        return set(rules.content_words(t)) | set(re.findall(r"\d+", t))
    return not said(text) <= said(line)


def split_photo(text: str) -> tuple[str, str]:
    """(the words, the caption of a shared photo or '')."""
    m = _PHOTO.search(text)
    return (_PHOTO.sub("", text).strip(), m.group("cap").strip()) if m else (text, "")


_SELF = re.compile(r"\b(?:I|I'm|I've|I'd|I'll|my|me|we|we're|we've|our|us)\b", re.I)
_SPECIFIC = re.compile(r"(?<=[\w,]\s)(?!I\b|I')[A-Z][\w'-]+|\d|\b(?i:yesterday|ago|last|next|tomorrow|tonight|"
                       r"weekend|monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b")


def _informative(sentence: str) -> int:
    """How much a sentence tells about someone: content words count (opinions do not), names, numbers
    and dates count double; a sentence about no one in particular with nothing specific counts 0."""
    words = [w for w in rules.content_words(sentence) if w not in rules.OPINION]
    specific = len(_SPECIFIC.findall(sentence))
    if specific == 0 and not _SELF.search(sentence) and len(words) < 4:
        return 0
    return len(words) + 2 * specific


_NO_SUBJECT = frozenset("lost got went had made found took saw met started finished just gonna wanna gotta been "
                        "heading planning thinking hoping trying working finishing".split())


def subjectless(s: str, name: str) -> str:
    """ "Lost my job yesterday." → "Maya lost my job yesterday." (the speaker is the implied subject)."""
    first = s.split()[0].lower()
    if first not in _NO_SUBJECT or (first.endswith("ing") and re.search(r"\s(?:is|are|was|were|has|have)\s", s)):
        return s
    return f"{name} {'is ' if first.endswith('ing') else ''}{first}{s[len(first):]}"


def _you(text: str, addressee: str) -> str:
    """ "you"/"your" read as the person spoken to."""
    if not addressee:
        return text
    t = re.sub(r"\b[Yy]ou're\b", lambda _: f"{addressee} is", text)
    t = re.sub(r"\b[Yy]ou've\b", lambda _: f"{addressee} has", t)
    t = re.sub(r"\b[Yy]ou'd\b", lambda _: f"{addressee} would", t)
    t = re.sub(r"\b[Yy]ou'll\b", lambda _: f"{addressee} will", t)
    t = re.sub(r"\b[Yy]ourself\b", "themself", t)
    t = re.sub(r"\b[Yy]ours\b", lambda _: f"{addressee}'s", t)
    t = re.sub(r"\b[Yy]our\b", lambda _: f"{addressee}'s", t)
    return re.sub(r"\b[Yy]ou\b", lambda _: addressee, t)  # a name is text, never a template


def _cut(sentence: str, limit: int) -> str:
    if len(sentence) <= limit:
        return sentence
    return sentence[:limit].rsplit(" ", 1)[0].rstrip(" ,;:-\u2014") + "\u2026"


def facts_of(text: str, name: str, addressee: str = "", limit: int = LIMIT) -> str:
    """The content sentences of ``text`` in the third person, in their order, within ``limit`` characters
    (the least informative dropped first)."""
    kept: list[tuple[int, int, str]] = []
    for i, sentence in enumerate(rules.split_sentences(text)):
        s = rules.strip_fillers(re.sub(r"^(?i:actually|correction)[,:]?\s+", "", rules.strip_fillers(sentence)))
        if not s or rules.is_question(s) or rules.is_chit_sentence(s):
            continue
        score = _informative(s)
        if score >= 2:
            kept.append((score, i, s))
    if not kept:
        return ""
    chosen: list[tuple[int, int, str]] = []
    used = 0
    for score, i, s in sorted(kept, key=lambda k: (-k[0], k[1])):
        if used + len(s) + 1 > limit and chosen:
            continue
        chosen.append((score, i, _cut(s, limit)))
        used += len(chosen[-1][2]) + 1
    out = []
    for _, _, s in sorted(chosen, key=lambda k: k[1]):
        s = rules.to_third_person(subjectless(s if s[-1:] in ".!?\u2026" else s + ".", name), name)
        out.append(_you(s, addressee))
    return " ".join(out)


@rules.memo
def episode_text(text: str, name: str, *, at: float | None = None, addressee: str = "", question: str = "",
                 limit: int = LIMIT) -> str:
    """The factual unit of one message: its content sentences (or, for an elliptic reply, the answer
    with the question it answers), the photo it shared, dates made absolute."""
    words, caption = split_photo(text)
    if question and rules.is_elliptic(words):
        answer = rules.clean_value(rules.strip_fillers(words))
        first = answer.split()[0] if answer else ""
        if first != "I" and (len(first) == 1 or first.lower() in rules.STOPWORDS or first.endswith("ing")):
            answer = answer[:1].lower() + answer[1:]
        answer = _you(rules.to_third_person(answer, name), addressee)
        body = f'Asked "{question}", {name} said: {_cut(answer, limit)}.'
    else:
        body = facts_of(words, name, addressee, limit)
    cap = " ".join(_CAPTION_LEAD.sub("", caption).strip().rstrip(".").split()[:12])
    if cap and len(rules.content_words(cap)) >= 2:
        body = (body + " " if body else "") + f"{name} shared a photo of {cap}."
    if body and at is not None:
        body = resolve_relative(body, at)
    return body
