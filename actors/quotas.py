"""Per-tenant limits: a turn over one of them is refused before it begins (QuotaExceeded with Retry-After; 429
from the service), so nothing of it is applied.

The decisions are pure functions of frozen values and an explicit ``now`` (:func:`take`, :func:`refusal`);
:class:`Quotas` keeps each tenant's token bucket and turns in flight in one process (a service replica, a Python
program's :class:`actors.runtime.Runtime`), and looks up what the tenant has on disk (souls, bytes; at most every
:data:`LOOK_S`) and its model tokens today (:mod:`actors.tenant_usage`). Turns per second and turns in flight are
counted per process: the service divides a tenant's limit among its ``replicas``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soul_runtime.errors import QuotaExceeded
from soul_runtime.memory.soul_records import known, soul_dir, soul_ids

from .metrics import Metrics
from .tenant_limits import NO_LIMITS, Limits
from .tenant_usage import UsageBook, read_usage, seconds_to_next_day

LOOK_S = 5.0
"""How long what a tenant has on disk (souls, stored bytes) and its tokens today are taken as known."""
FULL_RETRY_S = 60.0
"""Retry-After of a refusal that only the tenant's own action ends (a soul deleted, bytes freed)."""


@dataclass(frozen=True)
class Bucket:
    """A token bucket: ``level`` turns may start now, as of ``at``."""

    level: float
    at: float


def take(bucket: Bucket | None, rate: float, now: float) -> tuple[Bucket, float]:
    """One turn from a bucket refilled at ``rate`` per second and holding at most ``max(1, rate)`` (a second's
    worth): ``(bucket, 0)`` when it may start, else ``(bucket, seconds until it may)``."""
    cap = max(1.0, rate)
    level = cap if bucket is None else min(cap, bucket.level + (now - bucket.at) * rate)
    if level >= 1.0:
        return Bucket(level - 1.0, now), 0.0
    return Bucket(level, now), (1.0 - level) / rate


@dataclass(frozen=True)
class Standing:
    """What a tenant has when one of its turns asks to begin."""

    in_flight: int
    souls: int
    stored_bytes: int
    tokens_today: int
    new_soul: bool


