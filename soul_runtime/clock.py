"""Turning what callers pass as a time into UTC epoch seconds. No clock is read here."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from soul_runtime.errors import InvalidInput
from soul_runtime.limits import TIME_MAX, TIME_MIN

DAY = 86_400.0

def to_timestamp(value: object) -> float:
    """A ``datetime`` (naive = UTC), epoch seconds, or an ISO-8601 string → epoch seconds."""
    if isinstance(value, bool):
        raise InvalidInput(f"not a time: {value!r}")
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return to_timestamp(value.timestamp())
    if isinstance(value, (int, float)):
        try:
            v = float(value)
        except OverflowError:
            raise InvalidInput(f"time out of range: {value!r}") from None
        if not math.isfinite(v) or v < TIME_MIN or v > TIME_MAX:  # 1970 .. year 3000
            raise InvalidInput(f"time out of range: {value!r}")
        return v
    if isinstance(value, str):
        try:
            return to_timestamp(datetime.fromisoformat(value.strip().replace("Z", "+00:00")))
        except ValueError:
            raise InvalidInput(f"not an ISO-8601 time: {value!r}") from None
    raise InvalidInput(f"not a time: {value!r}")


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def time_arg(value: str | None) -> Any:
    """A time as a command line or a query string gives it: seconds since the epoch, or ISO-8601 text (checked
    where it is used, with :func:`to_timestamp`); None stays None."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return value
