"""What a tenant may use: its limits and its weight, as the tenant table keeps them (``soul tenants set NAME``;
:class:`soul_apps.service.tenants.TenantTable` writes the table), and :class:`TenantLimits`, the limits in force
read from the table at most every second, for a client process that limits its own turns (:mod:`actors.quotas`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from soul_runtime.errors import InvalidInput

from .tenant_weights import TableReader

LIMIT_NAMES = ("turns_per_s", "in_flight", "souls", "stored_bytes", "tokens_per_day")


@dataclass(frozen=True)
class Limits:
    """What a tenant may use (None: no limit), and its weight in the hosts' fair order (docs/service.md)."""

    turns_per_s: float | None = None
    """Turns (observes, forgets) per second the service accepts; a burst of up to one second's worth."""
    in_flight: int | None = None
    """Turns of the tenant in progress at once."""
    souls: int | None = None
    """Souls: a turn to a soul the tenant does not have yet is refused when it has this many."""
    stored_bytes: int | None = None
    """Bytes of its souls on disk: a turn is refused while they are at or above this."""
    tokens_per_day: int | None = None
    """Model tokens (input and output) per UTC day: a turn is refused once they are used up."""
    weight: float = 1.0
    """The tenant's share of the hosts' threads and of the model's concurrency while tenants wait for them."""

    def __post_init__(self) -> None:
        for name in LIMIT_NAMES:
            v = getattr(self, name)
            if v is None:
                continue
            whole = name != "turns_per_s"
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (whole and v != int(v)) \
                    or not 0 < v <= 1e15:
                raise InvalidInput(f"{name} must be a{' whole' if whole else ''} number > 0 (or unset), got {v!r}")
            object.__setattr__(self, name, int(v) if whole else float(v))
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.01 <= w <= 1000:
            raise InvalidInput(f"weight must be a number in 0.01..1000, got {w!r}")
        object.__setattr__(self, "weight", float(w))

    def to_dict(self) -> dict[str, Any]:
        """The limits that are set, and the weight when it is not 1."""
        out: dict[str, Any] = {n: getattr(self, n) for n in LIMIT_NAMES if getattr(self, n) is not None}
        if self.weight != 1.0:
            out["weight"] = self.weight
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Limits:
        return changed_limits(cls(), d)


NO_LIMITS = Limits()


def changed_limits(limits: Limits, changes: dict[str, Any]) -> Limits:
    """``limits`` with ``changes`` (names of :data:`LIMIT_NAMES` and ``weight``; None unsets one)."""
    unknown = set(changes) - set(LIMIT_NAMES) - {"weight"}
    if unknown:
        raise InvalidInput(f"unknown tenant limits {sorted(unknown)}; known: {', '.join(LIMIT_NAMES)}, weight")
    values: dict[str, Any] = {k: (1.0 if k == "weight" and v is None else v) for k, v in changes.items()}
    return replace(limits, **values)


def limits_of(doc: dict[str, Any], tenant: str) -> Limits:
    """A tenant's limits in force in a tenant table's document: its own, else the defaults' (for each limit and
    the weight)."""
    own = ((doc.get("tenants") or {}).get(tenant) or {}).get("limits") or {}
    return Limits.from_dict({**(doc.get("defaults") or {}), **own})


class TenantLimits:
    """Each tenant's limits in force, read from the tenant table at most every ``every_s`` (none for souls of no
    tenant, and while the table cannot be read: the limits known last)."""

    def __init__(self, data_dir: str | os.PathLike[str], storage: str | None, every_s: float = 1.0) -> None:
        self._table_reader = TableReader(data_dir, storage, every_s)
        self._table: dict[str, Any] = {}
        self._known: dict[str, Limits] = {}

    def __call__(self, tenant: str) -> Limits:
        if not tenant:
            return NO_LIMITS
        doc = self._table_reader.due()
        if doc is not None:
            self._table, self._known = doc, {}
        got = self._known.get(tenant)
        if got is None:
            try:
                got = limits_of(self._table, tenant)
            except (InvalidInput, TypeError, ValueError, AttributeError):  # a table written by hand wrong
                got = NO_LIMITS
            self._known[tenant] = got
        return got
