"""Episodic policies (pure): when to write an episode, how recency weighs, what decays."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from soul_runtime.clock import DAY
from soul_runtime.config import MemoryConfig
from soul_runtime.records import Extraction
from soul_runtime.text import segments, terms

Num = TypeVar("Num", float, np.ndarray)
"""The scoring policies below take a number or a numpy array of them (recall scores all its candidates at
once), with the same arithmetic either way."""


@dataclass(frozen=True)
class EpisodeDecision:
    write: bool
    reason: str


def decide_episode(ex: Extraction) -> EpisodeDecision:
    """Write an episode only for an exchange that changed state.

    State changes: a tool call, a confirmed/corrected/retracted fact, a finished
    task, a saved procedure, or content the extractor marks as a meaningful event.
    Chit-chat writes nothing.
    """
    if not ex.episode.strip():
        return EpisodeDecision(False, "no episode summary")
    if ex.tool_call:
        return EpisodeDecision(True, "tool call")
    if any(f.kind in ("confirmed", "corrected", "retracted") for f in ex.facts):
        kinds = sorted({f.kind for f in ex.facts if f.kind != "stated"})
        return EpisodeDecision(True, f"fact {'/'.join(kinds)}")
    if ex.task is not None and (ex.task.outcome or ex.task.save_requested):
        return EpisodeDecision(True, f"task {ex.task.outcome or 'saved as procedure'}")
    if ex.event:
        return EpisodeDecision(True, "meaningful event")
    return EpisodeDecision(False, "chit-chat: no state change")


def recency_weight(at: Num, now: float, cfg: MemoryConfig) -> Num:
    """Exponential decay with ``half_life_days``, floored at ``recency_floor``.

    Episodes dated in the future (relative to ``now``) weigh 1.
    """
    age_days = np.maximum(0.0, (now - at) / DAY)
    w = 0.5 ** (age_days / cfg.half_life_days)
    out: Num = cfg.recency_floor + (1.0 - cfg.recency_floor) * w
    return out


def in_recall(at: Num, promoted: bool | np.ndarray, now: float, cfg: MemoryConfig) -> bool | np.ndarray:
    """Episodes older than ``recall_horizon_days`` drop out of recall unless promoted."""
    out: bool | np.ndarray = np.logical_or(promoted, (now - at) <= cfg.recall_horizon_days * DAY)
    return out


def past_ttl(at: float, promoted: bool, now: float, cfg: MemoryConfig) -> bool:
    """Whether the retention sweep deletes this episode (``episodic_ttl_days`` > 0 only)."""
    return cfg.episodic_ttl_days > 0 and not promoted and (now - at) > cfg.episodic_ttl_days * DAY


def is_near_duplicate(similarity: float, new_text: str, old_text: str, cfg: MemoryConfig) -> bool:
    """Merge only what says the same thing: very high similarity AND the same content words
    (so "svc3 moved to team 3" and "svc13 moved to team 13" stay two episodes)."""
    return near_duplicate_terms(similarity, frozenset(terms(new_text)), frozenset(terms(old_text)), cfg)


def near_duplicate_terms(similarity: float, new: frozenset[str], old: frozenset[str], cfg: MemoryConfig) -> bool:
    """:func:`is_near_duplicate` on the texts' content words (a caller comparing one text with several, or
    several with one, computes each side's words once): at most one term in ten differs."""
    return similarity >= cfg.merge_similarity and bool(new) and len(new ^ old) <= max(0, (len(new | old) // 10))


FUSED_TOP = 0.9
MAGNITUDE = 0.25
"""The share of the fused score that keeps how far apart the candidates' raw scores are (each search's score
over its best): ranks order the candidates, this keeps a candidate that alone holds the question's rare words
ahead of one that is merely first in the other ranking."""
"""The fused score of an episode first in both rankings: a rank says which episode answers best, not how well,
so a stored fact that answers the question (its words and its subject, 0.9 and up) is shown first."""


def fused_score(dense: np.ndarray, lexical: np.ndarray, cfg: MemoryConfig, unit: bool | np.ndarray = False
                ) -> np.ndarray:
    """Reciprocal rank fusion of the dense and the lexical ranking of the same candidates, on [0, 1].

    ``dense``: each candidate's cosine similarity; ``lexical``: its BM25 score (0 where the lexical search did
    not find it). A candidate at rank r of a ranking scores ``1 / (rank_constant + r)`` there, weighted by
    ``dense_weight`` (``unit_dense_weight`` for a unit that shares its message's vector) and the rest for the
    lexical ranking; MAGNITUDE of it is weighed by the candidate's raw scores over the best ones; the result is
    scaled so that a candidate first and best in both rankings scores FUSED_TOP. The two
    searches' raw scores live on different scales (a cosine, an unbounded BM25): ranks compare them fairly. Ties
    in a ranking go by position (the caller's order)."""
    n = len(dense)
    k = cfg.rank_constant
    w = np.where(unit, cfg.unit_dense_weight, cfg.dense_weight) if np.any(unit) else np.full(n, cfg.dense_weight)
    dense_rank = np.empty(n)
    dense_rank[np.argsort(-np.asarray(dense, np.float64), kind="stable")] = np.arange(1, n + 1)
    lex = np.asarray(lexical, np.float64)
    lex_rank = np.empty(n)
    lex_rank[np.argsort(-lex, kind="stable")] = np.arange(1, n + 1)
    fused = (w / (k + dense_rank) + np.where(lex > 0, (1.0 - w) / (k + lex_rank), 0.0)) * (k + 1)
    sims = np.maximum(0.0, np.asarray(dense, np.float64))
    how_far = w * sims / (float(sims.max()) or 1.0) + (1.0 - w) * lex / (float(lex.max()) or 1.0)
    out: np.ndarray = fused * (1.0 - MAGNITUDE + MAGNITUDE * how_far) * FUSED_TOP
    return out


@dataclass(frozen=True)
class LexicalLimits:
    """How much lexical (FTS5 BM25) search a recall may cost in a large store.

    BM25 is computed for every episode the query matches, so a query's cost is the number of episodes it
    matches. From ``prune_at`` episodes on, the query is rewritten to match at most about ``postings_budget``
    episodes: the rarest terms on their own, and pairs of the commoner ones (an episode must hold both, so a
    pair matches far fewer episodes than either term), at most ``max_terms`` terms and ``max_clauses`` clauses.
    Smaller stores search every term (cheap there, and what the LoCoMo and BEAM benchmarks measure: a chat of a
    million tokens stored as units is ~12,000 episodes, and pruning its queries costs it a seventh of its
    evidence recall)."""

    prune_at: int = 20_000
    postings_budget: int = 1_000
    max_terms: int = 8
    max_clauses: int = 12


LEXICAL = LexicalLimits()


def lexical_clauses(query_terms: list[str], doc_freq: dict[str, int], size: int,
                    limits: LexicalLimits = LEXICAL) -> list[tuple[str, ...]]:
    """The lexical query for a store of ``size`` episodes, as clauses OR'ed together, each a tuple of terms
    AND'ed (``doc_freq``: episodes holding each term). Below ``limits.prune_at``: every term on its own.
    Above: terms no episode holds are left out (they match nothing); the rarest terms on their own while the
    episodes they match stay within ``limits.postings_budget``; then pairs of the terms left, fewest expected
    matches first (``df(a) * df(b) / size``), within the same budget. A query of common words alone keeps
    the pairs that fit, or nothing: one common word ranks thousands of episodes nearly alike and costs a BM25
    call for each."""
    if size < limits.prune_at:
        return [(t,) for t in query_terms]
    ranked = sorted((t for t in query_terms if doc_freq.get(t, 0) > 0),
                    key=lambda t: (doc_freq[t], query_terms.index(t)))[:limits.max_terms]
    out: list[tuple[str, ...]] = []
    cost = 0.0
    rest: list[str] = []
    for t in ranked:
        if not rest and cost + doc_freq[t] <= limits.postings_budget:
            out.append((t,))
            cost += doc_freq[t]
        else:
            rest.append(t)
    pairs = sorted(((doc_freq[a] * doc_freq[b] / max(size, 1), i, j) for i, a in enumerate(rest)
                    for j, b in enumerate(rest) if i < j))
    for est, i, j in pairs:
        if len(out) >= limits.max_clauses or cost + est > limits.postings_budget:
            break
        out.append((rest[i], rest[j]))
        cost += est
    return out


_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_DIGIT = re.compile(r"\d")


def _statements(query_terms: set[str], text: str) -> list[tuple[frozenset[str], frozenset[str]]]:
    """The figures ``text`` states about what the query names: (query terms, numbers) of each line or
    sentence that holds a number and most of ``query_terms`` (two thirds of them, at least two)."""
    out: list[tuple[frozenset[str], frozenset[str]]] = []
    if not _DIGIT.search(text):
        return out
    need = max(2, math.ceil(len(query_terms) * 2 / 3))
    for seg in segments(text):
        nums = frozenset(_NUMBER.findall(seg))
        if not nums:
            continue
        held = frozenset(query_terms.intersection(terms(seg)))
        if len(held) >= need:
            out.append((held, nums))
    return out


def later_figures_first(query: str, texts: Sequence[str], ats: Sequence[float], scores: Sequence[float]
                        ) -> list[float]:
    """Later figures win: where a recalled episode states a figure about what the query names (a line that
    holds a number and most of the query's terms) and a later episode states it again with other
    numbers (a line holding the same query terms or more: "p95 of uploader is 52 ms" … "uploader's p95 is now
    41 ms"), the earlier one is scored just below the later one. It stays stored and recallable, in its
    history, as the earlier value; scores that need no change are returned as they are."""
    qt = set(terms(query))
    out = list(scores)
    if len(qt) < 2:
        return out
    said = [_statements(qt, t) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: -ats[i])  # newest first: a cap uses the newer one's final score
    for pos, i in enumerate(order):
        if not said[i]:
            continue
        for j in order[:pos]:
            if ats[j] > ats[i] and out[j] <= out[i] and any(
                    held_i <= held_j and nums_i != nums_j for held_i, nums_i in said[i] for held_j, nums_j in said[j]):
                out[i] = out[j] - 1e-5
    return out
