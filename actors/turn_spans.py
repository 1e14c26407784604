"""The OpenTelemetry spans of one call of a soul on its host (a turn, an observe, a forget_where), when traces are on
(:mod:`soul_runtime.telemetry`).

The call is a span (``soul.turn`` …, a child of the caller's context that came with the call) whose children are
its stages:

- measured live, as they run: every model call (``inference`` for the reply, ``decide`` for a memory decision, …,
  with the model ids and token counts of its answer), the memory calls (``recall``, ``write``; under them one span
  per store shard called, made by :class:`actors.shard_client.ShardCalls`), and ``commit`` (from the last call's
  answer to the soul's acknowledgement point: the buffer appended, the trace and state committed);
- placed from the turn trace's measured durations (``timings_ms``), the work done on the host's threads between
  two calls: ``buffer_read`` (ending where the recall began) and ``assemble`` (the context, ending where the reply's
  inference began); the gap between the two is the hand-over to the event loop, well under a millisecond.

The call's span ends when the call answers; a turn answered before its writes (``wait_writes=False``) has its
memory work's spans (decide, write, commit) under it all the same, and the trace's totals on ``commit``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

from soul_runtime import telemetry
from soul_runtime.records import TurnTrace

from .fair_pool import tenant_of

MODEL_SPANS = {"reply": "inference", "decide": "decide", "decide_window": "decide"}
MEMORY_SPANS = {"recall": "recall", "write_many": "write"}


def usage_attributes(usage: Any) -> dict[str, int]:
    """A model answer's :class:`~soul_runtime.models.base.Usage` as span attributes (OpenTelemetry's GenAI names)."""
    if usage is None:
        return {}
    return {"gen_ai.usage.input_tokens": int(getattr(usage, "input_tokens", 0) or 0),
            "gen_ai.usage.output_tokens": int(getattr(usage, "output_tokens", 0) or 0),
            "gen_ai.usage.cache_read.input_tokens": int(getattr(usage, "cache_read_tokens", 0) or 0)}


def trace_attributes(trace: TurnTrace) -> dict[str, Any]:
    """What a committed turn trace adds to its span: ids, token counts of the context, model ids and usage."""
    out: dict[str, Any] = {"soul.id": trace.soul_id, "soul.turn_id": trace.turn_id, "soul.seq": trace.seq,
                           "soul.kind": trace.kind, "soul.model": trace.model, "soul.persisted": trace.persisted,
                           "soul.writes": len(trace.writes), "soul.recalled": len(trace.recalled)}
    for k, v in trace.tokens.items():
        out[f"soul.tokens.{k}"] = int(v)
    usage = trace.usage or {}
    for k in ("calls", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"):
        if k in usage:
            out[f"soul.usage.{k}"] = int(usage[k])
    models = sorted((usage.get("by_model") or {}).keys())
    if models:
        out["gen_ai.request.model"] = models[0]
        out["soul.models"] = models
    return out


class TurnSpans:
    """The spans of one call on its host (see the module's doc). ``carrier``: the caller's context (W3C)."""

    def __init__(self, op: str, soul_id: str, request_id: str, carrier: dict[str, str] | None) -> None:
        self.soul_id, self.request_id = soul_id, request_id
        self.span: Any = telemetry.start(f"soul.{op}", parent=telemetry.context_of(carrier), kind="server",
                                    attributes={"soul.id": soul_id, "soul.op": op, "soul.request_id": request_id,
                                                "soul.tenant": tenant_of(soul_id)})
        self.ctx = telemetry.context_with(self.span)
        self.steps: list[tuple[str, str, int, int]] = []  # (target, method, start ns, end ns), in order
        self.ended = False
        self.seen_commit = False

    def targets(self, model: Any, memory: Any) -> dict[str, Any]:
        """The call's steps' targets, each call to them a span."""
        return {"model": _Traced(self, "model", model), "memory": _Traced(self, "memory", memory)}

    def _first(self, target: str, method: str) -> tuple[int, int] | None:
        return next(((a, b) for t, m, a, b in self.steps if t == target and m == method), None)

    def committed(self, trace: TurnTrace) -> None:
        """The soul committed ``trace`` (its acknowledgement point, on a host thread): the stages placed from its
        timings, and ``commit``."""
        self.seen_commit = True
        now = time.time_ns()
        timings = trace.timings_ms
        for stage, before in (("buffer_read", ("memory", "recall")), ("assemble", ("model", "reply"))):
            nxt = self._first(*before)
            if stage in timings and nxt is not None:
                start = nxt[0] - int(timings[stage] * 1e6)
                telemetry.end(telemetry.start(stage, parent=self.ctx, start_ns=start), end_ns=nxt[0])
        began = max((b for *_, b in self.steps), default=now)
        attrs = trace_attributes(trace)
        telemetry.end(telemetry.start("commit", parent=self.ctx, start_ns=min(began, now), attributes=attrs),
                      end_ns=now)
        if not self.ended:
            self.span.set_attributes(attrs)

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """The call answered (``result``, a TurnResult) or failed."""
        if result is not None:
            self.span.set_attributes({"soul.turn_id": result.turn_id, "soul.seq": result.seq,
                                      "soul.model": result.model, "soul.writes_pending": result.writes_pending})
        self.ended = True
        telemetry.end(self.span, error=error)


class _Traced:
    """A step target whose calls are spans (children of the call's span) and are noted in its list of steps; a
    coroutine method stays one (the steps' driver awaits it on the loop), a plain one plain."""

    def __init__(self, spans: TurnSpans, name: str, obj: Any) -> None:
        self._spans, self._name, self._obj = spans, name, obj

    def __getattr__(self, method: str) -> Any:
        fn = getattr(self._obj, method)
        if not callable(fn):
            return fn
        spans, target = self._spans, self._name
        names = MODEL_SPANS if target == "model" else MEMORY_SPANS
        label = names.get(method, f"{target}.{method}")
        attrs: dict[str, Any] = {}
        if target == "model":
            model_id = getattr(self._obj, "memory_model_id" if method != "reply" else "model_id", "")
            attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": str(model_id or ""),
                     "soul.model_call": method}

        def done(s: Any, answer: Any, t0: int) -> None:
            spans.steps.append((target, method, t0, time.time_ns()))
            if s is not None and target == "model":
                s.set_attributes(usage_attributes(getattr(answer, "usage", None)))
                model = getattr(answer, "model", "")
                if model:
                    s.set_attribute("gen_ai.response.model", str(model))

        if inspect.iscoroutinefunction(fn):
            async def traced_async(*args: Any, **kwargs: Any) -> Any:
                t0 = time.time_ns()
                with telemetry.span(label, parent=spans.ctx, attributes=attrs, start_ns=t0) as s:
                    answer = await fn(*args, **kwargs)
                    done(s, answer, t0)
                    return answer
            return traced_async

        def traced(*args: Any, **kwargs: Any) -> Any:
            t0 = time.time_ns()
            with telemetry.span(label, parent=spans.ctx, attributes=attrs, start_ns=t0) as s:
                answer = fn(*args, **kwargs)
                done(s, answer, t0)
                return answer
        return traced


class Calls:
    """A host's traced calls in progress, by (soul id, request id): a call's commit finds its spans by the trace's
    request id, also when its memory work commits after the call answered (``wait_writes=False``: while the soul's
    next call waits for it)."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, str], TurnSpans] = {}

    def begin(self, op: str, soul_id: str, request_id: str, carrier: dict[str, str] | None) -> TurnSpans:
        """A call's spans; a call of a request already in progress here (asked for again: a straggler of a batch,
        a retry) is a span of its own, and the commit stays the first one's."""
        spans = TurnSpans(op, soul_id, request_id, carrier)
        self.open.setdefault((soul_id, request_id), spans)
        return spans

    def end(self, spans: TurnSpans, result: Any = None, error: BaseException | None = None) -> None:
        """The call answered: its spans are forgotten unless its writes are still to come; so are those of the
        soul's earlier calls that answered before their writes (this call waited for that memory work: it committed
        or failed)."""
        spans.finish(result, error)
        for key in [k for k, v in list(self.open.items()) if k[0] == spans.soul_id and v is not spans and v.ended]:
            self.open.pop(key, None)
        key = (spans.soul_id, spans.request_id)
        if self.open.get(key) is spans and (result is None or not result.writes_pending or spans.seen_commit):
            self.open.pop(key, None)  # else its commit forgets them

    def hook(self, then: Callable[[TurnTrace], None]) -> Callable[[TurnTrace], None]:
        """A soul's commit hook: ``then(trace)``, and the spans of the call that committed told."""
        def committed(trace: TurnTrace) -> None:
            then(trace)
            spans = self.open.get((trace.soul_id, trace.request_id))
            if spans is not None:
                spans.committed(trace)
                if spans.ended:
                    self.open.pop((trace.soul_id, trace.request_id), None)
        return committed
