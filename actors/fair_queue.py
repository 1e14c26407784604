"""Weighted fair order for work waiting on a bounded resource (a host's threads, the model's concurrency).

Start-time fair queueing: each waiting item gets a *start tag* — the later of the queue's virtual time and the
finish tag of its tenant's previous item — and a *finish tag*, its start plus ``1 / weight``. A free slot goes
to the waiting item with the smallest start tag (ties: arrival order); the queue's virtual time becomes that
tag. So a tenant with weight 2 gets twice the slots of a tenant with weight 1 while both wait, a tenant that
floods the queue waits behind its own items only, and a tenant that was idle starts at the present virtual
time (no credit saved up while away). Within a tenant, items keep their arrival order.

**Kept for a tenant's recent use** (``window`` > 0, the model's slots): slots whose holders all finish at once (a
model answering each call in the same time) come free in waves, and a tenant arriving between two waves would
wait for the next one behind a flood that took the whole last wave. So for ``window`` seconds after a tenant last
took a slot, as many slots as it held at once lately — at most its weighted share of the slots among the tenants
seen within the window and the one asking — are kept free for it while it holds fewer; other tenants take the
rest. A tenant that stays away for ``window`` seconds leaves them to the others again.

The policy does no I/O and reads no clock: ``now`` is the caller's. Its operations cost O(log tenants) (a
tenant's items wait in a FIFO, the tenants' first items in a heap by start tag), since a pool hands out a slot
for every step of every turn. :class:`FairQueue` holds the state; :func:`arrive`, :func:`release` and
:func:`leave` change it and return it with the items that start now. :mod:`actors.fair_gate` and
:mod:`actors.fair_pool` move the waiters by it.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Waiting:
    """One item waiting for a slot."""

    ticket: int
    tenant: str
    start: float
    finish: float
    since: float


@dataclass
class Held:
    """A tenant's slots: how many it holds, the most it held at once lately, its weight, and until when slots
    are kept for it."""

    n: int
    peak: int
    weight: float
    until: float


class FairQueue:
    """Slots in use, the items waiting (a FIFO per tenant), the virtual time, each tenant's last finish tag and
    its slots held."""

    def __init__(self, slots: int, window: float = 0.0) -> None:
        self.slots = slots
        self.window = window
        self.used = 0
        self.vtime = 0.0
        self._queues: dict[str, deque[Waiting]] = {}
        self._heads: list[tuple[float, int, str]] = []  # (start, ticket, tenant) of each tenant's first item
        self._last_finish: dict[str, float] = {}
        self._held: dict[str, Held] = {}
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Items waiting for a slot."""
        return self._waiting

    def finish_of(self, tenant: str) -> float:
        return self._last_finish.get(tenant, 0.0)

    def holds(self, tenant: str) -> int:
        h = self._held.get(tenant)
        return h.n if h is not None else 0

    def queued(self, tenant: str) -> int:
        return len(self._queues.get(tenant, ()))

    def kept_for_others(self, tenant: str, weight: float, now: float) -> int:
        """Slots kept free for the other tenants' recent use (see the module's doc): each keeps at most its
        weighted share among the tenants seen within the window and ``tenant`` (of ``weight``), so a flood's own
        recent use never keeps a newcomer out of its share."""
        live = [h for t, h in self._held.items() if h.until >= now and t != tenant]
        total = sum(h.weight for h in live) + weight
        out = 0
        for h in live:
            share = max(1, int(self.slots * h.weight / total))
            out += max(0, min(h.peak, share) - h.n)
        return out

    def may_take(self, tenant: str, weight: float, now: float) -> bool:
        """Whether ``tenant`` may take a slot now: one is free beyond those kept for others (or none is in use)."""
        if self.used >= self.slots:
            return False
        return (self.used == 0 or self.window <= 0
                or self.used + 1 + self.kept_for_others(tenant, weight, now) <= self.slots)

    def _take(self, tenant: str, weight: float, now: float) -> None:
        old = self._held.get(tenant)
        if old is None:
            self._held[tenant] = Held(1, 1, weight, now + self.window)
        else:
            old.peak = max(old.n + 1, old.peak if old.until >= now else 0)
            old.n += 1
            old.weight, old.until = weight, now + self.window
        self.used += 1
        if len(self._held) > 64:  # tenants gone quiet: their records go
            self._held = {t: h for t, h in self._held.items() if h.n > 0 or h.until >= now}

    def _push_head(self, tenant: str) -> None:
        dq = self._queues.get(tenant)
        if dq:
            heapq.heappush(self._heads, (dq[0].start, dq[0].ticket, tenant))
        else:
            self._queues.pop(tenant, None)

    def _dispatch(self, now: float) -> tuple[Waiting, ...]:
        """Free slots to the waiting items in fair order, skipping tenants that may not take one now (taking a
        slot never lets a skipped tenant take one, so each is looked at once)."""
        started: list[Waiting] = []
        skipped: list[tuple[float, int, str]] = []
        while self._heads and self.used < self.slots:
            head = heapq.heappop(self._heads)
            dq = self._queues.get(head[2])
            if not dq or dq[0].ticket != head[1]:
                continue  # that item left meanwhile
            w = dq[0]
            weight = 1.0 / (w.finish - w.start)
            if self.window > 0 and not self.may_take(w.tenant, weight, now):
                skipped.append(head)
                continue
            dq.popleft()
            self._waiting -= 1
            self._push_head(w.tenant)
            self.vtime = max(self.vtime, w.start)
            self._take(w.tenant, weight, now)
            started.append(w)
        for head in skipped:
            heapq.heappush(self._heads, head)
        return tuple(started)

    def _arrive(self, ticket: int, tenant: str, weight: float, now: float) -> tuple[Waiting, ...]:
        if weight <= 0:
            raise ValueError(f"a tenant's weight must be > 0, got {weight!r}")
        start = max(self.vtime, self._last_finish.get(tenant, 0.0))
        item = Waiting(ticket, tenant, start, start + 1.0 / weight, now)
        if len(self._last_finish) > 64:  # tags at or below the virtual time say nothing: such a tenant starts at it
            self._last_finish = {t: f for t, f in self._last_finish.items() if f > self.vtime}
        self._last_finish[tenant] = item.finish
        if not self._waiting and self.used < self.slots and (self.window <= 0 or self.may_take(tenant, weight, now)):
            self.vtime = max(self.vtime, start)  # nothing waits: it takes a slot at once
            self._take(tenant, weight, now)
            return (item,)
        dq = self._queues.get(tenant)
        if dq is None:
            dq = self._queues[tenant] = deque()
        dq.append(item)
        self._waiting += 1
        if len(dq) == 1:
            heapq.heappush(self._heads, (item.start, item.ticket, tenant))
        return self._dispatch(now)

    def _release(self, tenant: str, now: float) -> tuple[Waiting, ...]:
        h = self._held.get(tenant)
        if h is not None:
            h.n = max(0, h.n - 1)
            if h.n == 0 and h.until < now:
                del self._held[tenant]
        self.used = max(0, self.used - 1)
        return self._dispatch(now)

    def _leave(self, ticket: int) -> None:
        for tenant, dq in self._queues.items():
            for i, w in enumerate(dq):
                if w.ticket == ticket:
                    del dq[i]
                    self._waiting -= 1
                    if i == 0:
                        self._push_head(tenant)
                    return


def arrive(q: FairQueue, ticket: int, tenant: str, weight: float, now: float
           ) -> tuple[FairQueue, tuple[Waiting, ...]]:
    """An item of ``tenant`` (``weight`` > 0) asks for a slot: the queue, and the items that start now (this one
    among them when it takes a slot at once)."""
    return q, q._arrive(ticket, tenant, weight, now)


def release(q: FairQueue, tenant: str, now: float) -> tuple[FairQueue, tuple[Waiting, ...]]:
    """``tenant`` gives a slot back: the queue, and the items that take the free slots now (each waited
    ``now - since``)."""
    return q, q._release(tenant, now)


def leave(q: FairQueue, ticket: int) -> FairQueue:
    """A waiting item gives up (its caller was cancelled) before it got a slot."""
    q._leave(ticket)
    return q
