"""What each tenant used: turns, model tokens (in all and per UTC day), turns refused over a limit, and seconds
its work waited for a host's threads or the model's slots.

Each process that counts (a soul host, a service replica) keeps a :class:`UsageBook` and writes it every
:data:`FLUSH_S` to a place of its own (:func:`usage_book`): with a PostgreSQL storage the document ``usage:NAME``
on the server, which every node sees; else the file ``DATA_DIR/service/usage/NAME.json`` (atomically). A host
restarted under its name goes on from its book, on whichever node. :func:`read_usage` sums the books:
``soul tenants usage``, the service's ``GET /v1/usage`` and the tokens-per-day limit read it. The tenant of a soul
is the prefix of its id (:func:`actors.fair_pool.tenant_of`).
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from soul_runtime.errors import StorageError
from soul_runtime.memory.pg_records import PgDocument
from soul_runtime.memory.postgres_db import is_postgres
from soul_runtime.owner_only import write_file

FLUSH_S = 1.0
COUNTERS = ("turns", "tokens", "throttled", "queued_s")
"""turns: turns, observes and forgets applied; tokens: model tokens (input, output, cache) of them; throttled:
turns refused over a limit (429); queued_s: seconds the tenant's work waited for threads or model slots."""
DAYS_KEPT = 2
DOC_PREFIX = "usage:"
"""The usage books' documents on a PostgreSQL storage's server: ``usage:NAME``."""


def usage_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / "service" / "usage"


def day_of(now: float) -> str:
    """The UTC day of an epoch time, as ``YYYY-MM-DD``."""
    return datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%d")


def seconds_to_next_day(now: float) -> float:
    """Seconds from ``now`` to the next UTC midnight (at least 1)."""
    return max(1.0, 86400.0 - now % 86400.0)


def usage_book(data_dir: str | os.PathLike[str], storage: str, name: str, clock: Any = time.time, *,
               resume: bool = True) -> UsageBook:
    """The book of the counting process ``name`` (unique in the cluster: a host's actor name, a replica's node
    and pid), kept where its storage keeps records: on a PostgreSQL server, else in the data dir. ``resume``:
    go on from what the book holds (a restarted host); a book whose name no earlier process had need not look."""
    if is_postgres(storage):
        return UsageBook(None, clock, doc=PgDocument(storage, DOC_PREFIX + name), resume=resume)
    return UsageBook(usage_dir(data_dir) / f"{name}.json", clock, resume=resume)


class UsageBook:
    """One process's counts per tenant, and its tokens per UTC day, kept in the file ``path`` or the server's
    document ``doc`` (neither: counted here only)."""

    def __init__(self, path: Path | None, clock: Any = time.time, *, doc: PgDocument | None = None,
                 resume: bool = True) -> None:
        self.path = path
        self.doc = doc
        self.clock = clock
        self.counts: dict[str, defaultdict[str, float]] = {}
        self.days: dict[str, dict[str, int]] = {}  # day -> tenant -> tokens
        self._dirty = False
        self._flushed = 0.0
        try:
            raw = {} if not resume else json.loads(path.read_text()) if path is not None and path.exists() else \
                doc.read() if doc is not None else {}
            self.counts = {t: defaultdict(float, c) for t, c in raw.get("tenants", {}).items()}
            self.days = {d: dict(v) for d, v in raw.get("days", {}).items()}
        except (OSError, ValueError, StorageError):
            pass  # a file cut short, a server away: counting starts again

    @property
    def kept(self) -> bool:
        """Is the book written anywhere (a file, a document)?"""
        return self.path is not None or self.doc is not None

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
        doc = self.due(force=force)
        if doc is None:
            return False
        self.write(doc)
        return True

    def due(self, *, force: bool = False) -> dict[str, Any] | None:
        """The document to write now, if the book changed (at most every :data:`FLUSH_S` unless ``force``):
        :meth:`write` it (a caller that guards the book with a lock writes it outside the lock)."""
        now = time.monotonic()
        if not self.kept or not self._dirty or (not force and now - self._flushed < FLUSH_S):
            return None
        self._dirty, self._flushed = False, now
        return self.document()

    def write(self, doc: dict[str, Any]) -> None:
        """Write a document :meth:`due` gave; when that fails, the book is written again at the next flush."""
        try:
            if self.doc is not None:
                self.doc.put(doc)
            elif self.path is not None:
                write_file(self.path, json.dumps(doc, separators=(",", ":")), durable=False)
        except BaseException:
            self._dirty = True
            raise


def _books(data_dir: str | os.PathLike[str], storage: str) -> list[dict[str, Any]]:
    if is_postgres(storage):
        return [doc for _, doc in PgDocument.all_named(storage, DOC_PREFIX)]
    out = []
    d = usage_dir(data_dir)
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            out.append(dict(json.loads(f.read_text())))
        except (OSError, ValueError):
            continue  # being replaced, or cut short
    return out


def read_usage(data_dir: str | os.PathLike[str], now: float | None = None, storage: str = ""
               ) -> dict[str, dict[str, float]]:
    """Every tenant's counts summed over the processes' books (those of ``storage``: see :func:`usage_book`),
    with ``tokens_today`` (this UTC day's)."""
    today = day_of(time.time() if now is None else now)
    out: dict[str, defaultdict[str, float]] = {}
    for raw in _books(data_dir, storage):
        for tenant, counts in raw.get("tenants", {}).items():
            sums = out.setdefault(tenant, defaultdict(float))
            for k, v in counts.items():
                if k in COUNTERS:
                    sums[k] += v
        for tenant, n in raw.get("days", {}).get(today, {}).items():
            out.setdefault(tenant, defaultdict(float))["tokens_today"] += n
    return {t: {k: c.get(k, 0) for k in (*COUNTERS, "tokens_today")} for t, c in sorted(out.items())}
