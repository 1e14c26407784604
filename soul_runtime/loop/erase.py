"""Forgetting, as the loop sees it: a whole soul, or single memories with its traces and buffer scrubbed.

``forget_soul`` erases the layers' files and the soul's own state (traces, buffer
checkpoint, write intent) and keeps only the sequence number, so the soul is new
but a retried old request can never take a new request's place. ``forget_where``
deletes single memories, redacts every trace and buffer turn that held their
words or came from their source messages, and is itself recorded as a turn of
kind ``forget`` (memory ids only, never the forgotten text).
"""

from __future__ import annotations

from collections.abc import Iterable

from soul_runtime.loop.soul import MEMORY, Soul
from soul_runtime.memory.erasure import Erased, ForgetQuery
from soul_runtime.records import MemoryWrite, Op, Store, TurnResult, TurnTrace
from soul_runtime.steps import Steps, drive

ROUNDS = 3


def forget_soul(soul: Soul, stores: Iterable[str] | None = None) -> dict[str, int]:
    """Erase the soul's memory (these layers, all by default) and its traces and buffer, which hold the words
    every layer was built from."""
    return drive(forget_soul_steps(soul, stores), soul.targets)


def forget_soul_steps(soul: Soul, stores: Iterable[str] | None = None) -> Steps[dict[str, int]]:
    """:func:`forget_soul` as steps (:mod:`soul_runtime.steps`)."""
    yield from soul.wait_steps()  # the last turn's memory work lands first, then everything goes
    gone = yield MEMORY.forget(stores=stores)
    out = {k: int(v) for k, v in gone.items()}
    out["traces"] = soul.state.erase()
    return out


def forget_where(soul: Soul, ids: Iterable[str] | None = None, query: str | None = None, *,
                 request_id: str = "", seq: int | None = None, at: float | None = None) -> TurnResult:
    """Delete single memories by id, or every memory containing the phrase ``query``; ordered and idempotent
    like a turn (``seq``, ``request_id``). The result's writes are the DELETEs."""
    return drive(forget_where_steps(soul, ids, query, request_id=request_id, seq=seq, at=at), soul.targets)


def forget_where_steps(soul: Soul, ids: Iterable[str] | None = None, query: str | None = None, *,
                       request_id: str = "", seq: int | None = None, at: float | None = None
                       ) -> Steps[TurnResult]:
    """:func:`forget_where` as steps (:mod:`soul_runtime.steps`)."""
    q = ForgetQuery.make(ids, query)
    yield from soul.wait_steps()  # the last turn's memory work lands first
    nxt = soul._next_seq(seq, request_id)
    if isinstance(nxt, TurnTrace):
        return soul._result(nxt)
    per_layer: dict[str, Erased] = {}
    total, step = Erased(), q
    for _ in range(ROUNDS):  # then what states the forgotten words or was recorded from the same messages
        found = Erased()
        matched: dict[str, Erased] = yield MEMORY.forget_matching(step)
        for layer, e in matched.items():
            per_layer[layer] = per_layer.get(layer, Erased()) + e
            found = found + e
        if not found.ids:
            break
        total = total + found
        step = q.follow_up(found)
    redacted = soul.state.redact(q.with_texts(total.texts), ids=set(total.ids), sources=set(total.sources))
    writes = tuple(MemoryWrite(Store(layer), Op.DELETE, "[forgotten id]" if q.matches(i) else i, "forget_where")
                   for layer, e in per_layer.items() for i in e.ids)
    trace = TurnTrace(turn_id=f"{soul.soul_id}/{nxt}", seq=nxt, soul_id=soul.soul_id, kind="forget",
                      at=at if at is not None else soul.clock(), query=f"forget_where: {len(writes)} memories",
                      request_id=request_id, persisted=bool(writes),
                      persist_reason=f"{len(writes)} memories deleted; {redacted} traces or buffer turns redacted",
                      writes=writes)
    soul.state.commit(trace, soul.cfg.turn.trace_keep)
    return soul._result(trace)
