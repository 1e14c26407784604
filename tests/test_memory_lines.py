"""Memories that carry the answer: dated lines, relative dates made absolute, packing by value per token,
time-scoped questions ("when did …", "… three sessions ago") answered from dated memories."""

from __future__ import annotations

from pathlib import Path

from soul_runtime.clock import DAY, to_timestamp
from soul_runtime.loop.context import MIN_LINE_TOKENS, line_tokens, memory_line, pack_memory
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.base import ChatMessage, Exchange, read_memory_lines
from soul_runtime.models.claude import memory_block
from soul_runtime.models.offline import OfflineModel
from soul_runtime.records import RecalledItem
from soul_runtime.timeref import TimeScope, ago, query_scope, resolve_relative
from tests.fakes import HashEmbedder

SAT = to_timestamp("2023-07-15T13:00")  # a Saturday
M = OfflineModel()


def test_relative_dates_resolve_against_the_message_time() -> None:
    cases = {
        "I went to a salsa class yesterday.": "I went to a salsa class on 14 July 2023.",
        "We held a bake sale last Sunday": "We held a bake sale on Sunday 9 July 2023",
        "Last week I gave a talk at a school.": "The week before 15 July 2023 I gave a talk at a school.",
        "I painted that last year!": "I painted that in 2022!",
        "We moved here 4 years ago.": "We moved here 4 years ago (in 2019).",
        "I signed up 3 days ago": "I signed up on 12 July 2023",
        "Going camping next month": "Going camping in August 2023",
        "We went two weekends ago": "We went two weekends before 15 July 2023",
        "Since yesterday it rains": "Since 14 July 2023 it rains",
    }
    for text, want in cases.items():
        assert resolve_relative(text, SAT) == want, text
    assert resolve_relative("Nothing relative here, 2021.", SAT) == "Nothing relative here, 2021."


def test_how_long_ago_only_while_it_helps() -> None:
    assert ago(SAT, SAT + 3600) == "today" and ago(SAT, SAT + DAY) == "yesterday"
    assert ago(SAT, SAT + 5 * DAY) == "5 days ago" and ago(SAT, SAT + 21 * DAY) == "3 weeks ago"
    assert ago(SAT, SAT + 200 * DAY) == "" and ago(SAT + DAY, SAT) == ""


def test_time_scope_of_a_question() -> None:
    assert query_scope("What happened three sessions ago?", SAT) == TimeScope(sessions_ago=3)
    assert query_scope("what did we discuss in the last session", SAT) == TimeScope(sessions_ago=1)
    y = query_scope("What did I do yesterday?", SAT)
    assert y is not None and y.since is not None and y.until is not None and y.since < SAT - DAY < y.until <= SAT
    assert query_scope("What is Ana's dog called?", SAT) is None


def item(i: int, text: str, score: float, at: float = SAT, store: str = "episodic") -> RecalledItem:
    return RecalledItem(store, f"ep-{i}" if store == "episodic" else f"x:{i}", text, score, (f"D{i}",), at)


def test_memory_line_says_when() -> None:
    line = memory_line(item(3, "Ana adopted a beagle named Biscuit.", 0.5), SAT + 2 * DAY)
    assert line == "15 July 2023 (2 days ago): Ana adopted a beagle named Biscuit."
    assert memory_line(item(3, "Ana adopted a beagle.", 0.5), SAT + 300 * DAY).startswith("15 July 2023: ")
    fact = RecalledItem("semantic", "ana:dog", "Ana dog: Biscuit", 0.9, ("D1",), SAT)
    assert memory_line(fact, SAT) == "[semantic ana:dog] Ana dog: Biscuit"


def test_a_day_is_written_once_the_best_day_first() -> None:
    fact = RecalledItem("semantic", "ana:dog", "Ana dog: Biscuit", 0.4, ("D9",), SAT)
    recalled = [item(1, "Ana walked Biscuit by the lake.", 0.6, SAT + DAY), item(2, "Ana adopted Biscuit.", 0.5),
                fact, item(3, "Biscuit chewed a shoe.", 0.45, SAT + DAY + 3600), item(4, "Ana bought a lead.", 0.44)]
    packed = pack_memory(recalled, 1000, SAT + 3 * DAY)
    assert [line for _, line in packed] == [
        "[semantic ana:dog] Ana dog: Biscuit",
        "16 July 2023 (2 days ago): Ana walked Biscuit by the lake.",
        "  Biscuit chewed a shoe.",
        "15 July 2023 (3 days ago): Ana adopted Biscuit.",
        "  Ana bought a lead."]
    assert [it.id for it, _ in packed] == ["ana:dog", "ep-1", "ep-3", "ep-2", "ep-4"]
    lines = tuple(line for _, line in packed)
    assert [(m.store, m.id, m.text) for m in read_memory_lines(lines)] == [
        ("semantic", "ana:dog", "Ana dog: Biscuit"), ("episodic", "16 July 2023", "Ana walked Biscuit by the lake."),
        ("episodic", "16 July 2023", "Biscuit chewed a shoe."), ("episodic", "15 July 2023", "Ana adopted Biscuit."),
        ("episodic", "15 July 2023", "Ana bought a lead.")]
    assert memory_block(lines).splitlines()[4:6] == ["- 15 July 2023 (3 days ago): Ana adopted Biscuit.",
                                                     "  - Ana bought a lead."]
    # the budget counts the date once per day: what fits with dates repeated is less than what fits here
    budget = sum(line_tokens(line) for line in lines)
    assert len(pack_memory(recalled, budget, SAT + 3 * DAY)) == 5
    assert sum(line_tokens(memory_line(it, SAT + 3 * DAY)) for it in recalled) > budget


