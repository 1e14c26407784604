"""A soul: persona, short-term buffer, long-term memory, and the turn loop.

``turn``: buffer read → recall (three layers) → context under budget → **model reply** (the only
model call before the reply is returned) → write intent → then the memory work: persistence
decision (length filter, then one model call that decides and extracts, see
:mod:`soul_runtime.loop.decide`) → guards → write policies + reconciliation (in the stores) →
buffer append → trace.

Each call is written once, as steps (:mod:`soul_runtime.steps`): ``turn_steps``, ``observe_steps``,
``recover_steps``, ``wait_steps``. The blocking methods (``turn``, ``observe``...) drive them on the caller's
thread; a soul host drives the same steps on its event loop, so a turn that waits for its model or its stores
holds no thread.

A turn is acknowledged when its trace and the buffer checkpoint are committed. With
``wait_writes=False`` the reply is returned before that, and the memory work runs beside the
caller (a thread, or a task on a host's loop); the soul's next call waits for it, so the next turn always
reads the previous turn's writes. The turn's intent is committed before the reply is returned (holding
the exchange) and again before the writes (holding the write requests), so a crash anywhere
after the reply is completed (idempotently) on the soul's next activation — a turn is never
half-applied and never applied twice. A failed memory call (429/529 after retries) never fails
the reply: the trace says nothing was written and why.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, cast

from soul_runtime.clock import to_timestamp
from soul_runtime.config import SoulConfig
from soul_runtime.errors import InvalidInput, ModelError, OutOfOrder, StorageError
from soul_runtime.loop.buffer import BufferTurn
from soul_runtime.loop.context import assemble
from soul_runtime.loop.decide import (
    Decided,
    decide_exchange,
    decide_observed,
    exchange_from_plain,
    exchange_to_plain,
    windows,
)
from soul_runtime.loop.fit import fit_request
from soul_runtime.loop.rerank import model_reordered, model_request
from soul_runtime.loop.soul_state import SoulState
from soul_runtime.loop.trace import usage_report
from soul_runtime.loop.units import message_requests
from soul_runtime.memory.erasure import Erased, ForgetQuery
from soul_runtime.models.base import MODEL, AsyncLanguageModel, Exchange, LanguageModel, Usage
from soul_runtime.records import (
    MemoryWrite,
    Message,
    RecalledItem,
    TurnResult,
    TurnTrace,
    WriteRequest,
    request_from_plain,
    to_plain,
)
from soul_runtime.steps import Join, Spawn, Steps, Target, Work, drive
from soul_runtime.text import check_id, check_text, estimate_tokens


class MemoryPort(Protocol):
    """What the loop needs from long-term memory (in process: SoulMemory; on Ray: store actors, whose
    ``recall`` and ``write_many`` are coroutines a host awaits)."""

    def recall(self, query: str, k: int = 10, at: Any = None, stores: Any = None, *,
               task_class: str | None = None) -> list[RecalledItem]: ...

    def write_many(self, reqs: list[WriteRequest]) -> list[list[MemoryWrite]]: ...

    def embed_ahead(self, reqs: list[WriteRequest]) -> None:
        """A hint that ``reqs`` will be written soon (a memory that embeds elsewhere may ignore it)."""

    def forget(self, stores: Iterable[str] | None = None) -> dict[str, int]: ...

    def forget_matching(self, q: ForgetQuery) -> dict[str, Erased]: ...


MEMORY = cast(MemoryPort, Target("memory"))
"""The memory a soul's steps call (``yield MEMORY.recall(...)``): the step ``Call("memory", "recall", ...)``, which
its driver performs on the soul's memory (see :mod:`soul_runtime.steps`)."""


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


class _Pending:
    """Memory work of a turn whose reply has been returned (``wait_writes=False``)."""

    def __init__(self, trace: TurnTrace, work: Work) -> None:
        self.trace = trace
        self.work = work


