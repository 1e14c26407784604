"""The re-ranker reads the recalled candidates against the question before they are packed."""

from __future__ import annotations

import json
from pathlib import Path

from soul_apps.bench.messages_api import MessagesApiServer, error, text_message
from soul_runtime.config import SoulConfig, TurnConfig
from soul_runtime.loop.context import pack_memory
from soul_runtime.loop.rerank import (
    MODEL_CANDIDATES,
    MODEL_CHARS,
    MODEL_REPLY_TOKENS,
    OFF,
    RerankWeights,
    asks,
    model_order,
    model_prompt,
    rerank,
)
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.claude import AnthropicModel
from soul_runtime.models.offline import OfflineModel
from soul_runtime.records import RecalledItem
from tests.fakes import HashEmbedder

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


def _soul_with_claude(d: Path, base_url: str, model_rerank: int) -> tuple[Soul, SoulMemory]:
    """A soul whose memories the offline model wrote, now answering through the real anthropic SDK."""
    mem = SoulMemory(d, embedder=HashEmbedder())
    writer = Soul("atlas", d, memory=mem, model=OfflineModel())
    writer.observe([{"speaker": "ana", "text": t, "id": f"m{i}"} for i, t in enumerate(
        ["Tendril's production database is Postgres 16, upgraded on 2 March.",
         "The staging cluster for Tendril runs in eu-west-1 on three nodes.",
         "We moved the Tendril nightly backups to a bucket in eu-central-1."])], at="2026-03-02T10:00", session="s1")
    writer.close()
    model = AnthropicModel(model_id="claude-test-20250101", api_key="sk-ant-test-key", base_url=base_url,
                           timeout_s=5.0, max_retries=0)
    cfg = SoulConfig(turn=TurnConfig(model_rerank=model_rerank))
    return Soul("atlas", d, memory=mem, model=model, config=cfg), mem


def test_a_turn_with_the_model_stage_on_makes_one_bounded_call_through_the_sdk_before_its_reply(tmp_path: Path
                                                                                                ) -> None:
    q = "Where does the Tendril staging cluster run?"
    with MessagesApiServer(responder=lambda body: text_message("ok")) as api:  # the memory decision: no tool, ok
        soul, mem = _soul_with_claude(tmp_path / "on", api.base_url, 1)
        api.push(text_message("1, 0", input_tokens=700, output_tokens=4))
        api.push(text_message("In eu-west-1.", input_tokens=300, output_tokens=5))
        res = soul.turn(q, user="ana", at="2026-03-03T10:00")
        first, second = api.requests[0].body, api.requests[1].body
        assert res.reply == "In eu-west-1."
        assert first["max_tokens"] == MODEL_REPLY_TOKENS and "Passages:\n[0] " in first["messages"][-1]["content"]
        assert q in first["messages"][-1]["content"] and "[1] " in first["messages"][-1]["content"]
        assert "eu-west-1" in json.dumps(second["system"]) and second["messages"][-1]["content"] == q
        trace = soul.trace(res.turn_id)
        assert trace.usage["input_tokens"] >= 1000 and "rerank" in trace.timings_ms  # both calls counted
        soul.close()
        mem.close()
        # a failed call leaves recall's order and the turn answers; off (the default), no call is made
        soul, mem = _soul_with_claude(tmp_path / "fails", api.base_url, 1)
        api.requests.clear()
        api.push(error(400, "invalid_request_error"))
        api.push(text_message("In eu-west-1."))
        assert soul.turn(q, user="ana", at="2026-03-03T10:00").reply == "In eu-west-1."
        soul.close()
        mem.close()
        soul, mem = _soul_with_claude(tmp_path / "off", api.base_url, 0)
        api.requests.clear()
        api.push(text_message("In eu-west-1."))
        assert soul.turn(q, user="ana", at="2026-03-03T10:00").reply == "In eu-west-1."
        assert "Passages:" not in json.dumps(api.requests[0].body)
        soul.close()
        mem.close()


def test_a_question_over_time_lifts_what_the_asker_said_and_a_precise_one_does_not() -> None:
    said = [RecalledItem("episodic", f"ep-{i}", t, 0.66 if i == 0 else 0.6, (f"m{i}",), AT, actor)
            for i, (t, actor) in enumerate([
                ("Indexes on the captions database make its queries faster over time; here is how.", "assistant"),
                ("I moved the captions table to DynamoDB and set up a nightly ETL job.", "ana"),
                ("Materialized views help when the same aggregate is read often.", "assistant")])]
    spanning = "How did my work on the captions database evolve over time?"
    assert order(said, spanning)[0] != "ep-1"  # without the asker, read by its words only
    assert [it.id for it in rerank(said, spanning, asker="ana")][0] == "ep-1"
    assert [it.id for it in rerank(said, spanning, asker="lee")] == order(said, spanning)  # lee said none
    precise = "Which table did I move to DynamoDB?"
    assert [it.id for it in rerank(said, precise, asker="ana")] == order(said, precise)
    assert [it.id for it in rerank(said, spanning, RerankWeights(asker=0.0), asker="ana")] == order(said, spanning)