def test_a_scrap_is_not_worth_more_than_a_passage() -> None:
    scrap = item(1, "4.", 0.50)  # a list's number, recalled for a question word it sits beside
    passage = item(2, "Ana moved the team's builds to a self-hosted runner in the Oslo office basement.", 0.52)
    budget = line_tokens(memory_line(passage)) + 1
    assert line_tokens(memory_line(passage)) < MIN_LINE_TOKENS
    assert [it.id for it, _ in pack_memory([scrap, passage], budget)] == ["ep-2"]


def test_packing_by_value_per_token_within_the_budget() -> None:
    long_low = item(1, "A long and only loosely related memory " * 6, 0.50)
    short_hi = [item(i, f"Short relevant memory number {i}.", 0.48) for i in range(2, 6)]
    recalled = [long_low, *short_hi]
    budget = sum(line_tokens(memory_line(it)) for it in short_hi) + 5
    packed = pack_memory(recalled, budget)
    assert [it.id for it, _ in packed] == ["ep-2", "ep-3", "ep-4", "ep-5"]  # four short lines beat one long line
    assert sum(line_tokens(line) for _, line in packed) <= budget
    top = item(9, "The one that matters most. " * 3, 0.9)
    packed = pack_memory([*short_hi, top], budget)
    assert packed[-1][0].id == "ep-9"  # a clearly more relevant line is worth its tokens; recall order is kept
    assert pack_memory(recalled, 0) == []


def test_a_line_that_says_again_what_is_shown_gives_its_room_to_one_that_does_not() -> None:
    advice = "Run the migration in a transaction and keep a backup of the orders table before you start."
    again = item(2, "Keep a backup of the orders table and run the migration in a transaction before you start.", 0.58)
    other = item(3, "Ana moved the nightly builds to the runner in the Oslo office.", 0.40)
    recalled = [item(1, advice, 0.6), again, other]
    fits_two = line_tokens(memory_line(recalled[0])) + line_tokens(memory_line(again)) + 2
    assert line_tokens(memory_line(other)) <= line_tokens(memory_line(again))
    # the same advice from another message is left out: the budget reaches the line that says something else
    assert [it.id for it, _ in pack_memory(recalled, fits_two)] == ["ep-1", "ep-3"]
    # a line with a figure the shown one lacks is no repeat, however many words they share
    price = [item(1, "Ana paid 40 dollars for the blue lead at the pet shop.", 0.6),
             item(2, "Ana paid 45 dollars for the blue lead at the pet shop.", 0.58)]
    assert [it.id for it, _ in pack_memory(price, 1000)] == ["ep-1", "ep-2"]
    # sharing some words is not repeating: both lines are shown
    near = [item(1, "Ana moved the nightly builds to the runner in the Oslo office.", 0.6),
            item(2, "Ana moved the weekly reports to the shared drive in the Oslo office.", 0.58)]
    assert [it.id for it, _ in pack_memory(near, 1000)] == ["ep-1", "ep-2"]
    # a fact is shown whatever an episode said: the model names it by its id to correct it
    fact = item(7, "Tendril production database: Postgres 15", 0.5, store="semantic")
    said = item(8, "maya confirmed: Tendril's production database is Postgres 15.", 0.6)
    assert {it.id for it, _ in pack_memory([said, fact], 1000)} == {"ep-8", "x:7"}
    # while an episode that says what a fact shown says gives its room away
    again = item(8, "The production database of Tendril is Postgres 15.", 0.5)
    assert [it.id for it, _ in pack_memory([item(7, fact.text, 0.6, store="semantic"), again], 1000)] == ["x:7"]


def ex(text: str, speaker: str, at: float = SAT, history: tuple[ChatMessage, ...] = ()) -> str:
    return M.decide(Exchange(text, "", speaker, ("m1",), at, history=history)).extraction.episode