def refusal(limits: Limits, standing: Standing, now: float, share: int = 1) -> tuple[str, str, float] | None:
    """Why a turn may not begin (``(limit, message, retry_after)``), or None. ``share``: the replicas the
    in-flight limit is divided among. Turns per second are :func:`take`'s."""
    if limits.in_flight is not None and standing.in_flight >= max(1, limits.in_flight // share):
        return "in_flight", f"the tenant has {limits.in_flight} turns in flight (its limit)", 1.0
    if limits.tokens_per_day is not None and standing.tokens_today >= limits.tokens_per_day:
        return ("tokens_per_day", f"the tenant used its {limits.tokens_per_day} model tokens of today (UTC)",
                seconds_to_next_day(now))
    if limits.stored_bytes is not None and standing.stored_bytes >= limits.stored_bytes:
        return ("stored_bytes", f"the tenant's souls hold {standing.stored_bytes} bytes, at its limit of "
                f"{limits.stored_bytes}", FULL_RETRY_S)
    if limits.souls is not None and standing.new_soul and standing.souls >= limits.souls:
        return "souls", f"the tenant has {standing.souls} souls, its limit: a new soul is refused", FULL_RETRY_S
    return None


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def usage_row(data_dir: str, tenant: str, limits: Limits, counted: dict[str, dict[str, float]] | None = None,
              storage: str = "") -> dict[str, Any]:
    """What a tenant uses (``soul tenants usage``, ``GET /v1/usage``): its souls and their bytes on disk, its
    counts (:func:`actors.tenant_usage.read_usage` of ``storage``; ``counted``: read already) and its limits in
    force."""
    souls = soul_ids(data_dir, tenant + ":")
    c = (read_usage(data_dir, storage=storage) if counted is None else counted).get(tenant, {})
    return {"tenant": tenant, "souls": len(souls), "stored_bytes": sum(dir_bytes(soul_dir(data_dir, s)) for s in souls),
            "turns": int(c.get("turns", 0)), "tokens": int(c.get("tokens", 0)),
            "tokens_today": int(c.get("tokens_today", 0)), "throttled": int(c.get("throttled", 0)),
            "queued_s": round(float(c.get("queued_s", 0)), 3), "limits": limits.to_dict()}


class Quotas:
    """The limits of one process's tenants. ``limits(tenant)``: the tenant's limits in force (the key table's)."""

    def __init__(self, data_dir: str, limits: Callable[[str], Limits], *, replicas: int = 1,
                 book: UsageBook | None = None, clock: Callable[[], float] = time.time, storage: str = "") -> None:
        """``storage``: where the usage books are (:func:`actors.tenant_usage.usage_book`), for tokens today."""
        self.data_dir = data_dir
        self.storage = storage
        self.limits = limits
        self.replicas = max(1, replicas)
        self.book = book or UsageBook(None)
        self.clock = clock
        self.buckets: dict[str, Bucket] = {}
        self.in_flight: Counter[str] = Counter()
        self._looked: dict[str, tuple[float, int, int, int]] = {}  # tenant -> (when, souls, bytes, tokens today)
        self._new: dict[str, set[str]] = {}  # tenant -> new souls admitted since that look
        self.throttled: Counter[str] = Counter()
        self.metrics = Metrics.create()
        self._guard = threading.Lock()  # the counts, for callers on several threads

    def _look(self, tenant: str) -> tuple[int, int, int]:
        """(souls, stored bytes, tokens today) of a tenant (blocking: file system reads)."""
        souls = soul_ids(self.data_dir, tenant + ":")
        stored = sum(dir_bytes(soul_dir(self.data_dir, s)) for s in souls)
        tokens = int(read_usage(self.data_dir, self.clock(), self.storage).get(tenant, {}).get("tokens_today", 0))
        return len(souls), stored, tokens

    def _seen(self, tenant: str, limits: Limits, now: float) -> bool:
        """Is what the tenant has on disk known recently enough (or not needed)?"""
        disk = limits.souls is not None or limits.stored_bytes is not None or limits.tokens_per_day is not None
        seen = self._looked.get(tenant)
        return not disk or (seen is not None and now - seen[0] <= LOOK_S)

    def _looked_now(self, tenant: str, now: float, souls: int, stored: int, tokens: int) -> None:
        with self._guard:
            self._looked[tenant] = (now, souls, stored, tokens)
            self._new.pop(tenant, None)

    def _standing(self, tenant: str, soul_id: str, new_soul: bool) -> Standing:
        with self._guard:
            pending = self._new.get(tenant, set())
            _, souls, stored, tokens = self._looked.get(tenant) or (0.0, 0, 0, 0)
            return Standing(self.in_flight[tenant], souls + len(pending), stored, tokens,
                            new_soul and soul_id not in pending)

    def _refuse(self, tenant: str, limit: str, message: str, retry_after: float) -> QuotaExceeded:
        with self._guard:
            self.throttled[tenant] += 1
        self.metrics.tenant_throttled(tenant, limit)
        self.book.add(tenant, "throttled")
        self.book.flush()
        return QuotaExceeded(f"{message}; retry after {retry_after:.0f} s", retry_after)

    def _begin(self, tenant: str, soul_id: str, limits: Limits, standing: Standing) -> None:
        """The turn begins (counted in flight), or QuotaExceeded is raised."""
        why: tuple[str, str, float] | None = None
        with self._guard:
            now = self.clock()
            if limits != NO_LIMITS:
                why = refusal(limits, standing, now, self.replicas)
                if why is None and limits.turns_per_s is not None:
                    bucket, wait = take(self.buckets.get(tenant), limits.turns_per_s / self.replicas, now)
                    self.buckets[tenant] = bucket
                    if wait > 0:
                        why = ("turns_per_s", f"the tenant sends more than {limits.turns_per_s:g} turns per second "
                               f"(its limit)", wait)
                if why is None and standing.new_soul:  # counted at once: other new souls' first turns see it
                    self._new.setdefault(tenant, set()).add(soul_id)
            if why is None:
                self.in_flight[tenant] += 1
        if why is not None:
            raise self._refuse(tenant, *why)

    def _end(self, tenant: str) -> None:
        with self._guard:
            self.in_flight[tenant] -= 1

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str, soul_id: str) -> AsyncIterator[None]:
        """A turn of ``tenant`` on its soul ``soul_id`` (the runtime's id) begins, or QuotaExceeded is raised
        (the file system is read on a thread)."""
        limits = self.limits(tenant)
        standing = Standing(0, 0, 0, 0, False)
        if limits != NO_LIMITS:
            if not self._seen(tenant, limits, self.clock()):
                now = self.clock()
                self._looked_now(tenant, now, *await asyncio.to_thread(self._look, tenant))
            new = limits.souls is not None and not await asyncio.to_thread(known, self.data_dir, soul_id)
            standing = self._standing(tenant, soul_id, new)
        self._begin(tenant, soul_id, limits, standing)
        try:
            yield
        finally:
            self._end(tenant)

    @contextlib.contextmanager
    def turn_sync(self, tenant: str, soul_id: str) -> Iterator[None]:
        """:meth:`turn` for a caller on a thread of its own (the blocking Python API)."""
        limits = self.limits(tenant)
        standing = Standing(0, 0, 0, 0, False)
        if limits != NO_LIMITS:
            if not self._seen(tenant, limits, self.clock()):
                self._looked_now(tenant, self.clock(), *self._look(tenant))
            standing = self._standing(tenant, soul_id,
                                      limits.souls is not None and not known(self.data_dir, soul_id))
        self._begin(tenant, soul_id, limits, standing)
        try:
            yield
        finally:
            self._end(tenant)
