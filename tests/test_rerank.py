"""The re-ranker reads the recalled candidates against the question before they are packed."""

from __future__ import annotations

from soul_runtime.loop.context import pack_memory
from soul_runtime.loop.rerank import (
    MODEL_CANDIDATES,
    MODEL_CHARS,
    OFF,
    RerankWeights,
    asks,
    model_order,
    model_prompt,
    rerank,
)
from soul_runtime.records import RecalledItem

AT = 1.7e9


def ep(i: int, text: str, score: float = 0.5) -> RecalledItem:
    return RecalledItem("episodic", f"ep-{i}", text, score, (f"m{i}",), AT)


FILLER = [ep(10 + i, f"We talked about the weather and lunch plans, note {i}.", 0.5) for i in range(6)]


def order(items: list[RecalledItem], q: str, w: RerankWeights | None = None) -> list[str]:
    return [it.id for it in (rerank(items, q, w) if w else rerank(items, q))]


ANSWER_TYPE = RerankWeights(0.0, 0.6, 0.0, 0.0)


def test_a_candidate_that_relates_the_questions_entities_in_one_sentence_comes_first() -> None:
    q = "Which database did Priya pick for the billing service?"
    scattered = ep(1, "Priya was out on Monday. The billing team met on Friday. Someone asked about a database.")
    related = ep(2, "Priya picked Postgres as the database for the billing service.")
    assert order([scattered, related, *FILLER], q)[0] == "ep-2"
    assert [it.id for it in rerank([scattered, related, *FILLER], q, OFF)][:2] == ["ep-1", "ep-2"]


def test_what_the_question_asks_for_lifts_the_candidates_that_hold_it() -> None:
    figures = ep(1, "The nightly export job for the reports finished in 42 minutes over 3 runs.")
    words = ep(2, "The nightly export job for the reports finished quite slowly over several runs.")
    assert asks("How many minutes did the nightly export job take?") == {"figure"}
    assert order([words, figures, *FILLER], "How many minutes did the nightly export job take?", ANSWER_TYPE)[0] == "ep-1"
    dated = ep(3, "The nightly export job for the reports moved on March 3, 2024 to the new cluster.")
    undated = ep(4, "The nightly export job for the reports moved eventually to the new cluster.")
    assert "date" in asks("When did the nightly export job move?")
    assert order([undated, dated, *FILLER], "When did the nightly export job move?", ANSWER_TYPE)[0] == "ep-3"
    assert order([undated, dated, *FILLER], "When did the nightly export job move?", OFF)[0] == "ep-4"


def test_facts_keep_their_scores_and_come_first() -> None:
    fact = RecalledItem("semantic", "billing:database", "billing database = Postgres", 0.95, ("m1",))
    out = rerank([fact, ep(2, "Priya picked Postgres as the database for the billing service.", 0.6),
                  *FILLER], "Which database did Priya pick for billing?")
    assert out[0] == fact


def test_scores_move_relative_to_the_other_candidates_only() -> None:
    same = [ep(i, "Priya picked Postgres for billing.", 0.5) for i in range(3)]
    assert [it.score for it in rerank(same, "Which database did Priya pick?")] == [0.5, 0.5, 0.5]
    assert rerank(same, "") == same


def test_packing_reads_the_candidates_before_it_chooses() -> None:
    q = "Which database did Priya pick for the billing service?"
    scattered = ep(1, "Priya was out on Monday. The billing team met on Friday. Someone asked about a database.", 0.52)
    related = ep(2, "Priya picked Postgres as the database for the billing service.", 0.5)
    items = [scattered, related, *FILLER]
    one_line = 30
    assert [it.id for it, _ in pack_memory(items, one_line, AT, q)] == ["ep-2"]
    assert [it.id for it, _ in pack_memory(items, one_line, AT, q, OFF)] == ["ep-1"]


def test_the_model_stage_is_one_bounded_call_and_moves_what_it_names_first() -> None:
    items = [ep(i, "x" * 1000 + f" passage {i}", 0.9 - i * 0.01) for i in range(30)]
    calls: list[str] = []

    def ask(prompt: str) -> str:
        calls.append(prompt)
        return "3, 7, 99, 3"
    out = model_order(items, "Which passage?", ask)
    assert len(calls) == 1 and len(calls[0]) <= MODEL_CANDIDATES * (MODEL_CHARS + 8) + 400
    assert calls[0] == model_prompt(items, "Which passage?")
    assert [it.id for it in out[:3]] == ["ep-3", "ep-7", "ep-0"] and len(out) == 30
    assert [it.score for it in out] == sorted((it.score for it in out), reverse=True)
    assert out[MODEL_CANDIDATES:] == items[MODEL_CANDIDATES:]
    assert model_order(items, "Which passage?", lambda p: "none of them") == items
