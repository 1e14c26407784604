"""The data model: plain frozen dataclasses, msgpack-friendly, no I/O, no clocks.

Times are UTC seconds since the epoch (``float``); see :mod:`soul_runtime.clock`
for converting what callers pass in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Store(str, enum.Enum):
    EPISODIC = "episodic"
    SEMANTIC = "semantic"
    PROCEDURAL = "procedural"


class Op(str, enum.Enum):
    ADD = "ADD"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    NOOP = "NOOP"


LAYERS: tuple[Store, ...] = (Store.EPISODIC, Store.SEMANTIC, Store.PROCEDURAL)


@dataclass(frozen=True)
class Message:
    speaker: str
    text: str
    id: str
    at: float


@dataclass(frozen=True)
class Episode:
    id: str
    at: float
    actor: str
    summary: str
    sources: tuple[str, ...]
    entities: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    session: str = ""
    session_index: int = 0
    promoted: bool = False

    @property
    def text(self) -> str:
        return self.summary


@dataclass(frozen=True)
class FactVersion:
    """An earlier (archived) value of a fact, with where it came from."""

    value: str
    sources: tuple[str, ...]
    valid_from: float
    valid_to: float
    reason: str


@dataclass(frozen=True)
class Fact:
    entity: str
    attribute: str
    value: str
    sources: tuple[str, ...]
    valid_from: float
    confidence: float = 1.0
    status: str = "active"  # active | archived
    history: tuple[FactVersion, ...] = ()
    display_entity: str = ""
    display_attribute: str = ""

    @property
    def key(self) -> str:
        return fact_key(self.entity, self.attribute)

    @property
    def text(self) -> str:
        ent = self.display_entity or self.entity
        att = (self.display_attribute or self.attribute).replace("_", " ")
        return f"{ent} {att}: {self.value}"


def fact_key(entity: str, attribute: str) -> str:
    return f"{entity}:{attribute}"


@dataclass(frozen=True)
class Procedure:
    task_class: str
    version: int
    steps: tuple[str, ...]
    status: str  # candidate | active | retired
    sources: tuple[str, ...]
    created_at: float
    clean_runs: int = 0
    failures: int = 0

    @property
    def id(self) -> str:
        return f"{self.task_class}@v{self.version}"

    @property
    def text(self) -> str:
        steps = "; ".join(f"{i + 1}. {s}" for i, s in enumerate(self.steps))
        return f"procedure '{self.task_class}' v{self.version}: {steps}"


@dataclass(frozen=True)
class MemoryWrite:
    store: Store
    op: Op
    key: str
    reason: str
    payload: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store.value, "op": self.op.value, "key": self.key,
                "reason": self.reason, "payload": self.payload}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryWrite:
        return cls(Store(d["store"]), Op(d["op"]), d["key"], d["reason"], dict(d.get("payload") or {}))


@dataclass(frozen=True)
class RecalledItem:
    store: str
    id: str
    text: str
    score: float
    sources: tuple[str, ...]
    at: float = 0.0
    actor: str = ""
    """Who said it, for an episode (its speaker); empty for a fact, a procedure or a digest."""

    def to_dict(self) -> dict[str, Any]:  # by hand: dataclasses.asdict recurses and copies (a turn has ~60)
        return {"store": self.store, "id": self.id, "text": self.text, "score": self.score,
                "sources": list(self.sources), "at": self.at, "actor": self.actor}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RecalledItem:
        return cls(d["store"], d["id"], d["text"], float(d["score"]), tuple(d["sources"]), float(d.get("at", 0.0)),
                   str(d.get("actor", "")))


# ---- what the extractor hands to the write policies -------------------------

@dataclass(frozen=True)
class FactCandidate:
    entity: str
    attribute: str
    value: str
    kind: str  # stated | confirmed | corrected | retracted
    sources: tuple[str, ...]
    display_entity: str = ""
    display_attribute: str = ""


@dataclass(frozen=True)
class TaskReport:
    task_class: str
    steps: tuple[str, ...] = ()
    outcome: str = ""  # success | failure | "" (unknown / in progress)
    save_requested: bool = False


@dataclass(frozen=True)
class Extraction:
    """What one exchange holds, as the model read it."""

    facts: tuple[FactCandidate, ...] = ()
    episode: str = ""  # 1-2 sentence summary; "" when nothing happened
    event: bool = False  # the extractor marks this exchange as a meaningful event
    entities: tuple[str, ...] = ()
    task: TaskReport | None = None
    tool_call: bool = False
    extra_sources: tuple[str, ...] = ()
    """Other messages the episode summary draws on (e.g. the question an elliptic answer replies to)."""
    detail: str = ""
    """Fuller wording the episode is indexed under (dense and lexical); recall returns the compact ``episode``."""


@dataclass(frozen=True)
class WriteRequest:
    """Everything one layer needs to apply the writes of one exchange."""

    turn_key: str
    now: float
    actor: str
    sources: tuple[str, ...]
    extraction: Extraction
    session: str = ""
    session_index: int = 0
    key_context: str = ""
    """The words the exchange was said in (the message itself, the one it replied to): indexed with the
    episode so recall finds it by what was said, never shown as its text."""
    epoch: int = 0
    """The writer's fencing token (its activation of the soul); a layer refuses an epoch older than one it saw."""
    vector_text: str = ""
    """What the episode's vector is computed from when not its key text: the units of a long message share
    the message's vector (:mod:`soul_runtime.loop.units`)."""


