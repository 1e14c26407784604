"""Time references in text (pure): dates written out, relative dates resolved against the time a
message was said, how long ago something was, and the time span a question asks about.

``resolve_relative("I went there yesterday", at)`` → ``"I went there on 2 March 2024"`` when ``at`` is
3 March 2024: a memory read weeks later still says when it happened. Nothing here reads a clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from functools import lru_cache

from soul_runtime.clock import DAY

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "a couple": 2}
_NUM = r"(?P<n>\d{1,2}|a couple(?: of)?|a few|few|several|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
_PREP = r"(?P<prep>\b(?:since|until|till|from|by|before|after|of|on)\s+)?"


_EPOCH_DAY = date(1970, 1, 1).toordinal()


def _day(ts: float) -> date:
    """The UTC calendar day of a timestamp (the day of ``datetime.fromtimestamp(ts, timezone.utc)``, by
    integer arithmetic: a turn dates each of its ~64 recalled memories, several times)."""
    frac, whole = math.modf(ts)
    us = round(frac * 1e6)  # fromtimestamp rounds to the microsecond first (half to even)
    secs = int(whole) + (1 if us >= 1_000_000 else -1 if us < 0 else 0)
    return date.fromordinal(_EPOCH_DAY + secs // 86_400)


def day_text(ts: float | date) -> str:
    """``3 March 2024``."""
    return _day_text(ts if isinstance(ts, date) else _day(ts))


@lru_cache(maxsize=4096)
def _day_text(d: date) -> str:
    return f"{d.day} {d.strftime('%B')} {d.year}"


def _month_text(year: int, month: int) -> str:
    return f"{date(year, month, 1).strftime('%B')} {year}"


def _shift_month(d: date, months: int) -> tuple[int, int]:
    m = d.year * 12 + d.month - 1 + months
    return m // 12, m % 12 + 1


def _n(text: str) -> int:
    t = text.lower()
    return int(t) if t.isdigit() else _NUMBERS.get(t, 1)


def _on(prep: str | None, when: str) -> str:
    return f"{prep}{when}" if prep else f"on {when}"


_RULE_PATTERNS = tuple(re.compile(p, re.I) for p in (
    _PREP + r"\bthe day before yesterday\b",
    _PREP + r"\byesterday\b",
    _PREP + r"\blast night\b",
    _PREP + r"\btomorrow\b",
    _PREP + r"\b(?:last|this past)\s+(?P<wd>" + "|".join(_WEEKDAYS) + r")\b",
    _PREP + r"\b(?:next|this coming)\s+(?P<wd>" + "|".join(_WEEKDAYS) + r")\b",
    _PREP + r"\b" + _NUM + r"\s+(?P<unit>days?|weeks?|weekends?|months?|years?)\s+ago\b",
    r"\b(?:last|this past)\s+(?P<unit>week|weekend)\b",
    r"\bnext\s+(?P<unit>week|weekend)\b",
    r"\blast month\b",
    r"\bnext month\b",
    r"\bthis month\b",
    r"\blast year\b",
    r"\bnext year\b",
    r"\bthis year\b",
))
_RELATIVE = re.compile(r"yesterday|last|tomorrow|next|this|ago", re.I)
"""A word that every match of a rule holds: a text without one has no relative date to resolve."""
_DOUBLE_PREP = re.compile(r"\b(in|on) (?:in|on) ")


def _rules(d: date) -> list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]]:
    anchor = day_text(d)

    def weekday(m: re.Match[str], forward: bool) -> str:
        wd = _WEEKDAYS.index(m.group("wd").lower())
        if forward:
            delta = (wd - d.weekday()) % 7 or 7
            target = d + timedelta(days=delta)
        else:
            delta = (d.weekday() - wd) % 7 or 7
            target = d - timedelta(days=delta)
        return _on(m.group("prep"), f"{m.group('wd').capitalize()} {day_text(target)}")

    def ago(m: re.Match[str]) -> str:
        n, unit = _n(m.group("n")), m.group("unit").lower().rstrip("s")
        vague = m.group("n").lower() in ("a few", "few", "several")
        if vague:
            return f"{(m.group('prep') or '')}{m.group('n')} {m.group('unit')} before {anchor}"
        if unit == "day":
            return _on(m.group("prep"), day_text(d - timedelta(days=n)))
        if unit == "year":
            return f"{m.group(0).strip()} (in {d.year - n})"
        if unit == "month":
            return f"{m.group(0).strip()} (in {_month_text(*_shift_month(d, -n))})"
        words = "" if m.group("n").lower() in ("a", "an", "one") else m.group("n") + " "
        return f"{(m.group('prep') or '')}{words}{m.group('unit')} before {anchor}"

    y, mo = d.year, d.month
    replace: tuple[Callable[[re.Match[str]], str], ...] = (
        lambda m: _on(m.group("prep"), day_text(d - timedelta(days=2))),
        lambda m: _on(m.group("prep"), day_text(d - timedelta(days=1))),
        lambda m: f"{m.group('prep') or ''}the night of {day_text(d - timedelta(days=1))}",
        lambda m: _on(m.group("prep"), day_text(d + timedelta(days=1))),
        lambda m: weekday(m, False),
        lambda m: weekday(m, True),
        ago,
        lambda m: f"the {m.group('unit').lower()} before {anchor}",
        lambda m: f"the {m.group('unit').lower()} after {anchor}",
        lambda m: f"in {_month_text(*_shift_month(d, -1))}",
        lambda m: f"in {_month_text(*_shift_month(d, 1))}",
        lambda m: f"in {_month_text(y, mo)}",
        lambda m: f"in {y - 1}",
        lambda m: f"in {y + 1}",
        lambda m: f"in {y}",
    )
    return list(zip(_RULE_PATTERNS, replace, strict=True))


def resolve_relative(text: str, at: float) -> str:
    """``text`` with relative dates ("yesterday", "last Friday", "two weeks ago", "last year") written
    as absolute ones, reckoned from ``at`` (when the text was said, UTC epoch seconds)."""
    d = _day(at)
    if _RELATIVE.search(text):  # else no rule matches: nothing to reckon
        for rx, fn in _rules(d):
            text = rx.sub(lambda m, fn=fn: _keep_case(m, fn(m)), text)  # type: ignore[misc]
    return _DOUBLE_PREP.sub(r"\1 ", text)


def _keep_case(m: re.Match[str], new: str) -> str:
    return new[:1].upper() + new[1:] if m.group(0)[:1].isupper() and m.start() == 0 else new


def ago(ts: float, now: float) -> str:
    """How long before ``now`` ``ts`` was, while that is informative (under ~2 months); '' otherwise."""
    days = (_day(now) - _day(ts)).days
    if days < 0 or days > 60:
        return ""
    if days == 0:
        return "today"
    if days == 1:
        return "yesterday"
    if days < 14:
        return f"{days} days ago"
    return f"{days // 7} weeks ago"


# ---- what a question asks about -------------------------------------------------------
@dataclass(frozen=True)
class TimeScope:
    """The part of the time axis a question points at: a session N back, or a time range."""

    sessions_ago: int | None = None
    since: float | None = None
    until: float | None = None


_ORD = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8,
        "ninth": 9, "tenth": 10}


_SCOPE_WORDS = re.compile(r"ago|last|previous|yesterday|today|this morning")
"""A word that every time a question can point at holds (in lower case)."""
_SESSIONS_AGO = re.compile(_NUM + r"\s+(?:sessions?|conversations?|chats?|talks?)\s+ago\b")
_LAST_SESSION = re.compile(r"\b(?:last|previous) (?:session|conversation|chat|time we (?:talked|spoke|chatted))\b")
_DAY_BEFORE = re.compile(r"\bthe day before yesterday\b")
_YESTERDAY = re.compile(r"\byesterday\b|\blast night\b")
_TODAY = re.compile(r"\b(?:earlier )?today\b|\bthis morning\b")
_UNITS_AGO = re.compile(_NUM + r"\s+(?P<unit>days?|weeks?|months?)\s+ago\b")
_LAST_WEEK = re.compile(r"\blast week\b")
_LAST_MONTH = re.compile(r"\blast month\b")


def query_scope(query: str, now: float) -> TimeScope | None:
    """ "what happened three sessions ago" → ``TimeScope(sessions_ago=3)``; "last session" → 1;
    "yesterday", "last week", "last month", "N days/weeks ago" → a time range before ``now``."""
    q = query.lower().replace("\u2019", "'")
    if not _SCOPE_WORDS.search(q):  # none of the patterns below can match
        _day(now)  # a ``now`` out of range fails here as it does below
        return None
    m = _SESSIONS_AGO.search(q)
    if m:
        return TimeScope(sessions_ago=_n(m.group("n")))
    if _LAST_SESSION.search(q):
        return TimeScope(sessions_ago=1)
    d = _day(now)
    start = datetime(d.year, d.month, d.day, tzinfo=timezone.utc).timestamp()
    if _DAY_BEFORE.search(q):
        return TimeScope(since=start - 2 * DAY, until=start - DAY)
    if _YESTERDAY.search(q):
        return TimeScope(since=start - DAY, until=start)
    if _TODAY.search(q):
        return TimeScope(since=start, until=start + DAY)
    m = _UNITS_AGO.search(q)
    if m:
        n, unit = _n(m.group("n")), m.group("unit").rstrip("s")
        span = {"day": 1, "week": 7, "month": 30}[unit]
        return TimeScope(since=start - (n + 1) * span * DAY, until=start - (n - 1) * span * DAY + DAY)
    if _LAST_WEEK.search(q):
        return TimeScope(since=start - 14 * DAY, until=start)
    if _LAST_MONTH.search(q):
        return TimeScope(since=start - 62 * DAY, until=start)
    return None