class Soul:
    """One soul and its turn orchestrator: a turn reads the short-term buffer and long-term memory before its
    inference, and writes after it, in that order, numbered by the soul. One caller at a time (a host's
    per-soul lock); the memory work of a turn may run beside the caller, which the next call waits for
    (:meth:`wait_memory_work`).

    ``recover=False``: the caller completes an interrupted turn itself (``recover_steps``) before the first
    call (a host does, on its loop)."""

    def __init__(self, soul_id: str, directory: str | Path, *, memory: MemoryPort | Any,
                 model: LanguageModel | AsyncLanguageModel,
                 config: SoulConfig | None = None, clock: Callable[[], float] = time.time,
                 on_commit: Callable[[TurnTrace], None] | None = None, recover: bool = True) -> None:
        self.soul_id = check_id(soul_id, what="soul id")
        self.cfg = config or SoulConfig()
        self.memory = memory
        self.model = model
        self.targets = {"model": model, "memory": memory}
        """What the steps' calls go to (:mod:`soul_runtime.steps`)."""
        self.clock = clock
        self.on_commit = on_commit
        self.state = SoulState(Path(directory), self.cfg.turn.context_tokens)
        self._pending: _Pending | None = None
        self._unfinished = False  # background memory work failed: its intent waits on disk
        try:
            self._take_over()
            if recover:
                self.recover()
        except BaseException:  # e.g. StaleOwner: an even newer activation took over meanwhile
            self.state.close()
            raise

    def _take_over(self) -> None:
        """Claim the soul with a new fencing epoch and fence its layers: an older activation still alive
        (paused, partitioned, replaced) now fails with StaleOwner instead of writing."""
        epoch = self.state.claim()
        fence = getattr(self.memory, "fence", None)
        if fence is not None:
            fence(epoch)

    def memory_bytes(self) -> int:
        """What this open soul holds in memory (its host evicts by bytes as well as by count)."""
        return self.state.memory_bytes()

    def close(self) -> None:
        p = self._pending
        if p is not None:
            p.work.join()  # a failure leaves the intent on disk for the next activation
        self._pending = None
        self.state.close()

    @property
    def last_seq(self) -> int:
        """The last accepted turn (its memory work may still be running)."""
        p = self._pending
        return max(self.state.last_seq, p.trace.seq if p is not None else 0)

    @property
    def busy(self) -> bool:
        """The memory work of the last turn is still running."""
        p = self._pending
        return p is not None and p.work.running

    def wait_memory_work(self) -> None:
        """Wait for the memory work of the last turn; complete it from its intent if it failed."""
        drive(self.wait_steps(), self.targets)

    def wait_steps(self) -> Steps[None]:
        """:meth:`wait_memory_work` as steps."""
        p = self._pending
        if p is not None:
            if p.work.running:  # done already (the usual case): no step to wait for it
                yield Join(p.work)
            self._pending = None
            if p.work.error is not None:
                self._unfinished = True
        if self._unfinished:
            yield from self.recover_steps()  # raises while it still cannot complete; the intent stays on disk
            self._unfinished = False

    # ---- crash recovery ----------------------------------------------------------------
    def recover(self) -> bool:
        """Complete a turn whose memory work was in flight when the soul last stopped.

        An intent saved at the reply holds the exchange (the decision is made now); one saved
        after the decision holds the write requests."""
        return drive(self.recover_steps(), self.targets)

    def recover_steps(self) -> Steps[bool]:
        """:meth:`recover` as steps."""
        intent = self.state.pending_intent()
        if intent is None:
            return False
        trace = TurnTrace.from_dict(intent["trace"])
        if intent.get("requests") is None:
            timings = dict(trace.timings_ms)
            exchange = exchange_from_plain(intent["exchange"])
            trace, reqs = yield from self._decided(trace, exchange, intent["session"], timings)
        else:
            reqs = [request_from_plain(r) for r in intent["requests"]]
        reqs = [replace(r, epoch=self.state.epoch) for r in reqs]  # completed under this owner's epoch
        writes = (yield MEMORY.write_many(reqs)) if reqs else []
        trace = replace(trace, writes=tuple(w for ws in writes for w in ws), pending=False)
        for t in intent["buffer"]:
            self._append(BufferTurn(*t), intent["session"])
        self._commit(trace)
        return True

    def _commit(self, trace: TurnTrace) -> None:
        self.state.commit(trace, self.cfg.turn.trace_keep)  # the acknowledgement point
        if self.on_commit is not None:
            self.on_commit(trace)

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

    def begin_steps(self, seq: int | None, request_id: str) -> Steps[tuple[int, str] | TurnResult]:
        """A call's start under the soul's order: the last turn's memory work lands first; then its number and
        turn id, or the recorded result of a request already applied."""
        yield from self.wait_steps()
        nxt = self._next_seq(seq, request_id)
        if isinstance(nxt, TurnTrace):
            return self._result(nxt)
        return nxt, f"{self.soul_id}/{nxt}"

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
             seq: int | None = None, wait_writes: bool = True) -> TurnResult:
        """Reply after one model call; then the memory work (decision, guards, writes) under the soul's order.

        ``wait_writes=True``: return when the writes are applied (``result.writes`` complete).
        ``wait_writes=False``: return the reply at once (``result.writes_pending``); the memory work runs
        beside the caller, :meth:`trace` shows it when done, and the next call waits for it."""
        return drive(self.turn_steps(text, user=user, at=at, request_id=request_id, seq=seq,
                                     wait_writes=wait_writes), self.targets)

    def turn_steps(self, text: str, *, user: str | None = None, at: Any = None, request_id: str = "",
                   seq: int | None = None, wait_writes: bool = True) -> Steps[TurnResult]:
        """:meth:`turn` as steps."""
        tc = self.cfg.turn
        text = check_text(text, what="turn text", max_chars=tc.max_text_chars)
        user = check_id(user, what="user") if user is not None else "user"
        now = to_timestamp(at) if at is not None else self.clock()
        if estimate_tokens(self.cfg.persona) + estimate_tokens(text) + tc.reply_tokens + 4 > tc.context_tokens:
            raise InvalidInput(f"turn text does not fit the context budget of {tc.context_tokens} tokens")
        if not isinstance(wait_writes, bool):
            raise InvalidInput(f"wait_writes must be True or False, got {wait_writes!r}")
        begun = yield from self.begin_steps(seq, request_id)
        if isinstance(begun, TurnResult):
            return begun
        seq, turn_id = begun
        timings: dict[str, float] = {}
        clock = time.perf_counter

        t0 = clock()
        session = self._session_for(now, None, seq)
        buffer = self.state.buffer.copy()
        if buffer.session != session:
            buffer.start_session(session)
        timings["buffer_read"] = (clock() - t0) * 1000

        t0 = clock()
        recalled = yield MEMORY.recall(text, tc.recall_k, at=now)
        timings["recall"] = (clock() - t0) * 1000
        reread: list[tuple[str, str, Usage]] = []
        if tc.model_rerank and len(recalled) > 1:  # a configured model re-orders the candidates: one bounded call
            t0 = clock()
            try:
                got = yield MODEL.reply(model_request(recalled, text))
                recalled = model_reordered(recalled, got.text)
                reread.append(("rerank", got.model or self.model.model_id, got.usage))
            except ModelError:
                pass  # the candidates keep recall's order: the turn goes on
            timings["rerank"] = (clock() - t0) * 1000

        t0 = clock()
        ctx = assemble(persona=self.cfg.persona, recalled=recalled, buffer=buffer, user_text=text, user=user, cfg=tc,
                       now=now)
        timings["assemble"] = (clock() - t0) * 1000

        t0 = clock()
        answer = yield MODEL.reply(ctx.request)
        timings["inference"] = (clock() - t0) * 1000

        ids = (f"{turn_id}/user",)
        new_turns = [BufferTurn("user", user, text, ids[0], now), BufferTurn("assistant", "soul", answer.text,
                                                                             f"{turn_id}/soul", now)]
        exchange = Exchange(user_text=text, reply_text=answer.text, speaker=user, message_ids=ids, at=now,
                            persona=self.cfg.persona, recalled=tuple(it.text for it in ctx.used),
                            history=buffer.chat(buffer.turns[-tc.history_for_extraction:]),
                            known_facts=_known_facts(ctx.used))
        usage = usage_report([*reread, ("reply", answer.model or self.model.model_id, answer.usage)])
        trace = TurnTrace(turn_id=turn_id, seq=seq, soul_id=self.soul_id, kind="turn", at=now, query=text,
                          request_id=request_id, recalled=ctx.used, persist_reason="memory work in progress",
                          tokens=ctx.tokens, timings_ms=timings, model=self.model.label, usage=usage,
                          reply=answer.text, pending=True)
        intent = {"trace": trace.to_dict(), "exchange": exchange_to_plain(exchange), "requests": None,
                  "buffer": [[t.role, t.speaker, t.text, t.id, t.at] for t in new_turns], "session": session}
        if wait_writes:
            # nothing is returned before the commit, so a crash before the writes' own intent (saved before
            # any store is touched) leaves nothing acknowledged and nothing written: the turn can simply run
            # again; no intent (and no fsync) is needed at the reply
            try:
                return self._result((yield from self._memory_work(trace, exchange, intent)))
            except StorageError:
                self._unfinished = True  # an intent it saved is completed by the next call (settle)
                raise
        t0 = clock()
        self.state.save_intent(intent)  # the reply is returned now: a crash from here on is completed by recover()
        timings["intent"] = (clock() - t0) * 1000
        # a failure is kept in the work for wait_memory_work(); the intent stays on disk
        work = yield Spawn(self._memory_work(trace, exchange, intent), name=f"memory-{turn_id}")
        self._pending = _Pending(trace, work)
        return replace(self._result(trace), writes_pending=True)

    def _decided(self, trace: TurnTrace, exchange: Exchange, session: str, timings: dict[str, float]
                 ) -> Steps[tuple[TurnTrace, list[WriteRequest]]]:
        """The memory decision of a turn; a failed model call keeps the reply and writes nothing."""
        try:
            d = yield from decide_exchange(self.model, exchange, self.cfg.turn, timings)
        except ModelError as e:
            d = Decided(False, f"memory decision failed, nothing written: {e}")
        parts = [(p, m, Usage.from_dict(v)) for p in ("reply",) for m, v in (trace.usage.get("by_model") or {}).items()]
        parts += [("memory", m, u) for m, u in d.usage]
        reqs: list[WriteRequest] = []
        mended: list[str] = []
        if d.persisted:
            req, mended = fit_request(WriteRequest(turn_key=trace.turn_id, now=trace.at, actor=exchange.speaker,
                                                   sources=exchange.message_ids, extraction=d.extraction,
                                                   session=session, key_context=exchange.user_text),
                                      exchange.message_ids[0] if exchange.message_ids else trace.turn_id)
            reqs += message_requests(req, exchange.user_text)
        return replace(trace, persisted=d.persisted, persist_reason=d.reason, categories=d.categories,
                       usage=usage_report(parts), timings_ms=dict(timings), mended=tuple(mended)), reqs

    def _memory_work(self, trace: TurnTrace, exchange: Exchange, intent: dict[str, Any]) -> Steps[TurnTrace]:
        timings = dict(trace.timings_ms)
        trace, reqs = yield from self._decided(trace, exchange, intent["session"], timings)
        if reqs:
            self.state.save_intent({**intent, "trace": trace.to_dict(), "requests": [to_plain(r) for r in reqs]})
        return (yield from self._apply(trace, reqs, [BufferTurn(*t) for t in intent["buffer"]], intent["session"],
                                       timings))

    def _apply(self, trace: TurnTrace, reqs: list[WriteRequest], new_turns: list[BufferTurn], session: str,
               timings: dict[str, float]) -> Steps[TurnTrace]:
        reqs = [replace(r, epoch=self.state.epoch) for r in reqs]
        t0 = time.perf_counter()
        writes = (yield MEMORY.write_many(reqs)) if reqs else []
        timings["write"] = (time.perf_counter() - t0) * 1000
        trace = replace(trace, writes=tuple(w for ws in writes for w in ws), timings_ms=dict(timings), pending=False)
        buffer = self.state.buffer.copy()
        try:
            for t in new_turns:
                self._append(t, session)
            self._commit(trace)
        except BaseException:
            self.state.buffer = buffer  # not acknowledged: the buffer holds what was committed
            raise
        return trace

    @staticmethod
    def _result(trace: TurnTrace) -> TurnResult:
        return TurnResult(reply=trace.reply, recalled=trace.recalled, writes=trace.writes, turn_id=trace.turn_id,
                          seq=trace.seq, model=trace.model, offline="(offline)" in trace.model,
                          writes_pending=trace.pending)

    # ---- observing a conversation between others ------------------------------------------
    def observe(self, messages: Sequence[Any], *, at: Any = None, session: str | None = None,
                request_id: str = "", seq: int | None = None) -> TurnResult:
        """Ingest messages between other parties through the same write path, without a reply.

        The messages are judged in windows (``observe_window``): one model call per window,
        one decision per message, each message's memories sourced to it."""
        return drive(self.observe_steps(messages, at=at, session=session, request_id=request_id, seq=seq),
                     self.targets)

    def observe_steps(self, messages: Sequence[Any], *, at: Any = None, session: str | None = None,
                      request_id: str = "", seq: int | None = None) -> Steps[TurnResult]:
        """:meth:`observe` as steps."""
        tc = self.cfg.turn
        default_at = to_timestamp(at) if at is not None else None
        msgs = check_messages(messages, default_at if default_at is not None else self.clock(), tc.max_text_chars)
        begun = yield from self.begin_steps(seq, request_id)
        if isinstance(begun, TurnResult):
            return begun
        seq, turn_id = begun
        now = max((m.at for m in msgs), default=default_at or self.clock())
        sess = self._session_for(msgs[0].at if msgs else now, session, seq)
        buffer = self.state.buffer.copy()
        if buffer.session != sess:
            buffer.start_session(sess)
        timings: dict[str, float] = {}
        reqs: list[WriteRequest] = []
        reasons: list[str] = []
        mended: list[str] = []
        used: list[tuple[str, str, Usage]] = []
        new_turns = []
        for window in windows(msgs, tc):
            earlier = buffer.chat(buffer.turns[-tc.history_for_extraction:])
            decided, u = yield from decide_observed(self.model, window, earlier, self.cfg.persona, tc, timings)
            used += [("memory", m, x) for m, x in u]
            ahead = len(reqs)
            for m, d in zip(window, decided, strict=True):
                reasons.append(f"{m.id}: {d.reason}")
                if d.persisted:
                    prev = buffer.turns[-1] if buffer.turns else None
                    said = (m.text if prev is None or prev.speaker == m.speaker
                            else f"{m.text} (replying to: {prev.text[:300]})")
                    req, notes = fit_request(WriteRequest(turn_key=f"obs:{m.id}", now=m.at, actor=m.speaker,
                                                          sources=(m.id,), extraction=d.extraction, session=sess,
                                                          key_context=said), m.id)
                    reqs += message_requests(req, m.text)
                    mended += notes
                bt = BufferTurn("user", m.speaker, m.text, m.id, m.at)
                buffer.append(bt)
                new_turns.append(bt)
            if len(reqs) > ahead:  # their vectors are computed while the next window is read
                yield MEMORY.embed_ahead(reqs[ahead:])  # type: ignore[func-returns-value]  # the step, not None
        trace = TurnTrace(turn_id=turn_id, seq=seq, soul_id=self.soul_id, kind="observe", at=now,
                          query=f"observe {len(msgs)} messages, {sum(len(m.text) for m in msgs)} characters",
                          request_id=request_id, persisted=bool(reqs),
                          persist_reason=" | ".join(reasons)[:4000], timings_ms=timings, model=self.model.label,
                          usage=usage_report(used), mended=tuple(mended))
        try:
            if reqs:
                self.state.save_intent({"trace": trace.to_dict(), "requests": [to_plain(r) for r in reqs],
                                        "buffer": [[t.role, t.speaker, t.text, t.id, t.at] for t in new_turns],
                                        "session": sess})
            trace = yield from self._apply(trace, reqs, new_turns, sess, timings)
        except StorageError:
            self._unfinished = True  # an intent it saved is completed by the next call (settle)
            raise
        return self._result(trace)

    # ---- reading traces ------------------------------------------------------------------
    def trace(self, turn_id: str) -> TurnTrace:
        """A turn's trace; while its memory work runs, the provisional one (``pending=True``)."""
        p = self._pending
        if p is not None and p.trace.turn_id == turn_id and p.work.running:
            return p.trace
        return self.state.trace(turn_id)

    def traces(self, last: int = 10) -> list[TurnTrace]:
        if not isinstance(last, int) or isinstance(last, bool) or not 1 <= last <= 1_000_000:
            raise InvalidInput(f"last must be an int in 1..1000000, got {last!r}")
        out = self.state.last(last)
        p = self._pending
        if p is not None and p.work.running and all(
                t.seq != p.trace.seq for t in out):
            out = (out + [p.trace])[-last:]
        return out