def test_episode_keeps_the_specifics_of_every_sentence() -> None:
    e = ex("Thanks so much! It was great. I moved from Chile four years ago and I still miss my grandma's "
           "garden in Valdivia. You're so sweet to ask!", "Ana")
    assert "Chile" in e and "Valdivia" in e and "2019" in e  # not only the first sentence
    assert "sweet" not in e  # a compliment is not a memory
    e = ex("Wow, that's cool! I went to a salsa class yesterday and met a dancer named Lu.", "Ana")
    assert e == "Ana went to a salsa class on 14 July 2023 and met a dancer named Lu."


def test_a_told_task_keeps_what_its_task_line_leaves_out() -> None:
    d = M.decide(Exchange("Repotted the fig tree yesterday: dug it out, trimmed the roots, added fresh soil. Worked "
                          "fine. The new pot is terracotta from Lisbon.", "", "Ana", ("m1",), SAT))
    task, e = d.extraction.task, d.extraction.episode
    assert task is not None and task.steps == ("dug it out", "trimmed the roots", "added fresh soil")
    assert "14 July 2023" in e and "Lisbon" in e  # the date and the place are not in the task line
    assert "the task 'repotted fig tree' (success)" in e  # the line later runs are recognised by stays
    d = M.decide(Exchange("Repotted the fig tree: dug it out, trimmed the roots, added fresh soil. Worked fine.", "",
                          "Ana", ("m1",), SAT))
    assert d.extraction.episode == "Ana did the task 'repotted fig tree' (success): dug it out; trimmed the roots; added fresh soil."


def test_elliptic_reply_is_stored_with_its_question() -> None:
    q = ChatMessage("user", "That's lovely! Where did you go last weekend?", "D2:4", "Ben")
    e = M.decide(Exchange("The lake district, with my sister.", "", "Ana", ("D2:5",), SAT, history=(q,))).extraction
    assert e.episode.startswith('Asked "Where did Ana go the weekend before 15 July 2023?", Ana said: ')
    assert "lake district" in e.episode and "Ana's sister" in e.episode
    assert e.extra_sources == ("D2:4",)


def soul_with_sessions(tmp: Path) -> tuple[Soul, SoulMemory]:
    mem = SoulMemory(tmp, embedder=HashEmbedder())
    soul = Soul("atlas", tmp, memory=mem, model=OfflineModel())
    days = ["I went to a climbing meetup yesterday and it was so much fun.",
            "I baked a lemon tart for my neighbour Priya.",
            "We adopted a grey kitten called Pebble this morning.",
            "I finished the first draft of my thesis on river ecology.",
            "I repaired the old bicycle in the garage."]
    for i, text in enumerate(days):
        soul.observe([{"speaker": "Robin", "text": text, "id": f"D{i + 1}:1"}], at=SAT + i * 7 * DAY,
                     session=f"session_{i + 1}")
    return soul, mem


def test_when_did_is_answered_from_a_dated_memory(tmp_path: Path) -> None:
    soul, mem = soul_with_sessions(tmp_path)
    r = soul.turn("When did Robin go to the climbing meetup?", user="sam", at=SAT + 40 * DAY)
    assert "14 July 2023" in r.reply  # the day before the message that said "yesterday"
    assert r.recalled and r.recalled[0].sources == ("D1:1",)
    soul.close()
    mem.close()


def test_what_happened_three_sessions_ago(tmp_path: Path) -> None:
    soul, mem = soul_with_sessions(tmp_path)
    # four sessions back from the newest (session_5) is session_1; three back is session_2
    items = mem.recall("What happened three sessions ago?", 10, at=SAT + 40 * DAY)
    assert items[0].sources == ("D2:1",) and "lemon tart" in items[0].text
    r = soul.turn("What happened three sessions ago?", user="sam", at=SAT + 40 * DAY)
    assert "lemon tart" in r.reply and "22 July 2023" in r.reply
    assert "kitten" not in r.reply
    soul.close()
    mem.close()


def test_a_timestamps_day_is_the_utc_day_datetime_gives_to_the_microsecond() -> None:
    import random
    from datetime import datetime, timezone

    from soul_runtime.timeref import _day

    rng = random.Random(11)
    near_midnight = [k * 86_400 + d for k in (-3, -1, 0, 1, 19_000, 20_500) for d in
                     (-1e-6, -6e-7, -5e-7, -4e-7, -1e-7, 0.0, 1e-7, 4e-7, 5e-7, 6e-7)]
    spread = [rng.uniform(-6.2e10, 2.5e11) for _ in range(5000)]
    for ts in near_midnight + spread:
        assert _day(ts) == datetime.fromtimestamp(ts, tz=timezone.utc).date(), ts
