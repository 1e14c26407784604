"""Turn traces: what was recalled (exactly as passed to the model), decided, written, and how long it took."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from soul_runtime.models.base import USAGE_KEYS, Usage, usage_count
from soul_runtime.records import MemoryWrite, RecalledItem


@dataclass(frozen=True)
class TurnTrace:
    turn_id: str
    seq: int
    soul_id: str
    kind: str  # turn | observe
    at: float
    query: str
    request_id: str = ""
    recalled: tuple[RecalledItem, ...] = ()
    persisted: bool = False
    persist_reason: str = ""
    categories: tuple[str, ...] = ()
    writes: tuple[MemoryWrite, ...] = ()
    tokens: dict[str, int] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)
    model: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    """Model cost: ``calls``, ``input_tokens`` (uncached), ``output_tokens``, ``cache_read_tokens``,
    ``cache_write_tokens`` in all; the same under ``reply`` and ``memory`` (the calls on and after the
    reply path) and under ``by_model`` (per model id)."""
    reply: str = ""
    pending: bool = False
    """The reply has been returned and the memory work (decision, writes) is still running."""
    mended: tuple[str, ...] = ()
    """What the write path changed in the model's extraction so that the stores accept it, and why (one line per
    change, starting with the message or turn it came from; see :mod:`soul_runtime.loop.fit`)."""

    def to_dict(self) -> dict[str, Any]:
        return {"turn_id": self.turn_id, "seq": self.seq, "soul_id": self.soul_id, "kind": self.kind, "at": self.at,
                "query": self.query, "request_id": self.request_id,
                "recalled": [r.to_dict() for r in self.recalled], "persisted": self.persisted,
                "persist_reason": self.persist_reason, "categories": list(self.categories),
                "writes": [w.to_dict() for w in self.writes], "tokens": dict(self.tokens),
                "timings_ms": dict(self.timings_ms), "model": self.model, "usage": dict(self.usage),
                "reply": self.reply, "pending": self.pending, "mended": list(self.mended)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TurnTrace:
        return cls(turn_id=d["turn_id"], seq=int(d["seq"]), soul_id=d["soul_id"], kind=d["kind"], at=float(d["at"]),
                   query=d["query"], request_id=d.get("request_id", ""),
                   recalled=tuple(RecalledItem.from_dict(r) for r in d["recalled"]), persisted=bool(d["persisted"]),
                   persist_reason=d["persist_reason"], categories=tuple(d["categories"]),
                   writes=tuple(MemoryWrite.from_dict(w) for w in d["writes"]), tokens=dict(d["tokens"]),
                   timings_ms=dict(d["timings_ms"]), model=d["model"], usage=dict(d["usage"]),
                   reply=d.get("reply", ""), pending=bool(d.get("pending", False)),
                   mended=tuple(d.get("mended", ())))


def _counts(u: Usage) -> list[Any]:
    """A usage's counts in the order of ``USAGE_KEYS``."""
    return [u.calls, u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens]


def _plain(counts: list[Any]) -> dict[str, int]:
    return dict(zip(USAGE_KEYS, map(int, counts), strict=True))


def usage_report(parts: Iterable[tuple[str, str, Usage]]) -> dict[str, Any]:
    """A trace's ``usage`` from ``(phase, model id, usage)`` of each model call (phase: reply | memory).

    The same as summing the :class:`Usage` of each group and taking ``to_dict()`` of the sums (a turn makes
    two of these reports, without the intermediate objects)."""
    total = [0] * 5
    phases: dict[str, list[Any]] = {"reply": [0] * 5, "memory": [0] * 5}
    models: dict[str, list[Any]] = {}
    for phase, model, u in parts:
        c = _counts(u)
        groups = (total, phases.setdefault(phase, [0] * 5)) + ((models.setdefault(model, [0] * 5),) if model else ())
        for g in groups:
            for i in range(5):
                g[i] = g[i] + c[i]
    return {**_plain(total), **{k: _plain(v) for k, v in phases.items()},
            "by_model": {k: _plain(v) for k, v in models.items()}}


_NONE: dict[str, Any] = {}


def _sum(a: Any, b: Any) -> dict[str, int]:
    """``(Usage.from_dict(a) + Usage.from_dict(b)).to_dict()``, a non-dict counting as no usage."""
    ga = (a if isinstance(a, dict) else _NONE).get
    gb = (b if isinstance(b, dict) else _NONE).get
    return {k: usage_count(ga(k, 0)) + usage_count(gb(k, 0)) for k in USAGE_KEYS}


def add_usage(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two usage reports summed (a soul's running total): totals, phases and models."""
    out: dict[str, Any] = _sum(a, b)
    for phase in ("reply", "memory"):
        out[phase] = _sum(a.get(phase), b.get(phase))
    ma, mb = a.get("by_model") or {}, b.get("by_model") or {}
    out["by_model"] = {m: _sum(ma.get(m), mb.get(m)) for m in sorted({*ma, *mb})}
    return out
