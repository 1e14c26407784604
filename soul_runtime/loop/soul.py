"""A soul: persona, short-term buffer, long-term memory, and the turn loop.

``turn``: buffer read → recall (three layers) → context under budget → model reply
→ buffer append → persistence decision (length filter, then model tag) →
extraction → guards → write policies + reconciliation (in the stores) → trace.

A turn is acknowledged when its trace and the buffer checkpoint are committed.
Before its writes go to the stores, the turn's write intent is committed, so a
crash mid-write is completed (idempotently) on the soul's next activation — a
turn is never half-applied and never applied twice.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from soul_runtime.clock import to_timestamp
from soul_runtime.config import SoulConfig
from soul_runtime.errors import InvalidInput, OutOfOrder
from soul_runtime.loop.buffer import BufferTurn
from soul_runtime.loop.context import assemble
from soul_runtime.loop.guards import sanitize
from soul_runtime.loop.soul_state import SoulState
from soul_runtime.loop.trace import TurnTrace
from soul_runtime.models.base import Exchange, LanguageModel, Usage
from soul_runtime.records import (
    Extraction,
    MemoryWrite,
    Message,
    RecalledItem,
    WriteRequest,
    request_from_plain,
    to_plain,
)
from soul_runtime.text import check_id, check_text, estimate_tokens


class MemoryPort(Protocol):
    """What the loop needs from long-term memory (in process: SoulMemory; on Ray: store actors)."""

    def recall(self, query: str, k: int = 10, *, now: Any, stores: Any = None,
               task_class: str | None = None) -> list[RecalledItem]: ...

    def write_many(self, reqs: list[WriteRequest]) -> list[list[MemoryWrite]]: ...


@dataclass(frozen=True)
class TurnResult:
    reply: str
    recalled: tuple[RecalledItem, ...]
    writes: tuple[MemoryWrite, ...]
    turn_id: str
    seq: int
    model: str
    offline: bool


def check_messages(messages: Sequence[Any], default_at: float | None, max_chars: int) -> list[Message]:
    """Validate an observed conversation before anything of it is written."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidInput("messages must be a list of {speaker, text, id} dicts")
    if not messages:
        raise InvalidInput("observe() needs at least one message")
    out, seen = [], set()
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidInput(f"message {i} must be a dict with speaker, text and id")
        missing = {"speaker", "text", "id"} - set(m)
        if missing:
            raise InvalidInput(f"message {i} lacks {', '.join(sorted(missing))}")
        mid = check_id(m["id"], what=f"message {i} id")
        if mid in seen:
            raise InvalidInput(f"message id {mid!r} appears twice")
        seen.add(mid)
        at = m.get("at")
        when = to_timestamp(at) if at is not None else default_at
        if when is None:
            raise InvalidInput(f"message {i} has no time and observe() was given none")
        out.append(Message(speaker=check_text(m["speaker"], what=f"message {i} speaker", max_chars=200),
                           text=check_text(m["text"], what=f"message {i} text", max_chars=max_chars),
                           id=mid, at=when))
    return out


def _known_facts(items: Sequence[RecalledItem]) -> tuple[tuple[str, str, str], ...]:
    out = []
    for it in items:
        if it.store == "semantic" and ":" in it.id and ": " in it.text:
            ent, att = it.id.split(":", 1)
            out.append((ent, att, it.text.split(": ", 1)[1]))
    return tuple(out)


