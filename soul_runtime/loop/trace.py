"""Turn traces: what was recalled (exactly as passed to the model), decided, written, and how long it took."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    usage: dict[str, int] = field(default_factory=dict)
    reply: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"turn_id": self.turn_id, "seq": self.seq, "soul_id": self.soul_id, "kind": self.kind, "at": self.at,
                "query": self.query, "request_id": self.request_id,
                "recalled": [r.to_dict() for r in self.recalled], "persisted": self.persisted,
                "persist_reason": self.persist_reason, "categories": list(self.categories),
                "writes": [w.to_dict() for w in self.writes], "tokens": dict(self.tokens),
                "timings_ms": dict(self.timings_ms), "model": self.model, "usage": dict(self.usage),
                "reply": self.reply}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TurnTrace:
        return cls(turn_id=d["turn_id"], seq=int(d["seq"]), soul_id=d["soul_id"], kind=d["kind"], at=float(d["at"]),
                   query=d["query"], request_id=d.get("request_id", ""),
                   recalled=tuple(RecalledItem.from_dict(r) for r in d["recalled"]), persisted=bool(d["persisted"]),
                   persist_reason=d["persist_reason"], categories=tuple(d["categories"]),
                   writes=tuple(MemoryWrite.from_dict(w) for w in d["writes"]), tokens=dict(d["tokens"]),
                   timings_ms=dict(d["timings_ms"]), model=d["model"], usage=dict(d["usage"]),
                   reply=d.get("reply", ""))
