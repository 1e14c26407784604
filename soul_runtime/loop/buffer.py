"""The short-term buffer: the current session's turns, trimmed to a token budget."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import msgpack

from soul_runtime.errors import InvalidInput
from soul_runtime.models.base import ChatMessage
from soul_runtime.text import estimate_tokens


@dataclass(frozen=True)
class BufferTurn:
    role: str  # user | assistant
    speaker: str
    text: str
    id: str
    at: float

    @cached_property
    def tokens(self) -> int:
        """Its estimated size in a context (counted once: a full buffer is counted several times a turn)."""
        return estimate_tokens(self.text) + 4

    @cached_property
    def message(self) -> ChatMessage:
        """It as a chat message (made once and shared: both are immutable)."""
        return ChatMessage(self.role, self.text, self.id, self.speaker)

    @cached_property
    def packed(self) -> bytes:
        """Its msgpack encoding in a checkpoint (encoded once: every turn's checkpoint holds the whole buffer)."""
        return bytes(msgpack.packb([self.role, self.speaker, self.text, self.id, self.at], use_bin_type=True))


@dataclass
class ShortTermBuffer:
    """Owned by exactly one soul activation; checkpointed (msgpack) after every turn."""

    session: str = ""
    turns: list[BufferTurn] = field(default_factory=list)
    max_tokens: int = 6000

    def append(self, turn: BufferTurn) -> None:
        self.turns.append(turn)
        self.trim(self.max_tokens)

    def copy(self) -> ShortTermBuffer:
        """An independent copy (the turns themselves are immutable and shared)."""
        return ShortTermBuffer(self.session, list(self.turns), self.max_tokens)

    def start_session(self, name: str) -> None:
        self.session = name
        self.turns.clear()

    def tokens(self) -> int:
        return sum(t.tokens for t in self.turns)

    def trim(self, budget: int) -> None:
        """Drop the oldest turns until the buffer fits ``budget`` tokens."""
        total = self.tokens()
        while self.turns and total > budget:
            total -= self.turns.pop(0).tokens

    def window(self, budget: int) -> list[BufferTurn]:
        """The newest turns that fit ``budget`` tokens, oldest first."""
        out: list[BufferTurn] = []
        used = 0
        for t in reversed(self.turns):
            if used + t.tokens > budget:
                break
            out.append(t)
            used += t.tokens
        return out[::-1]

    def chat(self, turns: list[BufferTurn] | None = None) -> tuple[ChatMessage, ...]:
        return tuple([t.message for t in (self.turns if turns is None else turns)])

    def to_bytes(self) -> bytes:
        """The checkpoint: ``{"session", "max_tokens", "turns": [[role, speaker, text, id, at], ...]}`` in msgpack,
        the turns' encodings joined as they are (each turn is encoded once, not at every checkpoint)."""
        p = msgpack.Packer(use_bin_type=True)
        head = p.pack_map_header(3) + p.pack("session") + p.pack(self.session) + p.pack("max_tokens")
        head += p.pack(self.max_tokens) + p.pack("turns") + p.pack_array_header(len(self.turns))
        return head + b"".join([t.packed for t in self.turns])

    @classmethod
    def from_bytes(cls, blob: bytes) -> ShortTermBuffer:
        try:
            d: dict[str, Any] = msgpack.unpackb(blob, raw=False)
            turns = [BufferTurn(*t) for t in d["turns"]]
            ok = isinstance(d["session"], str) and isinstance(d["max_tokens"], int) and all(
                isinstance(t.role, str) and isinstance(t.speaker, str) and isinstance(t.text, str)
                and isinstance(t.id, str) and isinstance(t.at, (int, float)) for t in turns)
        except Exception as e:
            raise InvalidInput(f"not a buffer checkpoint: {e.__class__.__name__}") from None
        if not ok:
            raise InvalidInput("not a buffer checkpoint: wrong field types")
        return cls(session=d["session"], max_tokens=d["max_tokens"], turns=turns)