_LEAVES = frozenset({str, int, float, bool, type(None), bytes})


# ---- what a turn returns, and its trace (the same records over Ray, over HTTP and in process) ----------------

@dataclass(frozen=True)
class TurnResult:
    reply: str
    recalled: tuple[RecalledItem, ...]
    writes: tuple[MemoryWrite, ...]
    turn_id: str
    seq: int
    model: str
    offline: bool
    writes_pending: bool = False
    """The reply came back before the memory work (``wait_writes=False``): ``writes`` is empty;
    ``trace(turn_id)`` shows the writes when done."""


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


def to_plain(obj: Any) -> Any:
    """A dataclass tree as plain dicts/lists (msgpack-ready)."""
    if type(obj) in _LEAVES:  # most of a tree (exact types: an enum or a dataclass is never one of these)
        return obj
    if isinstance(obj, enum.Enum):
        return obj.value
    if hasattr(obj, "__dataclass_fields__"):
        return {k: to_plain(getattr(obj, k)) for k in obj.__dataclass_fields__}
    if isinstance(obj, (list, tuple)):
        return [to_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def extraction_from_plain(d: dict[str, Any]) -> Extraction:
    facts = tuple(FactCandidate(**{**f, "sources": tuple(f["sources"])}) for f in d.get("facts", ()))
    task = d.get("task")
    return Extraction(
        facts=facts,
        episode=d.get("episode", ""),
        event=bool(d.get("event", False)),
        entities=tuple(d.get("entities", ())),
        task=TaskReport(task["task_class"], tuple(task["steps"]), task["outcome"], task["save_requested"]) if task else None,
        tool_call=bool(d.get("tool_call", False)),
        extra_sources=tuple(d.get("extra_sources", ())),
        detail=d.get("detail", ""),
    )


def request_from_plain(d: dict[str, Any]) -> WriteRequest:
    """A :class:`WriteRequest` from its :func:`to_plain` form (a write intent, a call to a store actor)."""
    return WriteRequest(turn_key=d["turn_key"], now=float(d["now"]), actor=d["actor"], sources=tuple(d["sources"]),
                        extraction=extraction_from_plain(d["extraction"]), session=d.get("session", ""),
                        session_index=int(d.get("session_index", 0)), key_context=d.get("key_context", ""),
                        epoch=int(d.get("epoch", 0)), vector_text=d.get("vector_text", ""))


@dataclass(frozen=True)
class Digest:
    """A derived memory: its kind (``session`` or ``span``), the sessions it covers, its text, the episodes it
    was written from, the sources of what it quotes, its time span and a fingerprint of its episodes' texts."""

    kind: str
    sessions: tuple[str, ...]
    text: str
    episodes: tuple[str, ...]
    sources: tuple[str, ...]
    first_at: float
    last_at: float
    fingerprint: str
