"""Consolidated memory: digests of a session and of a span of sessions, written from their episodes (pure).

A question that gathers what was said across a history ("how did the deployment plan change?", "summarize the
project so far", "in what order did I …") is answered by no single stored episode. A digest holds, in order and
in a bounded number of characters, what a session was about, its decisions and its figures (a **session
digest**), or one line per session of a span (a **span digest**: a timeline, how a choice changed). Each
digest keeps its provenance: the episodes it was written from (refreshed when those change, erased with them)
and the sources of the sentences it quotes.

The offline writer (:func:`session_digest`, :func:`span_digest`) is extractive: it quotes sentences of the
episodes, chosen for the session's salient words, decisions and figures, in the order they were said. A model
writes a digest in its own words through the same interface (:class:`DigestWriter`): it is handed the same
episodes and returns the text; provenance is the runtime's, never the model's.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from soul_runtime.records import Digest
from soul_runtime.text import segments, terms
from soul_runtime.timeref import day_text


@lru_cache(maxsize=1 << 14)
def text_terms(text: str) -> frozenset[str]:
    """The distinct lexical terms of ``text`` (remembered: a consolidation reads each episode's several times)."""
    return frozenset(terms(text))


FIGURE = re.compile(r"\d")
"""A sentence that states a figure (a count, a version, a date) weighs more in a digest."""

DIGEST_CHARS = 400
"""A digest's text is at most this long: it is shown whole, as one memory line of ~100 tokens."""
SESSION_SENTENCES = 8
"""Sentences a session digest quotes at most (fewer when they fill DIGEST_CHARS)."""
SPAN_SESSIONS = 8
"""Sessions one span digest covers: the history is digested in spans of this many sessions."""
TOPIC_WORDS = 5
"""Words naming what a session was about, in its digest's head."""
SPANNING = re.compile(r"\b(?:list|steps|(?:what|which) order|order in which|chronolog\w*|sequence|summar\w*|overview|what (?:are|were)|all (?:the )?|progress|"
                      r"chang\w*|timeline|over time|across|throughout|so far|history|evolv\w*|sessions?)\b", re.I)
"""A question that gathers what was said over time (a list, an order, a summary, a change): digests answer it."""
_DECISION = re.compile(r"\b(?:decid\w*|chose|chosen|choose|switch\w*|go(?:ing)? with|settled on|will use|plan(?:ned)? "
                       r"to|agreed|moved to|replac\w*|instead of|changed?|final(?:ly|ized)?|picked|opted)\b", re.I)


@dataclass(frozen=True)
class Said:
    """One episode as a digest reads it."""

    episode: str
    at: float
    text: str
    sources: tuple[str, ...]


def fingerprint(said: Sequence[Said], common: Iterable[str] = ()) -> str:
    """What a digest was written from: its episodes' ids and texts (a changed or erased episode changes it) and the
    words said in most sessions, which its head leaves out (``common``: a new session that changes them changes
    every session's digest, so a digest never depends on when it was written)."""
    h = hashlib.blake2b(digest_size=12)
    for s in said:
        h.update(s.episode.encode() + b"\0" + s.text.encode() + b"\1")
    for w in sorted(common):
        h.update(b"\2" + w.encode())
    return h.hexdigest()


def topic(said: Sequence[Said], n: int = TOPIC_WORDS, common: frozenset[str] = frozenset()) -> list[str]:
    """The ``n`` content words said most often across ``said`` (in at least two episodes when there are
    several), leaving out ``common`` (words said in most sessions name none of them); earliest first among
    equals."""
    counts: Counter[str] = Counter()
    for s in said:  # each text's words in the order said: among equals the earliest comes first, in every process
        counts.update(w for w in dict.fromkeys(terms(s.text)) if w not in common)
    floor = 2 if len(said) > 2 else 1
    return [w for w, c in counts.most_common() if c >= floor and len(w) > 2][:n]


_CODE = re.compile(r"[={}<>\[\]|`;$\\]|\w\(|^\s*(?:#|import |from |def |class |const |[-*]\s*\*\*)")
PROSE_LETTERS = 0.8
"""A sentence a digest quotes is prose: this share of its characters letters or spaces, no code marks."""


def prose(sentence: str) -> bool:
    """Whether ``sentence`` reads as prose (code, logs, tables and headings are not digested: their details are
    what the stored units are for)."""
    if len(sentence) < 30 or _CODE.search(sentence):
        return False
    return sum(c.isalpha() or c == " " for c in sentence) >= PROSE_LETTERS * len(sentence)


def _salience(words: frozenset[str], sentence: str, weight: dict[str, float]) -> float:
    if len(words) < 3 or not prose(sentence):
        return 0.0
    score = sum(weight.get(w, 0.0) for w in sorted(words)) / math.sqrt(len(words))  # sorted: the same sum anywhere
    return score * (1.5 if _DECISION.search(sentence) else 1.0) * (1.3 if FIGURE.search(sentence) else 1.0)


def _clip(sentence: str, limit: int) -> str:
    return sentence if len(sentence) <= limit else sentence[:limit].rsplit(" ", 1)[0].rstrip(" ,;:-") + "\u2026"


SENTENCE_CHARS = 120
"""A quoted sentence is cut to this many characters: a digest quotes several things said, not one long one."""


def session_digest(session: str, said: Sequence[Said], common: frozenset[str] = frozenset(),
                   limit: int = DIGEST_CHARS) -> Digest | None:
    """A session's digest, written extractively: ``About <topic words>:`` then its most salient
    sentences (the session's own frequent words, decisions and figures weigh most; ``common``, words said in
    most sessions, weigh nothing) in the order they were said, within ``limit`` characters. None for a session
    with nothing to digest."""
    said = sorted(said, key=lambda s: s.at)
    if not said:
        return None
    counts: Counter[str] = Counter()
    for s in said:
        counts.update(text_terms(s.text))
    weight = {w: math.log(1 + c) for w, c in counts.items() if w not in common}
    head = f"About {', '.join(topic(said, common=common)) or 'this'}:"
    sentences = []
    for i, s in enumerate(said):
        for j, seg in enumerate(segments(s.text)):
            words = frozenset(terms(seg))
            sentences.append((_salience(words, seg, weight), i, j, seg, words, s))
    ranked = sorted((x for x in sentences if x[0] > 0), key=lambda x: (-x[0], x[1], x[2]))
    room = limit - len(head)
    chosen: list[tuple[int, int, str, Said]] = []
    seen: list[frozenset[str]] = []
    for _, i, j, seg, words, s in ranked[:8 * SESSION_SENTENCES]:
        if len(chosen) >= SESSION_SENTENCES or room < 40:
            break
        if any(len(words & w) >= 0.6 * len(words) for w in seen):  # says again what a chosen sentence says
            continue
        piece = _clip(seg, min(SENTENCE_CHARS, room - 1))
        chosen.append((i, j, piece, s))
        seen.append(words)
        room -= len(piece) + 1
    chosen.sort(key=lambda x: (x[0], x[1]))
    text = " ".join([head] + [c[2] for c in chosen])[:limit]
    return Digest("session", (session,), text, tuple(s.episode for s in said),
                  tuple(dict.fromkeys(src for c in chosen for src in c[3].sources)), said[0].at, said[-1].at,
                  fingerprint(said))


def span_digest(digests: Sequence[Digest], limit: int = DIGEST_CHARS) -> Digest | None:
    """A timeline over consecutive session digests: one entry per session, ``<day>: <topic words>; <its first
    decision or figure>``, in order, within ``limit`` characters (each session gets an equal share). None for
    fewer than two sessions."""
    ds = sorted((d for d in digests if d.kind == "session"), key=lambda d: d.first_at)
    if len(ds) < 2:
        return None
    share = max(60, limit // len(ds))
    parts = []
    for d in ds:
        head, _, body = d.text.partition(":")
        about = head.removeprefix("About ")
        said = next((seg for seg in segments(body) if _DECISION.search(seg) or FIGURE.search(seg)), "")
        entry = f"{day_text(d.first_at)}: {about}" + (f"; {said}" if said else "")
        parts.append(_clip(entry, share - 3))
    text = " | ".join(parts)[:limit]
    return Digest("span", tuple(s for d in ds for s in d.sessions), text,
                  tuple(e for d in ds for e in d.episodes), tuple(dict.fromkeys(s for d in ds for s in d.sources)),
                  ds[0].first_at, ds[-1].last_at,
                  hashlib.blake2b("".join(d.fingerprint for d in ds).encode(), digest_size=12).hexdigest())


DigestWriter = Callable[[str, Sequence[Said], frozenset[str]], "Digest | None"]
"""Writes a session's digest from its episodes and the words said in most sessions: :func:`session_digest`
offline; a model's writer returns its own text in a Digest built by :func:`worded` (the runtime's provenance,
the model's words)."""

COMMON_SHARE = 0.5
"""A word said in more than this share of the sessions (of three or more) names none of them."""


def common_words(sessions: Iterable[Sequence[Said]]) -> frozenset[str]:
    """The words said in more than COMMON_SHARE of ``sessions`` (none when there are fewer than three)."""
    df: Counter[str] = Counter()
    n = 0
    for said in sessions:
        n += 1
        df.update(frozenset().union(*(text_terms(s.text) for s in said)) if said else frozenset())
    return frozenset(w for w, c in df.items() if c > COMMON_SHARE * n) if n >= 3 else frozenset()


def worded(session: str, said: Sequence[Said], text: str, limit: int = DIGEST_CHARS) -> Digest | None:
    """A digest of ``said`` in a model's own words ``text`` (cut to ``limit``), with the runtime's provenance:
    every episode it was written from, and their sources."""
    said = sorted(said, key=lambda s: s.at)
    if not said or not text.strip():
        return None
    return Digest("session", (session,), _clip(" ".join(text.split()), limit), tuple(s.episode for s in said),
                  tuple(dict.fromkeys(src for s in said for src in s.sources)), said[0].at, said[-1].at,
                  fingerprint(said))
