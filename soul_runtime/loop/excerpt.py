"""Query-focused excerpts of long memories (pure).

A memory line that is not shown in full is shown by the part of it that answers the question: the line (or
sentence) holding most of the question's words, cut to a window around them, plus a second piece when it holds
question words the first lacks (a code block's ``from notifier_client import …`` line and its
``max_connections=209`` line) or names the subject again beside a figure (a table's heading and its row). Each distinct question word found counts one, plus a little for how rare it is
among the recalled memories themselves (a word every candidate holds tells them apart less than one few hold),
so that more of the question's words beat one rare word. A memory that holds none of the question's words is
shown by its first sentence.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import lru_cache

from soul_runtime.text import segments, terms

PIECES = 2
"""At most this many pieces per excerpt, joined by " … "."""


_WORD = re.compile(r"\w+(?:[-'.]\w+)*")
FIGURE = re.compile(r"(?<![\w.])\d+(?:[.,:]\d+)*(?![\w])")
"""A figure on its own: ``402`` in ``402 ms``, ``209`` in ``max_connections=209``, a version, a date; not the
``95`` of ``p95``."""


RARITY = 0.25
"""How much rarity among the recalled memories adds to a found word's weight of 1."""


def query_weights(query: str, texts: Sequence[str]) -> dict[str, float]:
    """Each lexical term of ``query`` weighted 1 plus RARITY times how few of ``texts`` hold it (a smoothed
    inverse document frequency over the recalled memories, ``log((n + 1) / (df + 0.5))``)."""
    wanted = set(terms(query))
    if not wanted:
        return {}
    df = dict.fromkeys(wanted, 0)
    for text in texts:
        for t in wanted & text_terms(text):
            df[t] += 1
    n = len(texts)
    return {t: 1.0 + RARITY * max(0.0, math.log((n + 1) / (d + 0.5))) for t, d in df.items()}


@lru_cache(maxsize=1024)
def text_terms(text: str) -> frozenset[str]:
    """The distinct :func:`terms` of a memory's text (remembered for the last 1,024 texts: a turn reads each
    recalled memory's terms for the question's weights and its line's again to tell a repeat, and the next turns
    recall many of the same memories)."""
    return frozenset(terms(text))


@lru_cache(maxsize=1 << 14)
def _word_terms(word: str) -> tuple[str, ...]:
    """:func:`terms` of one word (remembered: a packing reads every word of every recalled memory, and most of
    them are common words)."""
    return tuple(terms(word))


def _marks(segment: str, weights: dict[str, float]) -> list[tuple[int, int, str]]:
    """(start, end, term) of each word of ``segment`` that carries a weighted query term."""
    out = []
    for m in _WORD.finditer(segment):
        for t in _word_terms(m.group()):
            if weights.get(t, 0.0) > 0:
                out.append((m.start(), m.end(), t))
    return out


def _window(segment: str, marks: list[tuple[int, int, str]], weights: dict[str, float], limit: int
            ) -> tuple[str, set[str], float]:
    """The part of ``segment`` of at most ``limit`` characters whose distinct query terms weigh most, cut at
    word ends, with "…" where it was cut; its terms and their weight."""
    if len(segment) <= limit:
        held = {t for *_, t in marks}
        return segment, held, sum(weights[t] for t in held)
    best: tuple[float, int, int, set[str]] | None = None
    for i, (start, _, _) in enumerate(marks):
        fits = [(e, t) for s, e, t in marks[i:] if e - start <= limit]
        if not fits:  # one word longer than the window: it cannot be shown whole
            continue
        held = {t for _, t in fits}
        w = sum(weights[t] for t in held)
        if best is None or w > best[0]:
            best = (w, start, max(e for e, _ in fits), held)
    if best is None:  # no question word fits: the segment's opening, cut
        return segment[:max(0, limit - 1)].rstrip() + "\u2026", set(), 0.0
    w, start, end, held = best
    # centre what was found in the room left, then snap to word boundaries
    room = limit - (end - start)
    lo = max(0, start - room // 2)
    hi = min(len(segment), lo + limit)
    lo = max(0, hi - limit)
    if lo > 0:
        sp = segment.find(" ", lo, start + 1)
        lo = sp + 1 if sp != -1 else lo
    if hi < len(segment):
        sp = segment.rfind(" ", end, hi)
        hi = sp if sp != -1 else hi
    piece = segment[lo:hi].strip()
    return ("\u2026" if lo > 0 else "") + piece + ("\u2026" if hi < len(segment) else ""), held, w


def _discounted(weights: dict[str, float], covered: set[str]) -> dict[str, float]:
    """``weights`` with the terms an earlier piece holds at half weight: a later piece is chosen for the
    question words it adds, or for naming the subject again beside a figure (a table row under its heading)."""
    return {t: w * (0.5 if t in covered else 1.0) for t, w in weights.items()}


def excerpt(text: str, weights: dict[str, float], limit: int) -> str | None:
    """At most ``limit`` characters of ``text`` that hold the most weight of the question's terms (see the
    module doc); None when ``text`` holds none of them."""
    found = [(seg, marks) for seg in segments(text) if (marks := _marks(seg, weights))]
    if not found:
        return None
    pieces: list[tuple[int, str]] = []
    covered: set[str] = set()
    left = limit
    order = {seg: i for i, (seg, _) in enumerate(found)}
    while found and len(pieces) < PIECES and left >= 24:
        scored = []
        for seg, marks in found:
            piece, held, w = _window(seg, marks, _discounted(weights, covered), left)
            figure = bool(FIGURE.search(piece))
            if held - covered or (pieces and figure):
                scored.append((w, figure, -order[seg], seg, piece, held))
        if not scored:
            break
        w, _, _, seg, piece, held = max(scored, key=lambda s: s[:3])
        pieces.append((order[seg], piece))
        covered |= held
        left -= len(piece) + 3
        found = [(s, m) for s, m in found if s != seg]
    return " \u2026 ".join(p for _, p in sorted(pieces)) if pieces else None
