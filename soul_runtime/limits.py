"""What the runtime's API accepts, stated once: the characters and length of ids, the texts, the times, the
bounds of every integer and the store names.

Each limit is a constant (or a regular expression built from constants) here. The HTTP API's document states
them as JSON Schema and its request models enforce exactly those schemas (:mod:`soul_apps.service.contract`); the
handles' own checks (:mod:`soul_runtime.soul_args`, :mod:`soul_runtime.clock`, :mod:`soul_apps.service.tenants`) use
the same constants. The patterns are written in the subset of regular expressions that Python, ECMAScript and
JSON Schema read alike (character classes, ``\\uXXXX`` escapes, counted repeats; no lookaround)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from soul_runtime.errors import InvalidInput

# ---- ids ------------------------------------------------------------------------------
ID_FIRST = "A-Za-z0-9"
ID_CHARS = "A-Za-z0-9_.:@-"
ID_MAX = 128
"""An id of the runtime (a soul, a message, a user, a session): letters, digits, ``_.:@-``, starting with a
letter or digit, at most this many characters."""
TENANT_MAX = 32
SOUL_ID_MAX = ID_MAX - TENANT_MAX - 1
"""A tenant's soul id: the runtime's id is ``TENANT:ID``, so the longest tenant name and the ``:`` come off."""


def id_pattern(max_chars: int) -> str:
    return f"^[{ID_FIRST}][{ID_CHARS}]{{0,{max_chars - 1}}}$"


ID_PATTERN = id_pattern(ID_MAX)
SOUL_ID_PATTERN = id_pattern(SOUL_ID_MAX)

# ---- texts ----------------------------------------------------------------------------
TEXT_MAX = 2_000_000
"""A turn's text, an observed message's text (the runtime's ``TurnConfig.max_text_chars`` default: a long one is
stored as units)."""
QUERY_MAX = 1_000
"""A query in a URL (recall's ``q``), and a forget phrase: a URL of at most ~16 KB carries it in any script."""
NAME_MAX = 200
"""An entity, an attribute, a speaker, a task class."""
FORGET_ID_MAX = 500
FORGET_IDS_MAX = 1_000
MESSAGES_MAX = 1_000
"""Messages in one observe call."""

_CONTROL = "\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f"
"""C0 controls but tab, newline and carriage return; DEL (what ``check_text`` refuses)."""
_CONTROLS = frozenset([*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
_SPACE = "".join(f"\\u{c:04x}" for c in range(0x10000) if chr(c).isspace() and c not in _CONTROLS)
"""White space (what ``str.strip`` takes off) that is not a control character."""
TEXT_PATTERN = f"^[{_SPACE}]*[^{_CONTROL}{_SPACE}][^{_CONTROL}]*$"
"""A text with a character other than white space and no control character (tab, newline, return allowed)."""

KEY_MAX = 200
KEY_PATTERN = f"^[!-~]([ -~]{{0,{KEY_MAX - 2}}}[!-~])?$"
"""An ``Idempotency-Key``: 1-200 printable ASCII characters, no space at either end (HTTP strips those)."""

# ---- integers -------------------------------------------------------------------------
K_MAX = 1_000
"""Memories a recall returns at most."""
LAST_MAX = 10_000
"""Traces one call returns at most."""
SESSIONS_AGO_MAX = 2**31 - 1
SEQ_MAX = 2**53 - 1
"""A turn's number (the largest integer a JavaScript number holds exactly)."""

# ---- times ----------------------------------------------------------------------------
TIME_MIN = 0.0
TIME_MAX = 32_503_680_000.0
"""Epoch seconds: 1970-01-01 .. 3000-01-01 UTC."""
YEAR_MIN, YEAR_MAX = 1971, 2998
"""The years of a date-time given as text: every instant of them, at any UTC offset, is within the epoch bounds."""
_YEARS = "197[1-9]|19[89][0-9]|2[0-8][0-9][0-9]|29[0-8][0-9]|299[0-8]"
ISO_PATTERN = (f"^({_YEARS})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):([0-5][0-9]):"
               "([0-5][0-9])(\\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):([0-5][0-9]))$")
"""An RFC 3339 date-time (JSON Schema's ``date-time``) with a year in ``YEAR_MIN..YEAR_MAX``, at most nanoseconds."""
_ISO = re.compile(ISO_PATTERN.replace("$", "\\Z"))

# ---- store names ----------------------------------------------------------------------
STORES = ("episodic", "semantic", "procedural")

DESCRIBED = {
    ID_PATTERN: f"1-{ID_MAX} characters of letters, digits and '_.:@-', starting with a letter or digit",
    SOUL_ID_PATTERN: f"1-{SOUL_ID_MAX} characters of letters, digits and '_.:@-', starting with a letter or digit",
    TEXT_PATTERN: "text with a character other than white space, and no control character",
    KEY_PATTERN: f"1-{KEY_MAX} printable ASCII characters, no space at either end",
    ISO_PATTERN: f"an RFC 3339 date-time ('Z' or an offset) in the years {YEAR_MIN}-{YEAR_MAX}",
}
"""What each pattern asks for, in words (the errors say this rather than the pattern)."""


def iso_seconds(text: str) -> float:
    """Epoch seconds of a date-time that matches :data:`ISO_PATTERN`, or :class:`InvalidInput`."""
    m = _ISO.match(text)
    if m is None:
        raise InvalidInput(f"not {DESCRIBED[ISO_PATTERN]}: {text[:64]!r}")
    y, mo, d, h, mi, s, frac, _, oh, om = m.groups()
    sign = -1 if m.group(8)[0] == "-" else 1
    offset = timedelta(hours=int(oh), minutes=int(om)) * sign if oh else timedelta(0)
    try:
        when = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), tzinfo=timezone(offset))
    except ValueError as e:
        raise InvalidInput(f"not a date: {text[:64]!r} ({e})") from None
    return when.timestamp() + (float(frac) if frac else 0.0)


def check_int(value: object, what: str, lo: int, hi: int) -> int:
    """``value`` if it is an int (not a bool) in ``lo..hi``, else :class:`InvalidInput`."""
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InvalidInput(f"{what} must be an int in {lo}..{hi}, got {value!r}"[:200])
    return value
