"""A long memory is shown by the part that answers the question; later figures rank above earlier ones; a fact
correction takes out of recall only the units of a long message that state the replaced value."""

from __future__ import annotations

from pathlib import Path

from soul_runtime.clock import DAY
from soul_runtime.loop.context import (
    FULL_LINES,
    FULL_LINES_OVER_TIME,
    SHORT_CHARS,
    full_lines,
    memory_line,
    pack_memory,
)
from soul_runtime.loop.excerpt import excerpt, query_weights
from soul_runtime.loop.rerank import OFF
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.policy_episodic import later_figures_first
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.offline import OfflineModel
from soul_runtime.records import Extraction, RecalledItem, WriteRequest
from tests.fakes import HashEmbedder

T0 = 1_780_000_000.0

CODE = ("```python\nfrom notifier_client import Client\n\n\ndef make_client(env: str) -> Client:\n"
        "    return Client(env, pool_size=64, prefetch=100, keepalive=64, max_connections=209)\n"
        "    # step 0: check the quota\n    # step 1: emit a metric\n```")
OTHER_CODE = CODE.replace("notifier", "gateway").replace("209", "61").replace("prefetch=100", "timeout=118")
TABLE = ("Measured throughput of uploader this week:\n\n| service | throughput | change |\n|---|---|---|\n"
         "| renderer | 1779 req/s | +26% |\n| notifier | 3965 req/s | +2% |\n| checkout | 5177 req/s | -13% |\n"
         "| uploader | 1269 req/s | +16% |\n| exporter | 7512 req/s | -16% |")


def test_a_code_block_is_shown_by_the_setting_asked_about_and_the_line_naming_its_subject() -> None:
    q = "What max_connections did we set in the notifier client?"
    got = excerpt(CODE, query_weights(q, [CODE, OTHER_CODE]), 160)
    assert got is not None and len(got) <= 160
    assert "max_connections=209" in got and "notifier_client" in got
    assert got.index("notifier_client") < got.index("max_connections")  # pieces keep the text's order


def test_a_table_is_shown_by_its_heading_and_the_row_asked_about() -> None:
    got = excerpt(TABLE, query_weights("What throughput did we measure for uploader?", [TABLE]), 160)
    assert got is not None and "1269 req/s" in got and "Measured throughput of uploader" in got
    assert "7512" not in got


def test_a_long_line_is_cut_around_what_was_asked() -> None:
    line = "return Client(" + ", ".join(f"setting_{i}={i}" for i in range(40)) + ", keepalive=120)"
    got = excerpt(line, query_weights("What keepalive did we set?", [line]), 80)
    assert got is not None and "keepalive=120" in got and got.startswith("\u2026") and len(got) <= 82


def test_a_memory_without_the_questions_words_keeps_its_first_sentence() -> None:
    text = "The dashboards look calm today. " * 8
    assert excerpt(text, query_weights("max_connections notifier", [text]), 160) is None
    it = RecalledItem("episodic", "ep-1", text, 0.5, ("m1",), T0)
    weights = query_weights("max_connections notifier", [text])
    assert memory_line(it, T0, short=True, weights=weights) == memory_line(it, T0, short=True)


def test_packing_with_the_question_shows_the_figure_a_short_line_would_cut() -> None:
    filler = [RecalledItem("episodic", f"ep-{i}", f"Short note number {i} about the rollout.", 0.9, (f"m{i}",), T0)
              for i in range(FULL_LINES)]
    code = CODE.replace("def make_client", "# the notifier's client, built once per process and shared by the request "
                                           "handlers, the batch jobs and the retry worker\ndef make_client")
    assert code.index("max_connections") > SHORT_CHARS
    unit = RecalledItem("episodic", "ep-99", code, 0.89, ("m99",), T0)
    q = "What max_connections did we set in the notifier client?"
    packed = pack_memory([*filler, unit], 1000, T0 + DAY, q)
    shown = "\n".join(line for _, line in packed)
    assert "max_connections=209" in shown
    assert all(len(it.text) > SHORT_CHARS for it, _ in packed if it.id == "ep-99")  # shown by its excerpt
    without = "\n".join(line for _, line in pack_memory([*filler, unit], 1000, T0 + DAY))
    assert "max_connections=209" not in without  # without a question, a code block is shown by its opening


