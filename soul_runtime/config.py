"""Configuration: small keyword-only frozen dataclasses, validated on creation.

Every threshold of the write, recall and retention policies lives here with its
default; docs/configuration.md lists them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from soul_runtime import limits
from soul_runtime.errors import ConfigError, InvalidInput


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """Write, recall and retention policy thresholds of the three layers."""

    # episodic
    half_life_days: float = 30.0
    """Recency half-life: an episode this old weighs half as much as a new one."""
    recency_floor: float = 0.9
    """Lowest recency weight (so old but exact matches still surface): a question about last spring is as
    legitimate as one about yesterday, so age only breaks near-ties."""
    recall_horizon_days: float = 365.0
    """Episodes older than this drop out of recall unless promoted (they stay stored; retention is
    ``episodic_ttl_days``)."""
    merge_similarity: float = 0.95
    """Cosine similarity above which a new episode merges into a stored one (same session)."""
    dense_weight: float = 0.5
    """Weight of the dense ranking in the fused episodic score (the lexical ranking gets the rest)."""
    unit_dense_weight: float = 0.5
    """The same for a unit of a long message that shares its message's vector (its dense rank says which message
    it is from, its lexical rank which part of it answers)."""
    rank_constant: float = 60.0
    """Reciprocal rank fusion's constant: a candidate at rank r of a ranking scores 1 / (rank_constant + r) there.
    Larger values flatten the difference between the first ranks."""
    digests_recalled: int = 2
    """Consolidated digests (:mod:`soul_runtime.memory.episodic_digests`) a question over time is offered in
    recall; 0: none (they are still written, kept with their provenance and erased with their episodes)."""
    max_episode_chars: int = 400
    # semantic
    promotion_observations: int = 3
    """Distinct episodes a stated fact must be seen in before it is promoted."""
    fact_match_similarity: float = 0.85
    """Cosine of two "entity attribute" phrases at or above which a candidate fact is reconciled with the stored
    fact of another key (reconciliation by meaning, ``memory/fact_match.py``); 1.0 turns matching by meaning off
    (no embedder is then loaded for it). Exact and normalised keys always match."""
    # procedural
    procedure_successes: int = 3
    """Successful runs with the same step pattern that create a procedure."""
    rollout_clean_runs: int = 3
    """Clean runs a new procedure version needs before it replaces the active one."""
    # retention (days; 0 = keep forever)
    episodic_ttl_days: float = 0.0
    archived_fact_ttl_days: float = 0.0
    # recall
    default_k: int = 10
    min_score: float = 0.05
    subject_only_score: float = 0.1
    """Recall score of a fact that matches a query by the name of its subject alone (no word of its attribute or
    value): it is background about someone the question names, ranked after what matches what is asked."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            _check(isinstance(v, (int, float)) and not isinstance(v, bool), f"{f.name} must be a number, got {v!r}")
            _check(math.isfinite(v), f"{f.name} must be finite, got {v!r}")
            _check(v >= 0, f"{f.name} must be >= 0, got {v!r}")
        _check(self.half_life_days > 0, "half_life_days must be > 0")
        _check(self.recall_horizon_days > 0, "recall_horizon_days must be > 0")
        _check(0.0 <= self.recency_floor <= 1.0, "recency_floor must be in [0, 1]")
        _check(0.0 < self.merge_similarity <= 1.0, "merge_similarity must be in (0, 1]")
        _check(0.0 <= self.dense_weight <= 1.0, "dense_weight must be in [0, 1]")
        _check(0.0 <= self.unit_dense_weight <= 1.0, "unit_dense_weight must be in [0, 1]")
        _check(self.rank_constant >= 0.0, "rank_constant must be >= 0")
        _check(self.subject_only_score <= 1.0, "subject_only_score must be in [0, 1]")
        _check(0.0 < self.fact_match_similarity <= 1.0, "fact_match_similarity must be in (0, 1]")
        for name in ("promotion_observations", "procedure_successes", "rollout_clean_runs", "default_k",
                     "max_episode_chars"):
            v = getattr(self, name)
            _check(isinstance(v, int) and v >= 1, f"{name} must be an int >= 1, got {v!r}")
        _check(isinstance(self.digests_recalled, int), f"digests_recalled must be an int, got {self.digests_recalled!r}")


