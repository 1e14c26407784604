"""Weighted fair order for work waiting on a bounded resource (a host's turn slots, the model's concurrency).

Start-time fair queueing: each waiting item gets a *start tag* — the later of the queue's virtual time and the
finish tag of its tenant's previous item — and a *finish tag*, its start plus ``1 / weight``. A free slot goes
to the waiting item with the smallest start tag (ties: arrival order); the queue's virtual time becomes that
tag. So a tenant with weight 2 gets twice the slots of a tenant with weight 1 while both wait, a tenant that
floods the queue waits behind its own items only, and a tenant that was idle starts at the present virtual
time (no credit saved up while away). Within a tenant, items keep their arrival order.

The policy is pure: :class:`FairQueue` is a frozen value and every operation returns a new one (``now`` is
the caller's clock, kept for the waits it reports). :class:`actors.fair_gate.FairGate` moves the asyncio
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
class FairQueue:
    """Slots in use, the items waiting (in arrival order), the virtual time, and each tenant's last finish tag."""

    slots: int
    used: int = 0
    waiting: tuple[Waiting, ...] = ()
    vtime: float = 0.0
    last_finish: tuple[tuple[str, float], ...] = ()

    def finish_of(self, tenant: str) -> float:
        return next((f for t, f in self.last_finish if t == tenant), 0.0)

    def queued(self, tenant: str) -> int:
        return sum(1 for w in self.waiting if w.tenant == tenant)


def _with_finish(q: FairQueue, tenant: str, finish: float) -> tuple[tuple[str, float], ...]:
    """The tenants' last finish tags with ``tenant``'s set; tags at or below the virtual time are dropped (such a
    tenant starts at the virtual time anyway), so the table holds only tenants that are ahead of it."""
    kept = tuple((t, f) for t, f in q.last_finish if t != tenant and f > q.vtime)
    return kept + ((tenant, finish),)


def arrive(q: FairQueue, ticket: int, tenant: str, weight: float, now: float) -> tuple[FairQueue, bool]:
    """An item of ``tenant`` (``weight`` > 0) asks for a slot: ``(queue, True)`` when it takes a free one at once
    (nobody waits), else ``(queue, False)`` with the item waiting."""
    if weight <= 0:
        raise ValueError(f"a tenant's weight must be > 0, got {weight!r}")
    start = max(q.vtime, q.finish_of(tenant))
    finish = start + 1.0 / weight
    if q.used < q.slots and not q.waiting:
        return replace(q, used=q.used + 1, vtime=start, last_finish=_with_finish(q, tenant, finish)), True
    item = Waiting(ticket, tenant, start, finish, now)
    return replace(q, waiting=q.waiting + (item,), last_finish=_with_finish(q, tenant, finish)), False


def release(q: FairQueue, now: float) -> tuple[FairQueue, Waiting | None]:
    """A slot is given back: the next item in fair order takes it (returned, with how long it waited as
    ``now - since``), or the slot is free."""
    if not q.waiting:
        return replace(q, used=max(0, q.used - 1)), None
    nxt = min(q.waiting, key=lambda w: (w.start, w.ticket))
    return replace(q, waiting=tuple(w for w in q.waiting if w is not nxt), vtime=max(q.vtime, nxt.start)), nxt


def leave(q: FairQueue, ticket: int) -> FairQueue:
    """A waiting item gives up (its caller was cancelled) before it got a slot."""
    return replace(q, waiting=tuple(w for w in q.waiting if w.ticket != ticket))

