"""How long the turn path keeps trying an actor that is dead or restarting: one policy for every caller."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` calls at most; the pause after the n-th failed one (0-based) grows by ``step_s`` up to
    ``max_pause_s`` (40 attempts: ≈ 70 s of waiting in all, longer than a restarting actor takes)."""

    attempts: int = 40
    step_s: float = 0.1
    max_pause_s: float = 2.0

    def pause(self, attempt: int) -> float:
        return min(self.max_pause_s, self.step_s * (attempt + 1))

    def last(self, attempt: int) -> bool:
        return attempt >= self.attempts - 1


DEFAULT = RetryPolicy()