def test_a_later_figure_ranks_above_the_earlier_one_it_restates() -> None:
    q = "What is the p95 latency of uploader now?"
    texts = ["The p95 latency of uploader is 52 ms on the current build.",
             "Update on uploader: after the fix, its p95 latency is now 41 ms (it was 52 ms).",
             "The p95 latency of search is 230 ms."]
    ats = [T0, T0 + 5 * DAY, T0 + DAY]
    got = later_figures_first(q, texts, ats, [0.80, 0.70, 0.75])
    assert got[0] < got[1] and got[2] == 0.75  # the earlier statement just below the later one; others as they were
    assert later_figures_first(q, texts[:1] + texts[2:], [T0, T0 + DAY], [0.8, 0.75]) == [0.8, 0.75]
    same = ["The p95 latency of uploader is 52 ms.", "The p95 latency of uploader is 52 ms."]
    assert later_figures_first(q, same, [T0, T0 + DAY], [0.8, 0.7]) == [0.8, 0.7]  # nothing restated


def test_recall_shows_the_latest_figure_first_and_keeps_the_earlier_one(tmp_path: Path) -> None:
    mem = SoulMemory(tmp_path, embedder=HashEmbedder())
    soul = Soul("dev", tmp_path, memory=mem, model=OfflineModel())
    soul.observe([{"speaker": "maya", "text": "Measured today: the p95 latency of uploader is 52 ms on the current "
                   "build, after the cache change.", "id": "m1", "at": T0}], session="s1")
    soul.observe([{"speaker": "maya", "text": "Good news on uploader: after the pool fix its p95 latency is 41 ms, "
                   "measured this morning.", "id": "m2", "at": T0 + 9 * DAY}], session="s2")
    hits = [h for h in mem.recall("What is the p95 latency of uploader now?", 10, at=T0 + 10 * DAY)
            if h.store == "episodic"]
    latest = [i for i, h in enumerate(hits) if "41 ms" in h.text]
    earlier = [i for i, h in enumerate(hits) if "52 ms" in h.text]
    assert latest and earlier and latest[0] < earlier[0], [h.text for h in hits]
    assert any("52 ms" in e.summary for e in mem.episodes())  # history stays
    soul.close()
    mem.close()


def _unit_request(turn_key: str, text: str, source: str) -> WriteRequest:
    return WriteRequest(turn_key=turn_key, now=T0, actor="maya", sources=(source,), session="s1",
                        extraction=Extraction(episode=text, event=True))


def test_a_replaced_value_takes_out_only_the_units_that_state_it(tmp_path: Path) -> None:
    mem = SoulMemory(tmp_path, embedder=HashEmbedder())
    units = {"t1": "The production database for tendril is Postgres 15 on the primary.",
             "t1#u1": "Pinned in requirements: fastapi==0.110.2 and orjson==3.9.15 for billing.",
             "t1#u2": "For tendril the database is Postgres 15, with a replica in the second zone.",
             "t1#u3": "| gateway | 41 ms | +3% |"}
    mem.episodic.apply_many([_unit_request(k, v, "m1") for k, v in units.items()])
    mem.episodic.apply_many([_unit_request("t2", "Later note about the backlog grooming.", "m2")],
                            supersede_sources=["m1"], supersede_values=["Postgres 15"])
    live = {h.text for h in mem.recall("fastapi orjson postgres tendril gateway database", 20, at=T0 + 60)}
    assert units["t1#u1"] in live and units["t1#u3"] in live  # the rest of the message still holds
    assert units["t1#u2"] not in live and units["t1"] not in live  # what stated the old value left recall
    assert {e.summary for e in mem.episodes()} >= set(units.values())  # history keeps them all
    mem.close()


def test_a_question_over_time_shows_more_memories_whole() -> None:
    """A summary's words name its subject, not what was said about it: more of the best memories are shown whole
    for it than for a precise question, the others by their excerpt as before."""
    said = [f"In that session the fetcher's work went on: {', '.join(f'change{i}{c}' for c in 'abcdefghijklmnopq')}."
            for i in range(20)]  # each says something of its own (none repeats another)
    units = [RecalledItem("episodic", f"ep-{i}", text, 0.9 - i / 100, (f"m{i}",), T0 + i * DAY)
             for i, text in enumerate(said)]
    assert all(len(it.text) > SHORT_CHARS for it in units)

    def whole(q: str, **kw: int) -> int:
        return sum(line.endswith(it.text) for it, line in pack_memory(units, 5000, T0 + 40 * DAY, q, OFF, **kw))

    assert full_lines("What port does the fetcher use?") == FULL_LINES
    assert full_lines("Can you summarize how the garden project progressed?") == FULL_LINES_OVER_TIME > FULL_LINES
    assert whole("What port does the fetcher use?") == FULL_LINES
    assert whole("Can you summarize how the garden project progressed?") == FULL_LINES_OVER_TIME
    assert whole("Can you summarize how the garden project progressed?", full_over_time=FULL_LINES) == FULL_LINES
