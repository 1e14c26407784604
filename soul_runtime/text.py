"""Text helpers: validation, token estimates, lexical tokens. Pure functions."""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from soul_runtime.errors import InvalidInput

_WORD = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # C0 controls but tab, newline, return; DEL

STOPWORDS = frozenset(
    """a an the and or but if then so of to in on at by for with from as is are was were be been being am do does
    did doing have has had having i me my mine we us our you your he him his she her it its they them their this that
    these those what which who whom whose when where why how not no yes can could would should will shall may might
    must just very really too also there here about into over under again all any some such only own same than up
    down out off just i'm it's that's don't didn't i've i'd you're we're they're oh hey hi wow yeah ok okay""".split()
)


def check_text(text: object, *, what: str = "text", max_chars: int = 100_000, allow_empty: bool = False) -> str:
    """Return ``text`` if it is acceptable, else raise :class:`InvalidInput`."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"{what} is not valid UTF-8") from None
    if not isinstance(text, str):
        raise InvalidInput(f"{what} must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} is not valid UTF-8 (lone surrogate)") from None
    if not allow_empty and not text.strip():
        raise InvalidInput(f"{what} is empty")
    if len(text) > max_chars:
        raise InvalidInput(f"{what} is too long: {len(text)} characters (limit {max_chars})")
    bad = _CONTROL.search(text)
    if bad is not None:
        raise InvalidInput(f"{what} contains a control character (U+{ord(bad.group()):04X})")
    return text


_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")


def check_id(value: object, *, what: str = "id") -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise InvalidInput(f"{what} must be 1-128 characters of letters, digits, '_.:@-' starting with a letter or digit; "
                           f"got {value!r}")
    return value


def estimate_tokens(text: str) -> int:
    """≈ characters / 4, the convention of the benchmarks; never 0 for non-empty text."""
    return (len(text) + 3) // 4


# What a case-insensitive pattern matches to an ASCII letter but ``str.lower`` does not make that letter: the
# dotless i, the long s, and the combining dot that ``lower`` leaves after an i made from a dotted capital I.
_FOLD = str.maketrans({"\u0131": "i", "\u017f": "s", "\u0307": ""})


def folded(text: str) -> str:
    """``text`` in lower case, folded so that a word (lower case) a case-insensitive pattern would find in it is
    a substring of the result (never the other way round: the fold may make a word appear that no pattern sees)."""
    low = text.lower()
    return low if low.isascii() else low.translate(_FOLD)


def lacks_words(text: str, words: tuple[str, ...]) -> bool:
    """True when ``text`` certainly holds none of ``words`` (lower case) in any letter case. A pattern that needs
    one of ``words`` to match cannot match such a text, so it need not be run."""
    low = folded(text)
    return not any(w in low for w in words)


class GatedPattern:
    """A case-insensitive alternation run branch by branch, each branch only on a text holding one of its words:
    most texts hold the words of few branches, and a long text is scanned once per branch that could match
    rather than once for them all. ``pattern`` is the whole alternation; :meth:`search` says what it says."""

    def __init__(self, branches: list[tuple[str, tuple[str, ...]]], flags: int = 0) -> None:
        flags |= re.IGNORECASE
        self.pattern = re.compile("|".join(f"(?:{p})" for p, _ in branches), flags)
        self._branches = [(re.compile(p, flags), words) for p, words in branches]

    def search(self, text: str) -> bool:
        low = folded(text)
        return any(any(w in low for w in words) and rx.search(text) is not None for rx, words in self._branches)


def collapse(text: str) -> str:
    """White space folded to single spaces, ends stripped."""
    return " ".join(text.split())


def normalise(text: str) -> str:
    """NFKC, lower case, white space collapsed: the key facts and guards compare on."""
    return collapse(unicodedata.normalize("NFKC", text).lower())


def fold(text: str) -> str:
    """:func:`normalise`, then straight quotes, possessive 's dropped, punctuation out: for word matching."""
    t = _POSSESSIVE.sub("", normalise(text).replace("\u2019", "'").replace("\u2018", "'"))
    return collapse(_PUNCT.sub(" ", t).replace("'", ""))


_POSSESSIVE = re.compile(r"'s\b")
_PUNCT = re.compile(r"[^\w\s'-]")