class Soul:
    """One soul. Not thread-safe: exactly one activation runs one turn at a time."""

    def __init__(self, soul_id: str, directory: str | Path, *, memory: MemoryPort, model: LanguageModel,
                 config: SoulConfig | None = None, clock: Callable[[], float] = time.time) -> None:
        self.soul_id = check_id(soul_id, what="soul id")
        self.cfg = config or SoulConfig()
        self.memory = memory
        self.model = model
        self.clock = clock
        self.state = SoulState(Path(directory), self.cfg.turn.context_tokens)
        self.recover()

    def close(self) -> None:
        self.state.close()

    @property
    def last_seq(self) -> int:
        return self.state.last_seq

    # ---- crash recovery ----------------------------------------------------------------
    def recover(self) -> bool:
        """Complete a turn whose writes were in flight when the soul last stopped."""
        intent = self.state.pending_intent()
        if intent is None:
            return False
        reqs = [request_from_plain(r) for r in intent["requests"]]
        writes = self.memory.write_many(reqs) if reqs else []
        trace = TurnTrace.from_dict(intent["trace"])
        trace = replace(trace, writes=tuple(w for ws in writes for w in ws))
        for t in intent["buffer"]:
            self._append(BufferTurn(*t), intent["session"])
        self.state.commit(trace, self.cfg.turn.trace_keep)
        return True

    def _append(self, t: BufferTurn, session: str) -> None:
        if self.state.buffer.session != session:
            self.state.buffer.start_session(session)
        self.state.buffer.append(t)

    def _next_seq(self, seq: int | None, request_id: str) -> int | TurnTrace:
        if not isinstance(request_id, str) or len(request_id) > 200:
            raise InvalidInput(f"request_id must be a string of at most 200 characters, got {request_id!r}")
        if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or seq < 1):
            raise InvalidInput(f"seq must be an int >= 1, got {seq!r}")
        done = self.state.by_request(request_id)
        if done is not None:
            return done
        if seq is None:
            return self.state.last_seq + 1
        if seq != self.state.last_seq + 1:
            raise OutOfOrder(f"soul {self.soul_id}: turn {seq} arrived, expected {self.state.last_seq + 1}",
                             self.state.last_seq + 1)
        return seq

    def _session_for(self, at: float, session: str | None, seq: int) -> str:
        if session is not None:
            return check_id(session, what="session")
        buf = self.state.buffer
        gap = self.cfg.turn.session_gap_minutes * 60
        if not buf.session or (self.state.last_at and at - self.state.last_at > gap):
            return f"s{seq}"
        return buf.session

    # ---- the turn loop -----------------------------------------------------------------
    def turn(self, text: str, *, user: str | None = None, at: Any = None, request_id: str = "",
             seq: int | None = None) -> TurnResult:
        tc = self.cfg.turn
        text = check_text(text, what="turn text", max_chars=tc.max_text_chars)
        user = check_id(user, what="user") if user is not None else "user"
        now = to_timestamp(at) if at is not None else self.clock()
        if estimate_tokens(self.cfg.persona) + estimate_tokens(text) + tc.reply_tokens + 4 > tc.context_tokens:
            raise InvalidInput(f"turn text does not fit the context budget of {tc.context_tokens} tokens")
        nxt = self._next_seq(seq, request_id)
        if isinstance(nxt, TurnTrace):
            return self._result(nxt)
        seq = nxt
        turn_id = f"{self.soul_id}/{seq}"
        timings: dict[str, float] = {}
        clock = time.perf_counter

        t0 = clock()
        session = self._session_for(now, None, seq)
        buffer = copy.deepcopy(self.state.buffer)
        if buffer.session != session:
            buffer.start_session(session)
        timings["buffer_read"] = (clock() - t0) * 1000

        t0 = clock()
        recalled = self.memory.recall(text, tc.recall_k, now=now)
        timings["recall"] = (clock() - t0) * 1000

        t0 = clock()
        ctx = assemble(persona=self.cfg.persona, recalled=recalled, buffer=buffer, user_text=text, user=user, cfg=tc)
        timings["assemble"] = (clock() - t0) * 1000

        t0 = clock()
        answer = self.model.reply(ctx.request)
        timings["inference"] = (clock() - t0) * 1000
        usage = answer.usage

        ids = (f"{turn_id}/user",)
        new_turns = [BufferTurn("user", user, text, ids[0], now), BufferTurn("assistant", "soul", answer.text,
                                                                             f"{turn_id}/soul", now)]
        exchange = Exchange(user_text=text, reply_text=answer.text, speaker=user, message_ids=ids, at=now,
                            persona=self.cfg.persona, recalled=tuple(it.text for it in ctx.used),
                            history=buffer.chat(buffer.turns[-tc.history_for_extraction:]),
                            known_facts=_known_facts(ctx.used))
        persisted, reason, cats, extraction, usage2 = self._decide(exchange, timings)
        usage = usage + usage2
        reqs = [WriteRequest(turn_key=turn_id, now=now, actor=user, sources=ids, extraction=extraction,
                             session=session, key_context=text)] if persisted else []
        trace = TurnTrace(turn_id=turn_id, seq=seq, soul_id=self.soul_id, kind="turn", at=now, query=text,
                          request_id=request_id, recalled=ctx.used, persisted=persisted, persist_reason=reason,
                          categories=cats, tokens=ctx.tokens, timings_ms=timings, model=self.model.label,
                          usage={"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                                 "calls": usage.calls}, reply=answer.text)
        trace = self._apply(trace, reqs, new_turns, session, timings)
        return self._result(trace)

    def _decide(self, exchange: Exchange, timings: dict[str, float]
                ) -> tuple[bool, str, tuple[str, ...], Extraction, Usage]:
        clock = time.perf_counter
        t0 = clock()
        usage = Usage()
        if len(exchange.user_text.strip()) < self.cfg.turn.min_persist_chars:
            timings["persist_decision"] = (clock() - t0) * 1000
            return False, f"shorter than {self.cfg.turn.min_persist_chars} characters", (), Extraction(), usage
        tag = self.model.tag(exchange)
        usage = usage + tag.usage
        timings["persist_decision"] = (clock() - t0) * 1000
        if not tag.persist:
            return False, tag.reason or "nothing worth keeping", tag.categories, Extraction(), usage
        t0 = clock()
        res = self.model.extract(exchange)
        usage = usage + res.usage
        clean, dropped = sanitize(res.extraction, exchange)
        timings["extract"] = (clock() - t0) * 1000
        reason = tag.reason or "holds " + ", ".join(tag.categories)
        if dropped:
            reason += "; guard: " + "; ".join(dropped)
        return True, reason, tag.categories, clean, usage

    def _apply(self, trace: TurnTrace, reqs: list[WriteRequest], new_turns: list[BufferTurn], session: str,
               timings: dict[str, float]) -> TurnTrace:
        t0 = time.perf_counter()
        intent = {"trace": trace.to_dict(), "requests": [to_plain(r) for r in reqs],
                  "buffer": [[t.role, t.speaker, t.text, t.id, t.at] for t in new_turns], "session": session}
        if reqs:
            self.state.save_intent(intent)
        writes = self.memory.write_many(reqs) if reqs else []
        timings["write"] = (time.perf_counter() - t0) * 1000
        trace = replace(trace, writes=tuple(w for ws in writes for w in ws), timings_ms=dict(timings))
        for t in new_turns:
            self._append(t, session)
        self.state.commit(trace, self.cfg.turn.trace_keep)  # the acknowledgement point (not timed in the trace)
        return trace

    @staticmethod
    def _result(trace: TurnTrace) -> TurnResult:
        return TurnResult(reply=trace.reply, recalled=trace.recalled, writes=trace.writes, turn_id=trace.turn_id,
                          seq=trace.seq, model=trace.model, offline="(offline)" in trace.model)

    # ---- observing a conversation between others ------------------------------------------
    def observe(self, messages: Sequence[Any], *, at: Any = None, session: str | None = None,
                request_id: str = "", seq: int | None = None) -> TurnResult:
        """Ingest messages between other parties through the same write path, without a reply."""
        tc = self.cfg.turn
        default_at = to_timestamp(at) if at is not None else None
        msgs = check_messages(messages, default_at if default_at is not None else self.clock(), tc.max_text_chars)
        nxt = self._next_seq(seq, request_id)
        if isinstance(nxt, TurnTrace):
            return self._result(nxt)
        seq = nxt
        turn_id = f"{self.soul_id}/{seq}"
        now = max((m.at for m in msgs), default=default_at or self.clock())
        sess = self._session_for(msgs[0].at if msgs else now, session, seq)
        buffer = copy.deepcopy(self.state.buffer)
        if buffer.session != sess:
            buffer.start_session(sess)
        timings: dict[str, float] = {}
        reqs, reasons, usage = [], [], Usage()
        new_turns = []
        for m in msgs:
            history = buffer.chat(buffer.turns[-tc.history_for_extraction:])
            ex = Exchange(user_text=m.text, reply_text="", speaker=m.speaker, message_ids=(m.id,), at=m.at,
                          persona=self.cfg.persona, history=history)
            persisted, reason, _, extraction, u = self._decide(ex, timings)
            usage = usage + u
            reasons.append(f"{m.id}: {reason}")
            if persisted:
                prev = buffer.turns[-1] if buffer.turns else None
                said = m.text if prev is None or prev.speaker == m.speaker else f"{m.text} (replying to: {prev.text[:300]})"
                reqs.append(WriteRequest(turn_key=f"obs:{m.id}", now=m.at, actor=m.speaker, sources=(m.id,),
                                         extraction=extraction, session=sess, key_context=said))
            bt = BufferTurn("user", m.speaker, m.text, m.id, m.at)
            buffer.append(bt)
            new_turns.append(bt)
        trace = TurnTrace(turn_id=turn_id, seq=seq, soul_id=self.soul_id, kind="observe", at=now,
                          query=f"observe {len(msgs)} messages", request_id=request_id, persisted=bool(reqs),
                          persist_reason=" | ".join(reasons)[:4000], timings_ms=timings, model=self.model.label,
                          usage={"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                                 "calls": usage.calls})
        trace = self._apply(trace, reqs, new_turns, sess, timings)
        return self._result(trace)

    # ---- reading traces ------------------------------------------------------------------
    def trace(self, turn_id: str) -> TurnTrace:
        return self.state.trace(turn_id)

    def traces(self, last: int = 10) -> list[TurnTrace]:
        if not isinstance(last, int) or isinstance(last, bool) or not 1 <= last <= 1_000_000:
            raise InvalidInput(f"last must be an int in 1..1000000, got {last!r}")
        return self.state.last(last)
