"""The offline model's clause reading: openings, pronouns, and predicates with typed values."""

from __future__ import annotations

import pytest

from soul_runtime.models import offline_rules as rules


@pytest.mark.parametrize("text,rest,marked", [
    ("FYI, the cache is Redis.", "FYI, the cache is Redis.", ""),  # a comma lead-in: see below
    ("Heads-up: the cache is Redis.", "The cache is Redis.", ""),
    ("One more thing you should know: the cache is Redis.", "The cache is Redis.", ""),
    ("Hmm, no — the cache is Redis.", "The cache is Redis.", "no"),
    ("Nope. The cache is Redis.", "The cache is Redis.", "no"),
    ("Update: the cache is Redis.", "The cache is Redis.", "fix"),
    ("Revised — the cache is Redis.", "The cache is Redis.", "fix"),
    ("My favourite book: Dune.", "My favourite book: Dune.", ""),  # an attribute and its value, not a label
    ("Confirmed: the cache is Redis.", "Confirmed: the cache is Redis.", ""),
    ("No worries, talk soon.", "No worries, talk soon.", ""),
])
def test_openings(text: str, rest: str, marked: str) -> None:
    assert rules.read_opening(text) == (rest, marked)


def test_a_comma_lead_in_before_a_statement_is_dropped() -> None:
    for clause in ("FYI, the cache is Redis", "To be fair, the cache is Redis", "We grew, so the cache is Redis"):
        assert [(s.entity, s.value) for s in rules.parse_statements(clause, "Kim")] == [("cache", "Redis")], clause


def test_pronouns_name_the_thing_or_person_last_named() -> None:
    assert rules.last_thing("Gizmo is our deploy tool.") == "Gizmo"
    assert rules.last_thing("Say hello to Quill, the new linter.") == "Quill"
    assert rules.last_thing("It runs on Lambda.") == ""  # about "it": the thing stays what it was
    assert rules.last_person("We brought on Marco Diaz as a contractor.") == "Marco Diaz"
    assert rules.last_person("My sister lives in Dublin.") == ""  # a place, not a person
    assert rules.resolve_pronouns("It's written in Ruby", "Gizmo", "") == "Gizmo is written in Ruby"
    assert rules.resolve_pronouns("it's 16", "Gizmo", "") == "it's 16"  # a bare value: resolved against facts
    assert rules.resolve_pronouns("It runs on Lambda", "Gizmo", "") == "Gizmo runs on Lambda"
    for clause in ("It's important to help", "It can be rewarding", "It sounds fun", "It's great to be here"):
        assert rules.resolve_pronouns(clause, "Maria", "") == clause  # no fact of a thing
    assert rules.as_first_person("She works from Turin") == "I work from Turin"
    assert rules.as_first_person("He's based in Oslo") == "I'm based in Oslo"


@pytest.mark.parametrize("clause,expected", [
    ("The fleet has 30 trucks", ("fleet", "trucks", "30 trucks")),
    ("The e-reader has 16 GB of storage", ("e-reader", "storage", "16 GB of storage")),
    ("The plugin requires Python 3.11", ("plugin", "requires", "Python 3.11")),
    ("The billing API is owned by the Finance team", ("billing API", "owner", "the Finance team")),
    ("Ravi owns the release checklist", ("release checklist", "owner", "Ravi")),
    ("The subscription costs 9 euros a month", ("subscription", "price", "9 euros a month")),
    ("The driver is version 2.4", ("driver", "version", "version 2.4")),
])
def test_predicates_name_the_attribute_from_the_predicate(clause: str, expected: tuple[str, str, str]) -> None:
    (st,) = rules.parse_statements(clause, "Kim")
    assert (st.entity, st.attribute, st.value) == expected


def test_dates_are_schedule_values_and_change_verbs_carry_the_new_value() -> None:
    (st,) = rules.parse_statements("The review is on 3 March", "Kim")
    assert (st.attribute, st.value) == ("schedule", "3 March")
    (st,) = rules.parse_statements("The workshop is next Monday", "Kim")
    assert (st.attribute, st.value) == ("schedule", "next Monday")
    for clause, value in (("The review slipped to 10 March", "10 March"), ("The fee went up to 12 euros", "12 euros"),
                          ("The CRM was replaced by Pipedrive", "Pipedrive"),
                          ("Ravi took over the checklist from Ana", "Ravi")):
        chg = rules.parse_change(clause)
        assert chg is not None and chg.value == value, clause
