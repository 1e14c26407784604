"""The Ray runtime end to end on a real local Ray: handles, ordering, passivation, hot souls, metrics."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest

from soul_apps.cli.scenario import SCENARIO, USER
from soul_runtime.errors import InvalidInput, NotFound
from tests.fakes import disk_hits

pytestmark = pytest.mark.ray


def play_day(soul, day) -> list:
    return [soul.turn(text, user=USER, at=day.date.timestamp() + 60 * i) for i, text in enumerate(day.turns)]


def test_scenario_layers_after_each_day(runtime, soul_id) -> None:
    s = runtime.soul(soul_id)
    play_day(s, SCENARIO[0])
    facts = {f"{f.entity}:{f.attribute}": f.value for f in s.facts()}
    assert facts["tendril:production_database"] == "Postgres 15"
    assert facts["maya:role"] == "senior SRE"
    assert s.procedures() == []
    assert s.stats()["episodes"] >= 4

    play_day(s, SCENARIO[1])
    assert {f.attribute: f.value for f in s.facts("tendril")}["production_database"] == "Postgres 16"
    hist = s.fact_history("tendril", "production_database")
    assert [h.value for h in hist] == ["Postgres 15", "Postgres 16"] and hist[0].sources

    results = play_day(s, SCENARIO[2])
    (proc,) = s.procedures("draft postmortem")
    assert proc.version == 1 and proc.status == "active" and len(proc.sources) == 3
    question = next(r for r in results if "Which Postgres" in s.trace(r.turn_id).query)
    assert "Postgres 16" in question.reply and "Postgres 15" not in question.reply
    assert question.recalled[0].store == "semantic"
    assert not any("hunter2" in f.value for f in s.facts())  # the injection stored nothing
    trace = s.trace(question.turn_id)
    assert [r.id for r in trace.recalled] == [r.id for r in question.recalled]

    play_day(s, SCENARIO[3])
    status = {p.version: p.status for p in s.procedures("draft postmortem")}
    assert status == {1: "active", 2: "candidate"}


def test_recall_items_carry_store_text_score_sources(runtime, soul_id) -> None:
    s = runtime.soul(soul_id)
    s.observe([{"speaker": "Caroline", "text": "I adopted a beagle named Biscuit last weekend.", "id": "D1:1"},
               {"speaker": "Melanie", "text": "Oh wow, how is Biscuit settling in?", "id": "D1:2"},
               {"speaker": "Caroline", "text": "Great, he loves the park near the river.", "id": "D1:3"}],
              at="2026-05-01T10:00:00", session="s1")
    items = s.recall("What is the name of Caroline's dog?", k=5, at="2026-05-02T10:00:00")
    assert items and items[0].store == "episodic" and "D1:1" in items[0].sources
    assert all(isinstance(i.score, float) and i.id and i.text for i in items)
    assert s.recall("beagle", k=5, stores=["semantic"], at="2026-05-02") == []
    eps = s.episodes(session="s1")
    assert eps and all(e.session == "s1" for e in eps)


def test_turns_of_one_soul_are_strictly_ordered_under_concurrency(runtime, soul_id) -> None:
    s = runtime.soul(soul_id)
    results, errors = [], []

    def submit(i: int) -> None:
        try:
            results.append(s.turn(f"Note number {i}: the deploy window is slot {i}.", user="ops"))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=submit, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    seqs = sorted(r.seq for r in results)
    assert seqs == list(range(1, 41))
    traces = s.traces(last=40)
    assert [t.seq for t in traces] == list(range(1, 41))
    assert Counter(t.query for t in traces).most_common(1)[0][1] == 1  # no turn applied twice


def test_a_retried_request_is_applied_once(runtime, soul_id) -> None:
    s = runtime.soul(soul_id)
    rid = uuid.uuid4().hex
    a = s.turn("The staging cluster is called Juniper.", user="maya", request_id=rid)
    b = s.turn("The staging cluster is called Juniper.", user="maya", request_id=rid)
    assert a.turn_id == b.turn_id and a.seq == b.seq == 1
    c = s.turn("Something else entirely, about lunch plans.", user="maya")
    assert c.seq == 2


def test_turn_n_plus_one_reads_what_turn_n_wrote(runtime, soul_id) -> None:
    s = runtime.soul(soul_id)
    s.turn("The release train for Orca is Thursday.", user="maya")
    s.turn("Yes, that's right.", user="maya")
    r = s.turn("When is the Orca release train?", user="maya")
    assert any("Thursday" in it.text for it in r.recalled)


def test_passivated_soul_reactivates_with_its_buffer(runtime, soul_id) -> None:
    s = runtime.soul(soul_id)
    s.turn("My favourite editor is Helix.", user="sam")
    before = s.traces(last=1)[0]
    host = runtime.placement(soul_id)["host"]
    from actors import raycalls
    handle = raycalls.get_actor(host, runtime.cfg.namespace)
    assert raycalls.get(raycalls.call(handle, "passivate", soul_id)) is True
    assert soul_id not in raycalls.get(raycalls.call(handle, "active_souls"))
    r = s.turn("What did I just say about editors?", user="sam")
    assert r.seq == before.seq + 1
    assert soul_id in raycalls.get(raycalls.call(handle, "active_souls"))


def test_hot_soul_gets_a_dedicated_actor_and_keeps_its_memory(runtime, soul_id) -> None:
    s = runtime.soul(soul_id)
    s.turn("The on-call rotation for Tendril is weekly.", user="maya")
    s.turn("Correct.", user="maya")
    name = runtime.dedicate(soul_id)
    assert runtime.placement(soul_id) == {"host": name, "dedicated": True}
    r = s.turn("How often does the Tendril on-call rotation change?", user="maya")
    assert r.seq == 3 and any("weekly" in it.text for it in r.recalled)
    assert runtime.undedicate(soul_id) is True
    assert s.turn("thanks!", user="maya").seq == 4


def test_turns_keep_flowing_while_a_soul_moves_to_its_own_actor_and_back(runtime, soul_id) -> None:
    """Turns submitted while the soul is dedicated and undedicated all land once, in order: the host lets the
    soul go after the turn in progress and names the new owner; a client holding a stale route follows it."""
    import threading

    from actors.routing import Router
    s = runtime.soul(soul_id)
    seqs: list[int] = []
    errors: list[BaseException] = []

    def stream() -> None:
        for i in range(12):
            try:
                seqs.append(s.turn(f"Build {i} of Tendril is green.", user="ci", request_id=f"{soul_id}-m{i}").seq)
            except BaseException as e:  # collected for the assertion
                errors.append(e)
    t = threading.Thread(target=stream)
    t.start()
    stale = Router(list(runtime.router.hosts), runtime.cfg.namespace)  # knows nothing of the move
    runtime.dedicate(soul_id)
    t.join(120)
    assert not errors and seqs == list(range(1, 13))
    from actors.routing import Routed
    assert stale.run(Routed(soul_id, "last_seq", ())) == 12  # sent on by the host it asked first
    assert stale.owner(soul_id) == runtime.placement(soul_id)["host"]
    assert runtime.undedicate(soul_id) is True
    assert stale.run(Routed(soul_id, "last_seq", ())) == 12  # the dedicated actor is gone: back home
    assert s.turn("thanks!", user="maya").seq == 13


def test_a_correction_takes_the_old_values_episodes_out_of_recall_over_ray(runtime, soul_id) -> None:
    """The semantic write of a correction marks the episodes of the replaced value (the host sends them with the
    episodic writes to the episodic shard): they leave recall, the new one stays."""
    s = runtime.soul(soul_id)
    for t in ("The production database for Tendril is Postgres 15.", "Yes, that's right.",
              "Actually, it's Postgres 16."):
        s.turn(t, user="maya")
    assert s.stats()["episodes"] == 3
    recalled = [it for it in s.recall("Tendril production database Postgres", k=20) if it.store == "episodic"]
    assert recalled and all("Postgres 16" in it.text for it in recalled)
    assert {f.value for f in s.facts("tendril")} == {"Postgres 16"}


def test_async_handle_has_the_same_api(runtime, soul_id) -> None:
    a = runtime.async_soul(soul_id)

    async def go() -> tuple:
        r = await a.turn("The canary region for Orca is eu-west-2.", user="maya")
        await a.turn("Yes, exactly.", user="maya")
        facts = await a.facts()
        items = await a.recall("canary region", k=3)
        return r, facts, items
    r, facts, items = asyncio.run(go())
    assert r.seq == 1 and facts and items


def test_async_turns_of_many_souls_go_in_batches_and_each_gets_its_own_answer(runtime, soul_id) -> None:
    """Turns submitted together from one event loop reach their hosts as ``run_batch`` calls; each soul
    gets its own reply and numbering, and a bad turn fails alone."""
    from actors import raycalls
    from actors.runtime import host_name
    hosts = [raycalls.get_actor(host_name(i), runtime.cfg.namespace) for i in range(runtime.cfg.hosts)]

    def counted() -> tuple[int, int]:
        snaps = raycalls.get([raycalls.call(h, "metrics_snapshot") for h in hosts])
        return sum(m.get("turn_calls", 0) for m in snaps), sum(m.get("turn_items", 0) for m in snaps)
    souls = [f"{soul_id}-b{i}" for i in range(12)]
    calls0, items0 = counted()

    async def go() -> list:
        handles = [runtime.async_soul(s) for s in souls]
        first = await asyncio.gather(*(h.turn(f"My locker number is {100 + i}.", user="maya")
                                       for i, h in enumerate(handles)), return_exceptions=True)
        second = await asyncio.gather(*(h.turn("What is my locker number?", user="maya" if i != 5 else "not ok")
                                        for i, h in enumerate(handles)), return_exceptions=True)
        return [first, second]
    first, second = asyncio.run(go())
    calls, items = counted()
    assert items - items0 == 24 and calls - calls0 < 24  # shared calls
    for i, (r1, r2) in enumerate(zip(first, second, strict=True)):
        assert r1.turn_id == f"{souls[i]}/1" and str(100 + i) in r1.reply
        if i == 5:
            assert isinstance(r2, InvalidInput)  # its own error; nothing of it was applied
        else:
            assert r2.turn_id == f"{souls[i]}/2" and str(100 + i) in r2.reply
    assert runtime.soul(souls[5]).turn("And again?", user="maya").seq == 2


def test_export_import_round_trip_through_the_runtime(runtime, soul_id) -> None:
    s = runtime.soul(soul_id)
    play_day(s, SCENARIO[0])
    blob = s.export()
    copy = runtime.soul(soul_id + "-copy")
    copy.import_(blob)
    assert copy.export() == blob
    q = "Tendril production database"
    assert [i.id for i in copy.recall(q, at="2026-03-03")] == [i.id for i in s.recall(q, at="2026-03-03")]
    with pytest.raises(InvalidInput):
        copy.import_(b"not msgpack")


def test_forget_erases_a_soul_for_good(runtime, soul_id) -> None:
    s = runtime.soul(soul_id)
    where = Path(runtime.cfg.data_dir) / "souls" / soul_id
    s.turn("The backup bucket for Tendril is archive-7.", user="maya")
    s.turn("Yes, that's right.", user="maya")
    s.observe([{"speaker": "Caroline", "text": "My beagle is called Zephyrquill.", "id": "m1"}], at="2026-05-01")
    assert s.facts() and disk_hits(where, "archive-7", "zephyrqu")
    one = s.forget_where(query="zephyrquill")
    assert one.writes and disk_hits(where, "zephyrqu") == {} and s.traces(last=1)[0].kind == "forget"
    assert s.facts()  # the rest stays
    s.forget()
    assert disk_hits(where, "archive-7", "zephyrqu", "maya") == {}
    assert s.facts() == [] and s.stats()["episodes"] == 0 and s.traces(last=5) == []
    assert s.turn("hello again", user="maya").seq == 5
    again = s.observe([{"speaker": "Caroline", "text": "I bought a red kayak for the lake.", "id": "m1"}],
                      at="2026-05-02")
    assert [w.op.value for w in again.writes if w.store.value == "episodic"] == ["ADD"]  # the id is new again
    blob = s.export()
    s.forget()
    s.import_(blob)  # a forgotten soul takes an import
    assert s.stats()["episodes"] == 1


def test_errors_come_from_the_project_hierarchy(runtime, soul_id) -> None:
    s = runtime.soul(soul_id)
    with pytest.raises(InvalidInput):
        s.turn("", user="maya")
    with pytest.raises(InvalidInput):
        s.turn("bad \x00 byte", user="maya")
    with pytest.raises(InvalidInput):
        runtime.soul("../etc")
    with pytest.raises(NotFound):
        s.trace("nope/1")
    with pytest.raises(NotFound):
        s.fact_history("nobody", "nothing")
    with pytest.raises(InvalidInput):
        s.observe([{"speaker": "a", "text": "hi"}])
    assert s.stats()["episodes"] == 0


def test_metrics_are_counted(runtime, soul_id) -> None:
    from actors import raycalls
    from actors.placement import shard_index, store_name
    s = runtime.soul(soul_id)
    host = raycalls.get_actor(runtime.placement(soul_id)["host"], runtime.cfg.namespace)
    store = raycalls.get_actor(store_name("semantic", shard_index(soul_id, runtime.cfg.shards("semantic"), "semantic")),
                               runtime.cfg.namespace)
    before_h = raycalls.get(raycalls.call(host, "metrics_snapshot"))
    before_s = raycalls.get(raycalls.call(store, "metrics_snapshot"))
    s.turn("The incident bridge for Tendril is bridge-7.", user="maya")
    s.turn("Yes, that's right.", user="maya")
    after_h = raycalls.get(raycalls.call(host, "metrics_snapshot"))
    after_s = raycalls.get(raycalls.call(store, "metrics_snapshot"))
    assert after_h.get("turns:turn", 0) - before_h.get("turns:turn", 0) == 2
    assert after_s.get("writes:semantic,ADD", 0) - before_s.get("writes:semantic,ADD", 0) == 1
    # the fresh soul's first turn has no semantic store to ask; the second asks the one the first created
    assert after_s.get("recalls:semantic", 0) - before_s.get("recalls:semantic", 0) == 1


def test_reply_first_through_the_handle(runtime, soul_id) -> None:
    s = runtime.soul(soul_id)
    r = s.turn("The production database for Tendril is Postgres 15.", user=USER, at="2026-03-02T09:00",
               wait_writes=False)
    assert r.writes_pending and r.writes == () and r.reply.startswith("[offline model]")
    nxt = s.turn("Which database does Tendril use in production?", user=USER, at="2026-03-02T09:01")
    first = s.trace(r.turn_id)  # the next turn waited for the previous turn's writes, never for its reply
    assert not first.pending and first.writes and first.usage["reply"]["calls"] == 1
    assert any(r.turn_id + "/user" in it.sources for it in nxt.recalled)
    with pytest.raises(InvalidInput, match="wait_writes"):
        s.turn("hello there", wait_writes="no")
    usage = s.stats()["model_usage"]
    assert usage["calls"] == sum(t.usage["calls"] for t in s.traces(last=10)) and usage["by_model"]


def test_a_client_with_another_layout_is_refused(runtime) -> None:
    import soul_runtime
    from soul_runtime.errors import ConfigError
    for other in ({"episodic_shards": 3}, {"namespace": "another-namespace"}):
        with pytest.raises(ConfigError, match="episodic_shards|namespace"):
            soul_runtime.connect(data_dir=runtime.cfg.data_dir, **other)
    assert runtime.soul("still-served").turn("hello there, runtime", user="sam").seq == 1


def test_a_store_shard_sweeps_by_itself_on_ray(runtime, tmp_path) -> None:
    """The shard's own timer queues ``sweep_due`` on its actor; old unpromoted episodes go without a call."""
    import time as _time

    from actors import raycalls
    from actors.layer_shard import LayerShard
    from soul_runtime.embedding.choice import default_embedder
    from soul_runtime.loop.soul import Soul
    from soul_runtime.memory.soul_memory import SoulMemory
    from soul_runtime.models.offline import OfflineModel

    d = tmp_path / "souls" / "old-soul"
    mem = SoulMemory(d, embedder=default_embedder())
    soul = Soul("old-soul", d, memory=mem, model=OfflineModel())
    soul.observe([{"speaker": "Caroline", "text": "I adopted a beagle named Biscuit last weekend.", "id": "m1"}],
                 at="2020-01-01")
    soul.close()
    assert mem.stats()["episodes"] == 1
    mem.close()
    memory = {"episodic_ttl_days": 30}
    shard = raycalls.create(LayerShard, f"ret-{uuid.uuid4().hex[:8]}", "retention-test",
                            ("episodic", str(tmp_path), memory, 4, "default", 0, 1, 0.3), max_restarts=0, num_cpus=0)
    try:
        deadline = _time.monotonic() + 60
        while _time.monotonic() < deadline:
            if raycalls.get(raycalls.call(shard, "read", "old-soul", "stats"))["episodes"] == 0:
                break
            _time.sleep(0.2)
        assert raycalls.get(raycalls.call(shard, "read", "old-soul", "stats"))["episodes"] == 0
    finally:
        raycalls.kill(shard)


