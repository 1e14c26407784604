"""Pure policy functions: explicit `now`, frozen inputs, decisions out."""

from __future__ import annotations

import numpy as np
import pytest

from soul_runtime.clock import DAY
from soul_runtime.config import MemoryConfig, SoulConfig
from soul_runtime.errors import ConfigError
from soul_runtime.memory.policy_episodic import (
    FUSED_TOP,
    MAGNITUDE,
    decide_episode,
    fused_score,
    in_recall,
    past_ttl,
    recency_weight,
)
from soul_runtime.memory.policy_procedural import TaskRun, decide_procedure, step_signature
from soul_runtime.memory.policy_semantic import reconcile_fact
from soul_runtime.records import Extraction, Fact, FactCandidate, Op, Procedure, TaskReport

NOW = 1_780_000_000.0
CFG = MemoryConfig()


def cand(value: str, kind: str, src: str = "m1") -> FactCandidate:
    return FactCandidate("tendril", "production_database", value, kind, (src,), "Tendril", "production database")


def fact(value: str, src: str = "m0") -> Fact:
    return Fact("tendril", "production_database", value, (src,), NOW - DAY)


# ---- episodic ----------------------------------------------------------------------------
def test_recent_episode_outranks_an_equally_similar_old_one() -> None:
    top = float(fused_score(np.array([0.8]), np.array([0.5]), CFG)[0])
    assert top == pytest.approx(FUSED_TOP)  # first in both rankings
    assert top * recency_weight(NOW - 2 * DAY, NOW, CFG) > top * recency_weight(NOW - 200 * DAY, NOW, CFG)


def test_age_breaks_near_ties_but_a_clearly_better_old_match_wins() -> None:
    # a question about last spring is as legitimate as one about yesterday: recency only breaks near-ties
    assert recency_weight(NOW - 7 * DAY, NOW, CFG) > recency_weight(NOW - 210 * DAY, NOW, CFG)
    sims = np.linspace(0.9, 0.1, 40)  # candidate 0 first in both rankings, candidate 39 last in both
    fused = fused_score(sims, sims * 10, CFG)
    old_better = fused[0] * recency_weight(NOW - 210 * DAY, NOW, CFG)
    new_worse = fused[39] * recency_weight(NOW - 7 * DAY, NOW, CFG)
    assert old_better > new_worse
    near = fused[1] * recency_weight(NOW - 7 * DAY, NOW, CFG)
    assert near > fused[0] * recency_weight(NOW - 210 * DAY, NOW, CFG)  # a near-tie goes to the recent one


def test_fusion_is_by_rank_not_by_raw_score() -> None:
    """A BM25 score a thousand times larger does not outweigh a dense ranking: the order counts most."""
    a = fused_score(np.array([0.9, 0.2, 0.1]), np.array([1.0, 3.0, 0.0]), CFG)
    b = fused_score(np.array([0.9, 0.2, 0.1]), np.array([1.0, 3000.0, 0.0]), CFG)
    ratio = b / a  # a BM25 score a thousand times larger moves no score by more than the magnitude share
    assert np.all(ratio > 1 - MAGNITUDE) and np.all(ratio < 1 / (1 - MAGNITUDE))
    assert a[2] < min(a[0], a[1]) and b[2] < min(b[0], b[1])  # the last in both rankings stays last
    units = fused_score(np.array([0.5, 0.5]), np.array([2.0, 1.0]), CFG, np.array([True, True]))
    assert units[0] > units[1]  # parts of one message share its vector: their own words order them


def test_recency_is_relative_to_the_given_now_and_floored() -> None:
    assert recency_weight(NOW, NOW, CFG) == pytest.approx(1.0)
    assert recency_weight(NOW + DAY, NOW, CFG) == pytest.approx(1.0)
    assert recency_weight(NOW - 10_000 * DAY, NOW, CFG) == pytest.approx(CFG.recency_floor)
    assert recency_weight(NOW - CFG.half_life_days * DAY, NOW, CFG) == pytest.approx(
        CFG.recency_floor + (1 - CFG.recency_floor) * 0.5)


def test_decay_drops_old_unpromoted_episodes_only() -> None:
    cfg = MemoryConfig(recall_horizon_days=30)
    assert in_recall(NOW - 29 * DAY, False, NOW, cfg)
    assert not in_recall(NOW - 31 * DAY, False, NOW, cfg)
    assert in_recall(NOW - 3000 * DAY, True, NOW, cfg)


def test_ttl_only_when_configured() -> None:
    assert not past_ttl(NOW - 10_000 * DAY, False, NOW, CFG)
    cfg = MemoryConfig(episodic_ttl_days=100)
    assert past_ttl(NOW - 101 * DAY, False, NOW, cfg)
    assert not past_ttl(NOW - 101 * DAY, True, NOW, cfg)


