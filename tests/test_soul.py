"""The turn loop in process: budgets, sessions, traces, write intents (offline model, test embedder)."""

from __future__ import annotations

from pathlib import Path

from soul_runtime.clock import DAY
from soul_runtime.config import SoulConfig, TurnConfig
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.offline import OfflineModel
from soul_runtime.text import estimate_tokens
from tests.fakes import HashEmbedder

T0 = 1_780_000_000.0


def make(tmp: Path, **turn: int) -> tuple[Soul, SoulMemory]:
    mem = SoulMemory(tmp, embedder=HashEmbedder())
    cfg = SoulConfig(turn=TurnConfig(**turn)) if turn else SoulConfig()
    return Soul("atlas", tmp, memory=mem, model=OfflineModel(), config=cfg), mem


def test_turn_300_stays_under_budget_and_the_buffer_holds_only_the_session(tmp_path: Path) -> None:
    soul, mem = make(tmp_path, context_tokens=2000, reply_tokens=300, memory_tokens=400)
    soul.turn("Yesterday's session: the staging cluster for Orca is called Juniper.", user="maya", at=T0 - DAY)
    start = T0
    for i in range(300):
        text = (f"Note {i}: the build for service{i % 40} finished in {i % 17} minutes and the canary for region "
                f"{i % 5} looked healthy, so we promoted it to production after checking dashboards.")
        r = soul.turn(text, user="maya", at=start + 60 * i)
    trace = soul.trace(r.turn_id)
    t = trace.tokens
    assert t["total"] <= t["budget"] == 2000
    assert t["system"] + t["memory"] + t["buffer"] + t["user"] + t["reply_budget"] == t["total"]
    assert t["memory"] <= 400
    buf = soul.state.buffer
    assert buf.tokens() <= 2000
    assert all(turn.at >= start for turn in buf.turns)  # yesterday's session is gone from the buffer
    assert not any("Juniper" in turn.text for turn in buf.turns)
    assert any("Juniper" in it.text for it in mem.recall("Orca staging cluster", 5, at=start + DAY))


def test_a_long_pause_starts_a_new_session(tmp_path: Path) -> None:
    soul, _ = make(tmp_path)
    soul.turn("The release train for Orca is Thursday.", user="maya", at=T0)
    soul.turn("It ships from the main branch.", user="maya", at=T0 + 60)
    session = soul.state.buffer.session
    soul.turn("Good morning again.", user="maya", at=T0 + DAY)
    assert soul.state.buffer.session != session and len(soul.state.buffer.turns) == 2


def test_trace_records_exactly_what_was_passed_to_the_model(tmp_path: Path) -> None:
    soul, _ = make(tmp_path)
    soul.turn("The production database for Tendril is Postgres 15.", user="maya", at=T0)
    soul.turn("Correct.", user="maya", at=T0 + 60)
    r = soul.turn("Which database does Tendril use in production?", user="maya", at=T0 + 120)
    tr = soul.trace(r.turn_id)
    assert tr.recalled == r.recalled and tr.recalled  # the same items, ids, scores — no second query
    assert r.recalled[0].store == "semantic" and r.recalled[0].id in r.reply
    assert set(tr.timings_ms) >= {"buffer_read", "recall", "assemble", "inference", "persist_decision", "write"}
    assert tr.model.endswith("(offline)") and r.offline
    assert tr.usage["calls"] >= 2 and tr.tokens["memory"] > 0
    assert [t.turn_id for t in soul.traces(2)] == [f"atlas/{r.seq - 1}", r.turn_id]


def test_chit_chat_and_short_turns_write_nothing(tmp_path: Path) -> None:
    soul, mem = make(tmp_path)
    for text in ("ok", "Thanks!", "Hey, how are you doing today?", "lol"):
        r = soul.turn(text, user="maya", at=T0)
        assert r.writes == () or all(w.op.value == "NOOP" for w in r.writes), (text, r.writes)
    assert mem.stats()["episodes"] == 0


def test_a_crash_between_intent_and_writes_is_completed_on_reactivation(tmp_path: Path) -> None:
    soul, mem = make(tmp_path)

    class Boom(Exception):
        pass

    real = mem.write_many

    def crash(reqs):  # the process dies after the intent is durable, before the stores see the writes
        raise Boom()
    mem.write_many = crash  # type: ignore[method-assign]
    try:
        soul.turn("Confirmed: the owner of Svc7 is team Falcon.", user="maya", at=T0, request_id="r1")
    except Boom:
        pass
    assert soul.last_seq == 0 and mem.facts() == []
    mem.write_many = real  # type: ignore[method-assign]
    again = Soul("atlas", tmp_path, memory=mem, model=OfflineModel())  # reactivation recovers the intent
    assert again.last_seq == 1 and [f.value for f in mem.facts()] == ["team Falcon"]
    r = again.turn("Confirmed: the owner of Svc7 is team Falcon.", user="maya", at=T0, request_id="r1")
    assert r.seq == 1  # the retried request returns the completed turn, applied once
    assert len(mem.episodes()) == 1
    assert estimate_tokens("x") == 1


def test_a_buffer_checkpoint_is_plain_msgpack_and_reads_back() -> None:
    import msgpack

    from soul_runtime.loop.buffer import BufferTurn, ShortTermBuffer

    for n in (0, 1, 15, 16, 300):  # a fixed-size and a 16-bit array header
        turns = [BufferTurn("user" if i % 2 else "assistant", f"sp{i % 3}", "héllo wörld " * (i % 7), f"t/{i}",
                            T0 + i) for i in range(n)]
        buf = ShortTermBuffer("s9", turns, 10**9)
        plain = msgpack.packb({"session": "s9", "max_tokens": 10**9,
                               "turns": [[t.role, t.speaker, t.text, t.id, t.at] for t in turns]}, use_bin_type=True)
        assert buf.to_bytes() == plain
        back = ShortTermBuffer.from_bytes(plain)
        assert back == buf and back.tokens() == sum(estimate_tokens(t.text) + 4 for t in turns)
        assert [(m.role, m.content, m.id, m.speaker) for m in back.chat()] == [
            (t.role, t.text, t.id, t.speaker) for t in turns]
