"""What each tenant used: turns, model tokens (in all and per UTC day), turns refused over a limit, and seconds
its work waited for a host's threads or the model's slots.

Each process that counts (a soul host, a service replica) keeps a :class:`UsageBook` and writes it every
:data:`FLUSH_S` to a file of its own, ``DATA_DIR/service/usage/NAME.json`` (atomically); a host restarted under
its name goes on from its file. :func:`read_usage` sums the files: ``soul tenants usage``, the service's
``GET /v1/usage`` and the tokens-per-day limit read it. (On a cluster of several nodes each node's data dir holds
the files of its own processes.) The tenant of a soul is the prefix of its id (:func:`actors.fair_pool.tenant_of`).
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from soul_runtime.owner_only import write_file

FLUSH_S = 1.0
COUNTERS = ("turns", "tokens", "throttled", "queued_s")
"""turns: turns, observes and forgets applied; tokens: model tokens (input, output, cache) of them; throttled:
turns refused over a limit (429); queued_s: seconds the tenant's work waited for threads or model slots."""
DAYS_KEPT = 2


def usage_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / "service" / "usage"


def day_of(now: float) -> str:
    """The UTC day of an epoch time, as ``YYYY-MM-DD``."""
    return datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%d")


def seconds_to_next_day(now: float) -> float:
    """Seconds from ``now`` to the next UTC midnight (at least 1)."""
    return max(1.0, 86400.0 - now % 86400.0)


class UsageBook:
    """One process's counts per tenant, and its tokens per UTC day."""

    def __init__(self, path: Path | None, clock: Any = time.time) -> None:
        self.path = path
        self.clock = clock
        self.counts: dict[str, defaultdict[str, float]] = {}
        self.days: dict[str, dict[str, int]] = {}  # day -> tenant -> tokens
        self._dirty = False
        self._flushed = 0.0
        if path is not None and path.exists():
            try:
                raw = json.loads(path.read_text())
                self.counts = {t: defaultdict(float, c) for t, c in raw.get("tenants", {}).items()}
                self.days = {d: dict(v) for d, v in raw.get("days", {}).items()}
            except (OSError, ValueError):
                pass  # a file cut short: counting starts again

    def add(self, tenant: str, counter: str, n: float = 1) -> None:
        if not n:
            return
        self.counts.setdefault(tenant, defaultdict(float))[counter] += n
        if counter == "tokens":
            day = self.days.setdefault(day_of(self.clock()), {})
            day[tenant] = day.get(tenant, 0) + int(n)
            for old in sorted(self.days)[:-DAYS_KEPT]:
                del self.days[old]
        self._dirty = True

    def document(self) -> dict[str, Any]:
        return {"tenants": {t: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in c.items()}
                            for t, c in self.counts.items()}, "days": self.days}

    def flush(self, *, force: bool = False) -> bool:
        """Write the book if it changed (at most every :data:`FLUSH_S` unless ``force``)."""
        now = time.monotonic()
        if self.path is None or not self._dirty or (not force and now - self._flushed < FLUSH_S):
            return False
        self._dirty, self._flushed = False, now
        write_file(self.path, json.dumps(self.document(), separators=(",", ":")), durable=False)
        return True


def read_usage(data_dir: str | os.PathLike[str], now: float | None = None) -> dict[str, dict[str, float]]:
    """Every tenant's counts summed over the processes' files, with ``tokens_today`` (this UTC day's)."""
    today = day_of(time.time() if now is None else now)
    out: dict[str, defaultdict[str, float]] = {}
    d = usage_dir(data_dir)
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            raw = json.loads(f.read_text())
        except (OSError, ValueError):
            continue  # being replaced, or cut short
        for tenant, counts in raw.get("tenants", {}).items():
            sums = out.setdefault(tenant, defaultdict(float))
            for k, v in counts.items():
                if k in COUNTERS:
                    sums[k] += v
        for tenant, n in raw.get("days", {}).get(today, {}).items():
            out.setdefault(tenant, defaultdict(float))["tokens_today"] += n
    return {t: {k: c.get(k, 0) for k in (*COUNTERS, "tokens_today")} for t, c in sorted(out.items())}