def test_chit_chat_writes_no_episode_but_state_changes_do() -> None:
    assert not decide_episode(Extraction(episode="Maya said hi.")).write
    assert not decide_episode(Extraction(episode="", event=True)).write
    assert decide_episode(Extraction(episode="Maya went hiking.", event=True)).write
    assert decide_episode(Extraction(episode="x", facts=(cand("Postgres 16", "corrected"),))).reason == "fact corrected"
    assert decide_episode(Extraction(episode="x", task=TaskReport("draft postmortem", ("a",), "success"))).write
    assert decide_episode(Extraction(episode="x", tool_call=True)).reason == "tool call"


# ---- semantic ----------------------------------------------------------------------------
def test_statement_is_not_a_fact_until_seen_in_three_episodes() -> None:
    for n in (1, 2):
        d = reconcile_fact(None, cand("Postgres 15", "stated"), observations=n, now=NOW, cfg=CFG)
        assert d.op is Op.NOOP and d.fact is None
    d = reconcile_fact(None, cand("Postgres 15", "stated"), observations=3, now=NOW, cfg=CFG)
    assert d.op is Op.ADD and d.fact is not None and "promoted" in d.reason


def test_confirmation_adds_and_same_value_is_a_noop_with_merged_sources() -> None:
    d = reconcile_fact(None, cand("Postgres 15", "confirmed"), observations=0, now=NOW, cfg=CFG)
    assert d.op is Op.ADD
    again = reconcile_fact(d.fact, cand("postgres 15.", "confirmed", "m9"), observations=0, now=NOW, cfg=CFG)
    assert again.op is Op.NOOP and again.fact is not None
    assert again.fact.sources == ("m1", "m9") and again.fact.value == "Postgres 15"


def test_correction_updates_in_place_and_archives_the_old_value_with_its_source() -> None:
    d = reconcile_fact(fact("Postgres 15", "m0"), cand("Postgres 16", "corrected", "m5"), observations=0, now=NOW,
                       cfg=CFG)
    assert d.op is Op.UPDATE and d.fact is not None
    assert d.fact.value == "Postgres 16" and d.fact.sources == ("m5",)
    (old,) = d.fact.history
    assert (old.value, old.sources, old.valid_to, old.reason) == ("Postgres 15", ("m0",), NOW, "corrected")


def test_a_stated_contradiction_never_silently_overwrites() -> None:
    d = reconcile_fact(fact("Postgres 15"), cand("Postgres 14", "stated"), observations=1, now=NOW, cfg=CFG)
    assert d.op is Op.NOOP and d.fact is None


def test_retraction_archives_and_never_hard_deletes() -> None:
    d = reconcile_fact(fact("Postgres 15"), cand("Postgres 15", "retracted"), observations=0, now=NOW, cfg=CFG)
    assert d.op is Op.DELETE and d.fact is not None and d.fact.status == "archived"
    assert d.fact.history[-1].value == "Postgres 15"
    assert reconcile_fact(None, cand("x", "retracted"), observations=0, now=NOW, cfg=CFG).op is Op.NOOP


# ---- procedural --------------------------------------------------------------------------
STEPS = ("pull the timeline", "summarise impact", "list action items")
STEPS2 = ("pull the timeline", "check the on-call log", "summarise impact", "list action items")


def run(steps: tuple[str, ...] = STEPS, outcome: str = "success") -> TaskRun:
    return TaskRun("draft postmortem", step_signature(steps), steps, outcome, NOW, ("m",))


def report(steps: tuple[str, ...] = STEPS, outcome: str = "success", save: bool = False) -> TaskReport:
    return TaskReport("draft postmortem", steps, outcome, save)


def test_third_success_with_same_steps_creates_v1() -> None:
    assert decide_procedure(report(), [run()], [], sources=("m2",), now=NOW, cfg=CFG) == []
    assert decide_procedure(report(), [run(STEPS2), run(STEPS2)], [], sources=("m3",), now=NOW, cfg=CFG) == []
    (ch,) = decide_procedure(report(), [run(), run(), run(STEPS2)], [], sources=("m3",), now=NOW, cfg=CFG)
    assert ch.op is Op.ADD and ch.procedure.version == 1 and ch.procedure.status == "active"
    assert ch.procedure.clean_runs == 3


def test_explicit_save_creates_a_procedure_at_once() -> None:
    (ch,) = decide_procedure(report(outcome="", save=True), [], [], sources=("m1",), now=NOW, cfg=CFG)
    assert ch.procedure.status == "active" and ch.reason.startswith("explicit")


def _v1() -> Procedure:
    return Procedure("draft postmortem", 1, STEPS, "active", ("m",), NOW, clean_runs=3)


