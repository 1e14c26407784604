"""The memory work after a reply: the cheap length filter, one model decision, the guards.

``decide_exchange`` judges one exchange of a turn; ``decide_observed`` judges the messages of an
``observe`` batch in windows (one model call per window, a decision per message). Both are steps of the turn
loop (:mod:`soul_runtime.steps`: the model calls are yielded) and return what the write path needs and
the model usage for the trace.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from soul_runtime.config import TurnConfig
from soul_runtime.loop.fit import clip
from soul_runtime.loop.guards import sanitize
from soul_runtime.models.base import (
    MODEL,
    ChatMessage,
    Exchange,
    LanguageModel,
    ModelIdentity,
    ObservedMessage,
    ObserveWindow,
    Usage,
    window_by_message,
)
from soul_runtime.records import Extraction, Message
from soul_runtime.steps import Steps
from soul_runtime.text import estimate_tokens


@dataclass(frozen=True)
class Decided:
    persisted: bool
    reason: str
    categories: tuple[str, ...] = ()
    extraction: Extraction = field(default_factory=Extraction)
    usage: tuple[tuple[str, Usage], ...] = ()
    """(model id, usage) of the calls made."""


def _too_short(text: str, cfg: TurnConfig) -> bool:
    return len(text.strip()) < cfg.min_persist_chars


def _answers_question(exchange: Exchange) -> bool:
    """Does the message answer a question the assistant just asked? ("Yes." after "… is that right?" is a
    confirmation, not noise, however short.)"""
    hist = exchange.history
    return bool(hist) and hist[-1].role == "assistant" and hist[-1].content.rstrip(" .!\"')").endswith("?")


def decide_exchange(model: ModelIdentity, exchange: Exchange, cfg: TurnConfig, timings: dict[str, float]
                    ) -> Steps[Decided]:
    """Length filter, then one model call (persist flag + extraction), then the guards."""
    t0 = time.perf_counter()
    try:
        if _too_short(exchange.user_text, cfg) and not _answers_question(exchange):
            return Decided(False, f"shorter than {cfg.min_persist_chars} characters")
        d = yield MODEL.decide(exchange)
        used = ((d.model or model.memory_model_id, d.usage),)
        if not d.persist:
            return Decided(False, d.reason or "nothing worth keeping", d.categories, usage=used)
        clean, dropped = sanitize(d.extraction, exchange)
        reason = d.reason or "holds " + ", ".join(d.categories)
        if dropped:
            reason += "; guard: " + "; ".join(dropped)
        return Decided(True, reason, d.categories, clean, used)
    finally:
        timings["persist_decision"] = (time.perf_counter() - t0) * 1000


def windows(msgs: Sequence[Message], cfg: TurnConfig) -> list[list[Message]]:
    """Consecutive chunks of at most ``observe_window`` messages and about ``observe_window_tokens`` tokens."""
    out: list[list[Message]] = []
    size = 0
    for m in msgs:
        n = estimate_tokens(m.text) + 8
        if not out or len(out[-1]) >= cfg.observe_window or (out[-1] and size + n > cfg.observe_window_tokens):
            out.append([])
            size = 0
        out[-1].append(m)
        size += n
    return out


def own_window(model: object) -> bool:
    """Does the model judge a window in one call of its own (else :func:`window_by_message`)?"""
    fn = getattr(type(model), "decide_window", None)
    return fn is not None and fn is not LanguageModel.decide_window


def decide_observed(model: ModelIdentity, window: list[Message], earlier: tuple[ChatMessage, ...], persona: str,
                    cfg: TurnConfig, timings: dict[str, float]
                    ) -> Steps[tuple[list[Decided], tuple[tuple[str, Usage], ...]]]:
    """One decision per message of ``window`` (one model call for the window), guards applied per message."""
    t0 = time.perf_counter()
    reads = cfg.observe_window_tokens * 4  # a model reads at most a window's worth of one message
    obs = ObserveWindow(tuple(ObservedMessage(m.id, m.speaker, clip(m.text, reads), m.at,
                                              judge=not _too_short(m.text, cfg))
                              for m in window), earlier, persona, cfg.history_for_extraction)
    if own_window(model):
        wd = yield MODEL.decide_window(obs)
    else:
        wd = yield from window_by_message(obs, model.model_id)
    used = ((wd.model or model.memory_model_id, wd.usage),) if wd.usage.calls or wd.usage.input_tokens else ()
    out: list[Decided] = []
    history = list(earlier)
    for m, d in zip(window, wd.decisions, strict=True):
        if _too_short(m.text, cfg):
            out.append(Decided(False, f"shorter than {cfg.min_persist_chars} characters"))
        elif not d.persist:
            out.append(Decided(False, d.reason or "nothing worth keeping", d.categories))
        else:
            ex = Exchange(user_text=clip(m.text, reads), reply_text="", speaker=m.speaker, message_ids=(m.id,), at=m.at,
                          persona=persona, history=tuple(history[-cfg.history_for_extraction:]))
            clean, dropped = sanitize(d.extraction, ex)
            reason = d.reason or "holds " + ", ".join(d.categories)
            out.append(Decided(True, reason + ("; guard: " + "; ".join(dropped) if dropped else ""), d.categories,
                               clean))
        history.append(ChatMessage("user", clip(m.text, reads), m.id, m.speaker))
    timings["persist_decision"] = timings.get("persist_decision", 0.0) + (time.perf_counter() - t0) * 1000
    return out, used


def exchange_to_plain(ex: Exchange) -> dict[str, Any]:
    return {"user_text": ex.user_text, "reply_text": ex.reply_text, "speaker": ex.speaker,
            "message_ids": list(ex.message_ids), "at": ex.at, "persona": ex.persona, "recalled": list(ex.recalled),
            "history": [[m.role, m.content, m.id, m.speaker] for m in ex.history],
            "known_facts": [list(f) for f in ex.known_facts], "known_tasks": list(ex.known_tasks)}


def exchange_from_plain(d: dict[str, Any]) -> Exchange:
    return Exchange(user_text=d["user_text"], reply_text=d["reply_text"], speaker=d["speaker"],
                    message_ids=tuple(d["message_ids"]), at=float(d["at"]), persona=d.get("persona", ""),
                    recalled=tuple(d.get("recalled", ())),
                    history=tuple(ChatMessage(*m) for m in d.get("history", ())),
                    known_facts=tuple((str(a), str(b), str(c)) for a, b, c in d.get("known_facts", ())),
                    known_tasks=tuple(d.get("known_tasks", ())))