@lru_cache(maxsize=1 << 14)
def stem(w: str) -> str:
    """A light suffix stripper shared by lexical search and the offline model's word matching (remembered for
    the commonest words: packing a turn's memories stems every word of them)."""
    for suf in ("'s", "ing", "ies", "ed", "es", "s"):
        if w.endswith(suf) and len(w) - len(suf) >= 3:
            return w[: -len(suf)] + ("y" if suf == "ies" else "")
    return w


def singular(word: str) -> str:
    """A plural noun's singular ("timelines" → "timeline", "stories" → "story"); other words as they are, lower-cased."""
    w = word.lower().strip("'")
    plural = len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is"))
    return w[:-3] + "y" if len(w) > 4 and w.endswith("ies") else w[:-1] if plural else w


def words(text: str) -> list[str]:
    return _WORD.findall(normalise(text))


_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_LOG_LINE = re.compile(r"^\s*\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")


def prose(text: str) -> str:
    """The prose of a message: fenced code blocks, markdown table rows and timestamped log lines left out.
    Statements are read from sentences; a message's code, tables and logs are kept whole as the episodes of
    its units (:mod:`soul_runtime.loop.units`)."""
    if "```" not in text and "|" not in text and not _LOG_LINE.search(text):
        return text
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced and not _TABLE_ROW.match(line) and not _LOG_LINE.match(line):
            out.append(line)
    return "\n".join(out)


_LINE_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=\S)")


def segments(text: str) -> list[str]:
    """The lines of ``text``, and the sentences of a line that holds several, stripped; blank ones left out."""
    out: list[str] = []
    for line in text.split("\n"):
        out += [s.strip() for s in _LINE_SENTENCE_END.split(line.strip()) if s.strip()]
    return out


def terms(text: str) -> list[str]:
    """Lexical terms: lower-case words without stopwords, lightly stemmed."""
    return [stem(w) for w in words(text) if w not in STOPWORDS and len(w) > 1]


WRITE_LIMITS: dict[str, int] = {
    "turn key": 300, "actor": 200, "session": 300, "key context": 200_000, "source id": 300,
    "episode summary": 20_000, "episode detail": 20_000, "entity": 300, "fact entity": 2_000,
    "fact attribute": 2_000, "fact value": 2_000, "task class": 300, "task step": 2_000,
}
"""The longest text (in characters) each part of a write may hold: the stores refuse a longer one
(:func:`check_write_request`); the write path fits a model's extraction to them first
(:mod:`soul_runtime.loop.fit`)."""


def check_write_request(req: object) -> None:
    """Validate every string and number of a write before any store is touched."""
    from soul_runtime.records import WriteRequest  # local: records does not depend on text

    lim = WRITE_LIMITS
    if not isinstance(req, WriteRequest):
        raise InvalidInput(f"expected a WriteRequest, got {type(req).__name__}")
    check_text(req.turn_key, what="turn key", max_chars=lim["turn key"])
    if not isinstance(req.now, (int, float)) or req.now != req.now or req.now in (float("inf"), float("-inf")):
        raise InvalidInput(f"write time must be a finite number, got {req.now!r}")
    check_text(req.actor, what="actor", max_chars=lim["actor"], allow_empty=True)
    check_text(req.session, what="session", max_chars=lim["session"], allow_empty=True)
    check_text(req.key_context, what="key context", max_chars=lim["key context"], allow_empty=True)
    check_text(req.vector_text, what="vector text", max_chars=lim["key context"], allow_empty=True)
    for s in req.sources:
        check_text(s, what="source id", max_chars=lim["source id"])
    ex = req.extraction
    check_text(ex.episode, what="episode summary", allow_empty=True, max_chars=lim["episode summary"])
    check_text(ex.detail, what="episode detail", allow_empty=True, max_chars=lim["episode detail"])
    for e in ex.entities:
        check_text(e, what="entity", max_chars=lim["entity"])
    for s in ex.extra_sources:
        check_text(s, what="source id", max_chars=lim["source id"])
    for f in ex.facts:
        for what, v in (("fact entity", f.entity), ("fact attribute", f.attribute), ("fact value", f.value)):
            check_text(v, what=what, max_chars=lim[what], allow_empty=True)
        for s in f.sources:
            check_text(s, what="source id", max_chars=lim["source id"])
    if ex.task is not None:
        check_text(ex.task.task_class, what="task class", max_chars=lim["task class"], allow_empty=True)
        for s in ex.task.steps:
            check_text(s, what="task step", max_chars=lim["task step"])
