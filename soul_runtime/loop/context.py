"""Context assembly under the model's input budget (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from soul_runtime.config import TurnConfig
from soul_runtime.loop.buffer import ShortTermBuffer
from soul_runtime.models.base import ReplyRequest
from soul_runtime.records import RecalledItem
from soul_runtime.text import estimate_tokens


def memory_line(it: RecalledItem) -> str:
    return f"[{it.store} {it.id}] {it.text}"


@dataclass(frozen=True)
class Assembled:
    request: ReplyRequest
    used: tuple[RecalledItem, ...]  # the recalled items actually passed to the model, in order
    tokens: dict[str, int]


def assemble(*, persona: str, recalled: list[RecalledItem], buffer: ShortTermBuffer, user_text: str, user: str,
             cfg: TurnConfig) -> Assembled:
    """System prompt + memory lines + the newest buffer turns + the user text, within
    ``context_tokens`` with ``reply_tokens`` left for the answer."""
    system_t = estimate_tokens(persona)
    user_t = estimate_tokens(user_text) + 4
    room = cfg.context_tokens - cfg.reply_tokens - system_t - user_t
    mem_budget = max(0, min(cfg.memory_tokens, room))
    used: list[RecalledItem] = []
    mem_t = 0
    for it in recalled:
        t = estimate_tokens(memory_line(it)) + 1
        if mem_t + t > mem_budget:
            break
        used.append(it)
        mem_t += t
    window = buffer.window(max(0, room - mem_t))
    buf_t = sum(t.tokens for t in window)
    req = ReplyRequest(system=persona, memory_lines=tuple(memory_line(it) for it in used),
                       history=buffer.chat(window), user_text=user_text, user=user, max_tokens=cfg.reply_tokens)
    tokens = {"system": system_t, "memory": mem_t, "buffer": buf_t, "user": user_t, "reply_budget": cfg.reply_tokens,
              "total": system_t + mem_t + buf_t + user_t + cfg.reply_tokens, "budget": cfg.context_tokens}
    return Assembled(req, tuple(used), tokens)