@dataclass(frozen=True, kw_only=True)
class TurnConfig:
    """The turn loop: context budget, buffer and persistence filter."""

    context_tokens: int = 8000
    """Model input budget: system prompt + memories + buffer + user text + reply."""
    reply_tokens: int = 600
    memory_tokens: int = 1000
    """At most this many tokens of recalled memory lines go into the context (packed by value per token);
    the operating point `soul bench locomo` reports."""
    recall_k: int = 64
    """Memories recalled per turn: the candidates the memory lines are packed from."""
    min_persist_chars: int = 8
    """Exchanges shorter than this (user text) are never persisted."""
    session_gap_minutes: int = 240
    """A turn this long after the previous one starts a new session (the buffer is cleared)."""
    history_for_extraction: int = 6
    """Buffer messages shown to the extractor (to resolve confirmations, corrections, answers)."""
    observe_window: int = 40
    """Observed messages judged in one memory call (``observe`` sends its batch in windows of this size)."""
    observe_window_tokens: int = 6000
    """A window also ends before its text passes this many tokens."""
    max_text_chars: int = limits.TEXT_MAX
    """The longest message (characters) a turn or `observe` accepts; a long one is stored as units."""
    trace_keep: int = 10_000
    """Traces kept per soul (oldest dropped first)."""
    model_rerank: int = 0
    """1: before packing, the configured model re-orders the first recalled candidates in one call of bounded
    tokens (:func:`soul_runtime.loop.rerank.model_request`; for a real model, off by default); 0: off."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            _check(isinstance(v, int) and not isinstance(v, bool) and v >= 0, f"{f.name} must be an int >= 0, got {v!r}")
        _check(self.context_tokens > self.reply_tokens + 64, "context_tokens must exceed reply_tokens + 64")
        _check(self.model_rerank in (0, 1), f"model_rerank must be 0 or 1, got {self.model_rerank!r}")
        _check(self.memory_tokens < self.context_tokens, "memory_tokens must be below context_tokens")
        _check(self.recall_k >= 1, "recall_k must be >= 1")
        _check(self.observe_window >= 1 and self.observe_window_tokens >= 1,
               "observe_window and observe_window_tokens must be >= 1")


@dataclass(frozen=True, kw_only=True)
class SoulConfig:
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    turn: TurnConfig = field(default_factory=TurnConfig)
    persona: str = "You are Atlas, a helpful assistant with a long-term memory."

    def __post_init__(self) -> None:
        _check(isinstance(self.memory, MemoryConfig), "memory must be a MemoryConfig")
        _check(isinstance(self.turn, TurnConfig), "turn must be a TurnConfig")
        _check(isinstance(self.persona, str) and len(self.persona) <= 20_000, "persona must be a string")
        try:
            from soul_runtime.text import check_text
            check_text(self.persona, what="persona", max_chars=20_000, allow_empty=True)
        except InvalidInput as e:
            raise ConfigError(str(e)) from None

    def to_dict(self) -> dict[str, Any]:
        return {"memory": {f.name: getattr(self.memory, f.name) for f in fields(self.memory)},
                "turn": {f.name: getattr(self.turn, f.name) for f in fields(self.turn)},
                "persona": self.persona}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SoulConfig:
        if not isinstance(d, dict) or not isinstance(d.get("memory", {}), dict) or not isinstance(d.get("turn", {}),
                                                                                                 dict):
            raise ConfigError(f"a soul configuration must be a dict of dicts, got {d!r:.80}")
        try:
            return cls(memory=MemoryConfig(**d.get("memory", {})), turn=TurnConfig(**d.get("turn", {})),
                       persona=d.get("persona", cls().persona))
        except TypeError as e:
            raise ConfigError(f"unknown configuration key: {e}") from None


__all__ = ["MemoryConfig", "TurnConfig", "SoulConfig", "replace"]