def test_changed_steps_make_a_candidate_that_becomes_active_after_n_clean_runs() -> None:
    cfg = MemoryConfig(rollout_clean_runs=3)
    (ch,) = decide_procedure(report(STEPS2), [], [_v1()], sources=("m4",), now=NOW, cfg=cfg)
    assert ch.op is Op.ADD and ch.procedure.status == "candidate" and ch.procedure.version == 2
    v2 = ch.procedure
    (ch2,) = decide_procedure(report(STEPS2), [], [_v1(), v2], sources=("m5",), now=NOW, cfg=cfg)
    assert ch2.procedure.status == "candidate" and ch2.procedure.clean_runs == 2
    promote = decide_procedure(report(STEPS2), [], [_v1(), ch2.procedure], sources=("m6",), now=NOW, cfg=cfg)
    assert [(c.procedure.version, c.procedure.status) for c in promote] == [(2, "active"), (1, "retired")]


def test_a_failing_candidate_is_rolled_back() -> None:
    v2 = Procedure("draft postmortem", 2, STEPS2, "candidate", ("m",), NOW, clean_runs=1)
    (ch,) = decide_procedure(report(STEPS2, "failure"), [], [_v1(), v2], sources=("m7",), now=NOW, cfg=CFG)
    assert ch.op is Op.DELETE and ch.procedure.status == "retired" and "rolled back" in ch.reason


def test_active_version_counts_clean_runs_and_failures() -> None:
    (ok,) = decide_procedure(report(), [], [_v1()], sources=("m",), now=NOW, cfg=CFG)
    assert ok.procedure.clean_runs == 4
    (bad,) = decide_procedure(report(outcome="failure"), [], [_v1()], sources=("m",), now=NOW, cfg=CFG)
    assert bad.procedure.failures == 1 and bad.procedure.status == "active"


# ---- configuration -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{"half_life_days": 0}, {"recall_horizon_days": -1}, {"dense_weight": 1.5},
                                    {"promotion_observations": 0}, {"merge_similarity": float("nan")},
                                    {"rollout_clean_runs": 2.5}, {"half_life_days": "7"}, {"fact_match_similarity": 0},
                                    {"fact_match_similarity": 1.5}])
def test_invalid_configuration_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        MemoryConfig(**kwargs)  # type: ignore[arg-type]


def test_near_duplicates_need_the_same_content_words() -> None:
    from soul_runtime.memory.policy_episodic import is_near_duplicate
    assert is_near_duplicate(0.99, "Maya moved the standup to 10am.", "maya moved the standup to 10am", CFG)
    assert not is_near_duplicate(0.99, "Svc3's owner is team Falcon3.", "Svc13's owner is team Falcon13.", CFG)
    assert not is_near_duplicate(0.90, "Maya moved the standup to 10am.", "Maya moved the standup to 10am.", CFG)


def test_lexical_clauses_keep_rare_terms_and_pairs_within_a_budget() -> None:
    from soul_runtime.memory.policy_episodic import LexicalLimits, lexical_clauses
    lim = LexicalLimits(prune_at=5_000, postings_budget=1_000, max_terms=8, max_clauses=12)
    df = {"maya": 9000, "budget": 2500, "zeppelin": 3, "hangar": 40, "absent": 0}
    q = ["maya", "budget", "zeppelin", "hangar", "absent"]
    assert lexical_clauses(q, df, 4_999, lim) == [(t,) for t in q]  # a small store searches every term
    # rarest alone (a term none holds is left out); the common ones only as a pair: 9000 * 2500 / 10000 = 2250 is
    # over what is left of the budget, so no pair here
    assert lexical_clauses(q, df, 10_000, lim) == [("zeppelin",), ("hangar",)]
    # in a larger store the pair is expected to match 9000 * 2500 / 100000 = 225 episodes: it fits
    assert lexical_clauses(q, df, 100_000, lim) == [("zeppelin",), ("hangar",), ("budget", "maya")]
    assert lexical_clauses(["maya", "budget"], df, 10_000, lim) == []  # common words whose pair is too broad
    many = [f"t{i}" for i in range(1, 21)]
    assert lexical_clauses(many, {t: 1 for t in many}, 10_000, lim) == [(t,) for t in many[:8]]  # max_terms
    wide = {f"w{i}": 2000 + i for i in range(8)}  # all over budget alone: pairs only, at most max_clauses
    got = lexical_clauses(list(wide), wide, 100_000, lim)
    assert got and all(len(c) == 2 for c in got) and len(got) <= 12
    assert sum(wide[a] * wide[b] / 100_000 for a, b in got) <= 1_000


def test_the_recall_horizon_round_trips_under_its_one_name() -> None:
    cfg = MemoryConfig(recall_horizon_days=12)
    assert SoulConfig(memory=cfg).to_dict()["memory"]["recall_horizon_days"] == 12
    assert SoulConfig.from_dict(SoulConfig(memory=cfg).to_dict()).memory == cfg
    with pytest.raises(TypeError):
        MemoryConfig(decay_days=12)  # type: ignore[call-arg]  # the old name is gone
