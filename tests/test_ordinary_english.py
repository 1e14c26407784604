"""The ordinary-English fact benchmark: its judge, and the offline model's figure on the corpus."""

from __future__ import annotations

from pathlib import Path

from soul_apps.bench import ordinary_english as oe

CORPUS = oe.load(Path(__file__).parent / "fixtures" / "ordinary_english.jsonl")
ATLAS = {"expect": [{"about": ["atlas", "atlas launch"], "attribute": ["date", "when"], "value": ["October 2"]}],
         "stale": ["September 14"]}


def test_the_judge_maps_attributes_by_meaning_not_by_one_key() -> None:
    for fact in (("atlas", "launch_date", "October 2"), ("atlas launch", "date", "october 2"),
                 ("atlas", "launch when", "October 2.")):
        assert oe.judge(ATLAS, [fact])[0], fact
    assert not oe.judge(ATLAS, [("atlas", "owner", "October 2")])[0]  # no acceptable attribute name
    assert not oe.judge(ATLAS, [("orion", "launch_date", "October 2")])[0]  # another thing
    assert not oe.judge(ATLAS, [("atlas", "launch_date", "October 3")])[0]  # another value


def test_a_stale_value_fails_the_case_and_extras_are_counted() -> None:
    right = ("atlas", "launch_date", "October 2")
    assert not oe.judge(ATLAS, [right, ("atlas launch", "description", "September 14")])[0]
    assert oe.judge(ATLAS, [right, ("atlas", "owner", "Eli")]) == (True, 1)


def test_a_case_expecting_nothing_passes_only_with_no_fact() -> None:
    case = {"expect": [], "stale": []}
    assert oe.judge(case, []) == (True, 0)
    assert oe.judge(case, [("ceo", "car", "Tesla")]) == (False, 1)


def test_the_corpus_has_its_classes_and_a_fixed_split() -> None:
    kinds = {c["kind"] for c in CORPUS}
    assert len(CORPUS) >= 200 and len(kinds) >= 10
    for kind in kinds:  # within each kind every second case is held apart
        splits = [c["split"] for c in CORPUS if c["kind"] == kind]
        assert splits == ["dev" if i % 2 == 0 else "held" for i in range(len(splits))]
    for c in CORPUS:
        for e in c["expect"]:
            assert e["about"] and e["attribute"] and e["value"], c["id"]