def test_the_runtimes_processes_run_with_two_malloc_arenas(runtime, soul_id) -> None:
    """Every host and shard process runs with MALLOC_ARENA_MAX (2 unless set): a shard's threads would each keep
    an arena of freed memory."""
    import os

    from soul_apps.bench.scale import process_table

    runtime.soul(soul_id).turn("The build server moved to the basement rack.")
    procs = [p for p in process_table() if p["name"] in ("ray::LayerShard", "ray::SoulHost")]
    assert {p["name"] for p in procs} == {"ray::LayerShard", "ray::SoulHost"}
    want = f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', '2')}".encode()
    for p in procs:
        with open(f"/proc/{p['pid']}/environ", "rb") as f:
            assert want in f.read().split(b"\0"), p


def test_a_tenants_limits_hold_for_its_turns_through_the_python_api(runtime) -> None:
    """The limits the key table sets for a tenant (``soul tenants set``) refuse its souls' turns sent through the
    Python API before they are sent, as the service refuses them: QuotaExceeded with a Retry-After, no soul made.
    Reads are never limited; another tenant's souls and souls of no tenant go on."""
    import time

    from actors.tenant_usage import read_usage
    from soul_apps.service.tenants import TenantTable
    from soul_runtime.errors import QuotaExceeded
    from soul_runtime.memory.soul_records import known

    tenant, other = f"lim-{uuid.uuid4().hex[:8]}", f"free-{uuid.uuid4().hex[:8]}"
    table = TenantTable(runtime.cfg.data_dir, runtime.cfg.storage)
    table.add(tenant)
    first = runtime.soul(f"{tenant}:first")
    first.turn("Maya runs the Tendril database.")
    table.set_limits(tenant, souls=1)
    try:
        refused: QuotaExceeded | None = None
        for i in range(600):  # the runtime reads the table again at most every second: new souls until it has
            try:
                runtime.soul(f"{tenant}:new-{i}").turn("Hello there.")
            except QuotaExceeded as e:
                refused = e
                break
            time.sleep(0.05)
        assert refused is not None and refused.retry_after > 0 and "souls" in str(refused)
        assert read_usage(runtime.cfg.data_dir)[tenant]["throttled"] >= 1  # counted as the service counts its own
        assert not known(runtime.cfg.data_dir, f"{tenant}:new-{i}")  # refused before it began
        assert "Tendril" in " ".join(f.value for f in first.facts()) or first.recall("Tendril")  # reads go on
        assert first.turn("Maya also runs the billing queue.").reply  # an existing soul's turns go on
        assert runtime.soul(f"{other}:new").turn("Hello there.").reply  # another tenant's are not counted
        assert runtime.soul(f"untenanted-{uuid.uuid4().hex[:8]}").turn("Hello there.").reply

        async def async_new_soul() -> None:
            with pytest.raises(QuotaExceeded):
                await runtime.async_soul(f"{tenant}:async-new").turn("Hello there.")
        asyncio.run(async_new_soul())
        assert not known(runtime.cfg.data_dir, f"{tenant}:async-new")
    finally:
        table.remove(tenant)
