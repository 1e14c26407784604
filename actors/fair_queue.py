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
rest. A tenant that
stays away for ``window`` seconds leaves them to the others again.

The policy is pure: :class:`FairQueue` is a frozen value and every operation returns a new one, with the items
that start now; ``now`` is the caller's clock. :mod:`actors.fair_gate` and :mod:`actors.fair_pool` move the
waiters by it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Waiting:
    """One item waiting for a slot."""

    ticket: int
    tenant: str
    start: float
    finish: float
    since: float


@dataclass(frozen=True)
class Held:
    """A tenant's slots: how many it holds, the most it held at once lately, its weight, and until when slots
    are kept for it."""

    tenant: str
    n: int
    peak: int
    weight: float
    until: float


@dataclass(frozen=True)
class FairQueue:
    """Slots in use, the items waiting (in arrival order), the virtual time, each tenant's last finish tag and
    its slots held."""

    slots: int
    window: float = 0.0
    used: int = 0
    waiting: tuple[Waiting, ...] = ()
    vtime: float = 0.0
    last_finish: tuple[tuple[str, float], ...] = ()
    held: tuple[Held, ...] = ()

    def finish_of(self, tenant: str) -> float:
        return next((f for t, f in self.last_finish if t == tenant), 0.0)

    def holds(self, tenant: str) -> int:
        return next((h.n for h in self.held if h.tenant == tenant), 0)

    def queued(self, tenant: str) -> int:
        return sum(1 for w in self.waiting if w.tenant == tenant)


def _with_finish(q: FairQueue, tenant: str, finish: float) -> tuple[tuple[str, float], ...]:
    """The tenants' last finish tags with ``tenant``'s set; tags at or below the virtual time are dropped (such a
    tenant starts at the virtual time anyway), so the table holds only tenants that are ahead of it."""
    kept = tuple((t, f) for t, f in q.last_finish if t != tenant and f > q.vtime)
    return kept + ((tenant, finish),)


def kept_for_others(q: FairQueue, tenant: str, weight: float, now: float) -> int:
    """Slots kept free for the other tenants' recent use (see the module's doc): each keeps at most its weighted
    share among the tenants seen within the window and ``tenant`` (of ``weight``), so a flood's own recent use
    never keeps a newcomer out of its share."""
    live = [h for h in q.held if h.until >= now and h.tenant != tenant]
    total = sum(h.weight for h in live) + weight
    out = 0
    for h in live:
        share = max(1, int(q.slots * h.weight / total))
        out += max(0, min(h.peak, share) - h.n)
    return out


def may_take(q: FairQueue, tenant: str, weight: float, now: float) -> bool:
    """Whether ``tenant`` may take a slot now: one is free beyond those kept for others (or none is in use)."""
    if q.used >= q.slots:
        return False
    return q.used == 0 or q.window <= 0 or q.used + 1 + kept_for_others(q, tenant, weight, now) <= q.slots


def _take(q: FairQueue, tenant: str, weight: float, now: float) -> FairQueue:
    old = next((h for h in q.held if h.tenant == tenant), None)
    n = (old.n if old else 0) + 1
    peak = max(n, old.peak if old is not None and old.until >= now else 0)
    rest = tuple(h for h in q.held if h.tenant != tenant and (h.n > 0 or h.until >= now))
    return replace(q, used=q.used + 1, held=rest + (Held(tenant, n, peak, weight, now + q.window),))


def _dispatch(q: FairQueue, now: float) -> tuple[FairQueue, tuple[Waiting, ...]]:
    """Free slots to the waiting items in fair order, skipping tenants that may not take one now."""
    started: list[Waiting] = []
    while q.waiting and q.used < q.slots:
        weights = {w.tenant: 1.0 / (w.finish - w.start) for w in q.waiting}
        allowed = {t for t, weight in weights.items() if may_take(q, t, weight, now)}
        if not allowed:
            break
        nxt = min((w for w in q.waiting if w.tenant in allowed), key=lambda w: (w.start, w.ticket))
        weight = 1.0 / (nxt.finish - nxt.start)
        q = _take(replace(q, waiting=tuple(w for w in q.waiting if w is not nxt), vtime=max(q.vtime, nxt.start)),
                  nxt.tenant, weight, now)
        started.append(nxt)
    return q, tuple(started)


def arrive(q: FairQueue, ticket: int, tenant: str, weight: float, now: float
           ) -> tuple[FairQueue, tuple[Waiting, ...]]:
    """An item of ``tenant`` (``weight`` > 0) asks for a slot: the queue, and the items that start now (this one
    among them when it takes a slot at once)."""
    if weight <= 0:
        raise ValueError(f"a tenant's weight must be > 0, got {weight!r}")
    start = max(q.vtime, q.finish_of(tenant))
    item = Waiting(ticket, tenant, start, start + 1.0 / weight, now)
    return _dispatch(replace(q, waiting=q.waiting + (item,), last_finish=_with_finish(q, tenant, item.finish)), now)


def release(q: FairQueue, tenant: str, now: float) -> tuple[FairQueue, tuple[Waiting, ...]]:
    """``tenant`` gives a slot back: the queue, and the items that take the free slots now (each waited
    ``now - since``)."""
    held = tuple(replace(h, n=max(0, h.n - 1)) if h.tenant == tenant else h for h in q.held)
    held = tuple(h for h in held if h.n > 0 or h.until >= now)
    return _dispatch(replace(q, used=max(0, q.used - 1), held=held), now)


def leave(q: FairQueue, ticket: int) -> FairQueue:
    """A waiting item gives up (its caller was cancelled) before it got a slot."""
    return replace(q, waiting=tuple(w for w in q.waiting if w.ticket != ticket))
