"""Reconciliation by meaning: a candidate meets the stored fact it is about under another key, for every model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from soul_runtime.config import MemoryConfig
from soul_runtime.embedding.choice import default_embedder
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.fact_match import compatible, match_stored, value_kind
from soul_runtime.memory.semantic import SemanticStore
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.base import Exchange, MemoryDecision
from soul_runtime.models.offline import OfflineModel
from soul_runtime.records import Extraction, Fact, FactCandidate, Op, WriteRequest
from tests.fakes import HashEmbedder

T0 = 1_780_000_000.0


def fact(entity: str, attribute: str, value: str, display_attribute: str = "") -> Fact:
    return Fact(entity=entity, attribute=attribute, value=value, display_entity=entity,
                display_attribute=display_attribute or attribute.replace("_", " "), confidence=1.0, sources=("m0",),
                valid_from=T0)


def cand(entity: str, attribute: str, value: str, kind: str = "corrected", display_attribute: str = "") -> FactCandidate:
    return FactCandidate(entity, attribute, value, kind, ("m9",), entity, display_attribute or attribute.replace("_", " "))


def test_value_kinds() -> None:
    assert [value_kind(v) for v in ("October 2", "next Friday", "9:30", "Postgres 16", "version 4.2", "56 nodes",
                                    "Kubernetes")] == ["date", "date", "date", "version", "version", "number", "text"]
    assert compatible("Postgres 15", "Postgres 16") and not compatible("Postgres 15", "MySQL 8")
    assert compatible("40 nodes", "56 nodes") and not compatible("40 nodes", "56 users")
    assert not compatible("September 14", "Kubernetes") and compatible("Heroku", "Render")


def test_normalised_match_reads_entity_and_attribute_together_and_predicates_by_family() -> None:
    stored = [fact("atlas", "launch_date", "September 14"), fact("atlas", "owner", "Eli")]
    m = match_stored(cand("atlas launch", "schedule", "October 2"), stored)
    assert m is not None and m.fact.attribute == "launch_date" and m.how == "normalised"
    m = match_stored(cand("reporting service", "written_in", "Scala"), [fact("reporting service", "built_with", "Java")])
    assert m is not None and m.fact.attribute == "built_with"
    m = match_stored(cand("payments service", "maintained_by", "Bob"), [fact("payments service", "owner", "Alice")])
    assert m is not None and m.fact.attribute == "owner"


def test_no_match_across_kinds_of_value_heads_or_many_valued_attributes() -> None:
    assert match_stored(cand("atlas", "launch_date", "Kubernetes"), [fact("atlas", "schedule", "September 14")]) is None
    assert match_stored(cand("tendril", "staging_database", "MySQL"),
                        [fact("tendril", "production_database", "Postgres")], lambda q, ts: [0.99] * len(ts)) is None
    assert match_stored(cand("maya", "likes_jazz", "jazz", "stated", "likes"),
                        [fact("maya", "likes_hiking", "hiking", "likes")], lambda q, ts: [0.99] * len(ts)) is None
    assert match_stored(cand("orion", "schedule", "October 2"), [fact("atlas", "schedule", "May 1")]) is None


def test_meaning_match_needs_a_close_phrase_and_a_clear_winner() -> None:
    stored = [fact("sprint planning", "runs_on", "Monday mornings"), fact("sprint planning", "owner", "Ada")]
    close = lambda q, ts: [0.9 if "runs" in t else 0.2 for t in ts]  # noqa: E731
    m = match_stored(cand("sprint", "planning", "Tuesday afternoons"), stored, close)
    assert m is not None and m.how == "meaning" and m.fact.attribute == "runs_on"
    assert match_stored(cand("sprint", "planning", "Tuesday afternoons"), stored, lambda q, ts: [0.6] * len(ts)) is None
    assert match_stored(cand("sprint", "planning", "Tuesday afternoons"), stored, close, 1.0) is None  # meaning off
    two = [fact("sprint planning", "runs_on", "Monday mornings"), fact("sprint planning", "schedule_slot", "Friday")]
    assert match_stored(cand("sprint", "planning", "Tuesday afternoons"), two, lambda q, ts: [0.9] * len(ts)) is None


def _write(store: SemanticStore, c: FactCandidate, turn: str, at: float) -> Op:
    req = WriteRequest(turn_key=turn, now=at, actor="u", sources=(turn,), extraction=Extraction(facts=(c,)))
    return store.apply(req)[0].op


@pytest.mark.parametrize("embedder", [HashEmbedder(), default_embedder()], ids=["fast", "default"])
def test_the_store_updates_the_fact_a_correction_is_about(tmp_path: Path, embedder: object) -> None:
    st = SemanticStore(tmp_path, MemoryConfig(), embedder)  # type: ignore[arg-type]
    try:
        assert _write(st, cand("atlas", "launch_date", "September 14", "confirmed"), "t1", T0) is Op.ADD
        assert _write(st, cand("atlas launch", "schedule", "October 2"), "t2", T0 + 60) is Op.UPDATE
        facts = st.facts()
        assert [(f.entity, f.attribute, f.value) for f in facts] == [("atlas", "launch_date", "October 2")]
        assert [h.value for h in st.history("atlas", "launch_date")] == ["September 14", "October 2"]
        assert st.matches["normalised"] == 1
    finally:
        st.close()


def test_meaning_match_with_the_default_embedder(tmp_path: Path) -> None:
    st = SemanticStore(tmp_path, MemoryConfig(), default_embedder())
    try:
        _write(st, cand("sprint planning", "runs_on", "Monday mornings", "confirmed"), "t1", T0)
        assert _write(st, cand("sprint", "planning", "Tuesday afternoons"), "t2", T0 + 60) is Op.UPDATE
        assert [(f.attribute, f.value) for f in st.facts()] == [("runs_on", "Tuesday afternoons")]
        assert st.matches["meaning"] == 1
        _write(st, cand("sprint planning", "owner", "Ada", "confirmed"), "t3", T0 + 120)  # another fact of the thing
        assert sorted((f.attribute, f.value) for f in st.facts()) == [("owner", "Ada"), ("runs_on", "Tuesday afternoons")]
    finally:
        st.close()


class OwnWordsModel(OfflineModel):
    """A model (a Claude or user model would do the same) that names attributes in its own words."""

    said = {"The Atlas launch is on September 14.": cand("atlas", "launch_date", "September 14", "confirmed"),
            "It slipped to October 2.": cand("atlas launch", "when", "October 2")}

    def decide(self, exchange: Exchange) -> MemoryDecision:
        c = self.said.get(exchange.user_text)
        d = super().decide(exchange)
        if c is None:
            return d
        return dataclasses.replace(d, persist=True, categories=("fact",), extraction=Extraction(facts=(c,)))


def test_every_models_extraction_is_reconciled_the_same_way(tmp_path: Path) -> None:
    mem = SoulMemory(tmp_path, embedder=HashEmbedder())
    soul = Soul("own-words", tmp_path, memory=mem, model=OwnWordsModel())
    try:
        for i, text in enumerate(OwnWordsModel.said):
            soul.turn(text, user="Eli", at=T0 + 60 * i)
        assert [(f.entity, f.attribute, f.value) for f in mem.facts()] == [("atlas", "launch_date", "October 2")]
    finally:
        soul.close()
        mem.close()
