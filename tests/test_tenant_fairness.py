"""Tenants' fair order (actors.fair_queue, actors.fair_pool, actors.fair_gate), their limits (actors.quotas,
the key table's records) and their usage counts (actors.tenant_usage): pure policies and small movers, no Ray."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from actors.fair_gate import FairGate
from actors.fair_pool import TENANT, FairPool, tenant_of
from actors.fair_queue import FairQueue, arrive, leave, release
from actors.quotas import Bucket, Quotas, Standing, refusal, take
from actors.tenant_usage import UsageBook, read_usage, seconds_to_next_day, usage_dir
from soul_apps.service.tenants import Limits, TenantTable
from soul_runtime.errors import InvalidInput, NotFound, QuotaExceeded


def _drain(q: FairQueue, now: float = 0.0) -> list[str]:
    """The tenants of the waiting items in the order free slots go to them (one slot turning over: the holder of
    the slot gives it back, the next takes it)."""
    out: list[str] = []
    holder = "x"
    while q.waiting:
        q, started = release(q, holder, now)
        assert len(started) == 1
        holder = started[0].tenant
        out.append(holder)
    return out


def _arrive(q: FairQueue, ticket: int, tenant: str, weight: float = 1.0, now: float = 0.0) -> tuple[FairQueue, bool]:
    q, started = arrive(q, ticket, tenant, weight, now)
    return q, ticket in {w.ticket for w in started}


def test_a_flood_waits_on_its_own_share() -> None:
    q = FairQueue(slots=1)
    q, first = _arrive(q, 0, "x")
    assert first
    for i in range(1, 101):  # a floods: 100 waiting
        q, now_in = _arrive(q, i, "a")
        assert not now_in
    q, started = release(q, "x", 0.0)  # a's first waiting item starts
    assert [w.ticket for w in started] == [1]
    for i in range(101, 105):  # then b's 4 arrive
        q, _ = _arrive(q, i, "b")
    order = _drain(q)
    assert order[:8].count("b") == 4, order[:10]  # b's four are served among the next eight, not after a's 99
    assert order.index("b") <= 1


def test_weights_share_the_slots() -> None:
    q = FairQueue(slots=1)
    q, _ = _arrive(q, 0, "x")
    t = 1
    for _ in range(60):
        for tenant, w in (("heavy", 3.0), ("light", 1.0)):
            q, _ = _arrive(q, t, tenant, w)
            t += 1
    order = _drain(q)[:40]
    assert order.count("heavy") == 30 and order.count("light") == 10


def test_within_a_tenant_arrival_order_holds_and_leaving_frees_nothing() -> None:
    q = FairQueue(slots=1)
    q, _ = _arrive(q, 0, "a")
    for i in (1, 2, 3):
        q, _ = _arrive(q, i, "a", now=float(i))
    q = leave(q, 2)
    tickets = []
    while q.waiting:
        q, started = release(q, "a", 10.0)
        tickets += [(w.ticket, 10.0 - w.since) for w in started]
    assert tickets == [(1, 9.0), (3, 7.0)]
    q, none = release(q, "a", 10.0)
    assert none == () and q.used == 0 and q.holds("a") == 0
    with pytest.raises(ValueError):
        arrive(q, 9, "a", 0.0, 0.0)


def test_an_idle_tenant_saves_no_credit() -> None:
    q = FairQueue(slots=1)
    q, _ = _arrive(q, 0, "a")
    for i in range(1, 50):
        q, _ = _arrive(q, i, "a")
    for _ in range(40):
        q, _ = release(q, "a", 0.0)
    # b was away all along: it starts at the present virtual time, level with a, not 40 items ahead of it
    for i in range(100, 110):
        q, _ = _arrive(q, i, "b")
    order = _drain(q)
    assert order[:4].count("b") <= 3 and order[:6].count("a") >= 2


def test_slots_a_tenant_used_lately_are_kept_for_it_within_the_window() -> None:
    """Slots that come free in waves: b, which held 2 of 8 a moment ago, finds 2 kept for it while a floods; after
    the window a takes them all again. Without a window a takes every slot that frees."""
    for window, kept in ((5.0, 2), (0.0, 0)):
        q = FairQueue(slots=8, window=window)
        for i in (0, 1):
            q, _ = _arrive(q, i, "b", now=0.0)
        for i in range(2, 300):  # a's flood
            q, _ = _arrive(q, i, "a", now=0.0)
        assert q.holds("a") == 6 and q.holds("b") == 2
        q, _ = release(q, "b", 1.0)
        q, _ = release(q, "b", 1.0)  # b's two calls are answered; b's next turn comes a little later
        assert q.holds("a") == 8 - kept and q.used == 8 - kept
        for _ in range(6):  # a wave: a's six calls end together
            q, started = release(q, "a", 1.5)
        assert q.holds("a") == 8 - kept
        q, now_in = _arrive(q, 1000, "b", now=1.6)  # b comes back between two waves: a slot at once if kept
        assert now_in == bool(kept)
        for _ in range(q.holds("a")):
            q, _ = release(q, "a", 7.0)  # past the window: the slots b held lately go back to a
        assert q.holds("a") == 8 - q.holds("b")


def test_the_pool_serves_tenants_in_fair_order() -> None:
    gate = threading.Event()
    ran: list[str] = []
    pool = FairPool(1)
    try:
        TENANT.set("a")
        blocker = pool.submit(gate.wait)
        futs = [pool.submit(ran.append, "a") for _ in range(20)]
        TENANT.set("b")
        futs += [pool.submit(ran.append, "b") for _ in range(3)]
        assert pool.waiting == 23
        gate.set()
        for f in [blocker, *futs]:
            f.result(timeout=30)
        assert ran.index("b") <= 1 and [i for i, t in enumerate(ran) if t == "b"][-1] <= 5, ran
        assert pool.waited_s["a"] > 0 and pool.waiting == 0
        TENANT.set("a")
        with pytest.raises(ZeroDivisionError):
            pool.submit(lambda: 1 / 0).result(timeout=30)
    finally:
        TENANT.set("")
        pool.shutdown()


def test_the_gate_hands_places_on_fairly_and_past_a_cancelled_waiter() -> None:
    async def main() -> list[str]:
        gate = FairGate(1)
        order: list[str] = []
        hold = asyncio.Event()

        async def one(tenant: str, wait: bool = False) -> None:
            async with gate.place(tenant):
                order.append(tenant)
                if wait:
                    await hold.wait()
        first = asyncio.ensure_future(one("a", wait=True))
        await asyncio.sleep(0)
        floods = [asyncio.ensure_future(one("a")) for _ in range(10)]
        gone = asyncio.ensure_future(one("b"))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        late = [asyncio.ensure_future(one("b")) for _ in range(2)]
        await asyncio.sleep(0)
        assert gate.waiting == 12
        hold.set()
        await asyncio.gather(first, *floods, *late)
        assert gate.waiting == 0 and gate.q.used == 0
        return order
    order = asyncio.run(main())
    assert len(order) == 13 and order.index("b") <= 2 and order[:5].count("b") == 2, order


def test_tenant_of_a_soul_is_its_id_prefix() -> None:
    assert tenant_of("acme:maya") == "acme" and tenant_of("maya") == "" and tenant_of("acme:x:y") == "acme"


# ---- limits ------------------------------------------------------------------------------------


def test_a_bucket_allows_a_second_s_worth_then_the_rate() -> None:
    b, waits = None, []
    for _ in range(5):
        b, w = take(b, 4.0, 10.0)
        waits.append(w)
    assert waits[:4] == [0.0] * 4 and waits[4] == pytest.approx(0.25)
    b, w = take(b, 4.0, 10.25)
    assert w == 0.0
    b, w = take(Bucket(0.0, 0.0), 0.5, 1.0)  # under one a second: one turn, then 2 s apart
    assert w == pytest.approx(1.0)


def test_refusals_name_the_limit_and_when_to_come_back() -> None:
    lim = Limits(in_flight=4, souls=2, stored_bytes=1000, tokens_per_day=500)
    ok = Standing(in_flight=3, souls=2, stored_bytes=999, tokens_today=499, new_soul=False)
    assert refusal(lim, ok, 0.0) is None
    assert refusal(lim, Standing(4, 0, 0, 0, False), 0.0)[:1] == ("in_flight",)  # type: ignore[index]
    assert refusal(lim, Standing(2, 0, 0, 0, False), 0.0, share=2)[:1] == ("in_flight",)  # type: ignore[index]
    why = refusal(lim, Standing(0, 0, 0, 500, False), 86400.0 * 3 + 3600)
    assert why is not None and why[0] == "tokens_per_day" and why[2] == 82800.0
    assert refusal(lim, Standing(0, 2, 0, 0, True), 0.0)[:1] == ("souls",)  # type: ignore[index]
    assert refusal(lim, Standing(0, 0, 1000, 0, False), 0.0)[:1] == ("stored_bytes",)  # type: ignore[index]
    assert seconds_to_next_day(86400.0 * 5 - 0.5) == 1.0


def test_limits_are_checked_and_kept_in_the_tenant_record(tmp_path: Path) -> None:
    table = TenantTable(tmp_path, "local")
    table.add("acme")
    table.add("beta")
    assert table.limits("acme") == Limits()
    table.set_limits("acme", turns_per_s=2.5, in_flight=8, weight=3)
    table.set_limits(None, souls=10, in_flight=100)  # the defaults
    again = TenantTable(tmp_path, "local")  # another process reads the file
    assert again.limits("acme") == Limits(turns_per_s=2.5, in_flight=8, souls=10, weight=3.0)
    assert again.limits("beta") == Limits(in_flight=100, souls=10)
    raw = json.loads((tmp_path / "tenants.json").read_text())
    assert raw["tenants"]["acme"]["limits"] == {"turns_per_s": 2.5, "in_flight": 8, "weight": 3.0}
    table.set_limits("acme", in_flight=None, weight=None)
    assert TenantTable(tmp_path, "local").limits("acme") == Limits(turns_per_s=2.5, in_flight=100, souls=10)
    table.revoke("acme")  # a revoke keeps the limits
    assert TenantTable(tmp_path, "local").get("acme").limits.turns_per_s == 2.5
    for bad in ({"in_flight": 0}, {"souls": 1.5}, {"weight": 0}, {"stored_bytes": True}, {"tokens": 3}):
        with pytest.raises(InvalidInput):
            table.set_limits("beta", **bad)
    with pytest.raises(NotFound):
        table.set_limits("nobody", souls=1)


def test_quotas_refuse_before_the_turn_and_count_it(tmp_path: Path) -> None:
    now = [1000.0]
    limits = {"acme": Limits(in_flight=2, turns_per_s=100, souls=1)}
    book = UsageBook(usage_dir(tmp_path) / "service-1.json", clock=lambda: now[0])
    q = Quotas(str(tmp_path), lambda t: limits.get(t, Limits()), book=book, clock=lambda: now[0])
    ran: list[str] = []

    async def main() -> None:
        async with q.turn("acme", "acme:one"):  # its first soul
            async with q.turn("acme", "acme:one"):
                with pytest.raises(QuotaExceeded) as busy:
                    async with q.turn("acme", "acme:one"):
                        ran.append("third")
                assert busy.value.retry_after == 1.0 and "in flight" in str(busy.value)
            (tmp_path / "souls" / "acme:one").mkdir(parents=True)
        with pytest.raises(QuotaExceeded, match="souls"):
            async with q.turn("acme", "acme:two"):  # a second soul, over souls=1
                ran.append("two")
        async with q.turn("other", "other:x"):  # no limits
            ran.append("other")
    asyncio.run(main())
    assert ran == ["other"] and q.in_flight["acme"] == 0
    book.flush(force=True)
    assert read_usage(tmp_path, now[0])["acme"]["throttled"] == 2


def test_usage_books_add_up_across_processes_and_days(tmp_path: Path) -> None:
    day = 86400.0 * 20000
    clock = [day + 10]
    a = UsageBook(usage_dir(tmp_path) / "host-0.json", clock=lambda: clock[0])
    b = UsageBook(usage_dir(tmp_path) / "host-1.json", clock=lambda: clock[0])
    a.add("acme", "turns")
    a.add("acme", "tokens", 100)
    b.add("acme", "tokens", 50)
    clock[0] = day - 10  # yesterday's tokens count in all, not today
    b.add("acme", "tokens", 7)
    b.add("beta", "queued_s", 0.5)
    assert a.flush() and b.flush() and not a.flush()
    got = read_usage(tmp_path, day + 20)
    assert got["acme"] == {"turns": 1, "tokens": 157, "throttled": 0, "queued_s": 0, "tokens_today": 150}
    assert got["beta"]["queued_s"] == 0.5
    again = UsageBook(usage_dir(tmp_path) / "host-0.json", clock=lambda: clock[0])  # a restarted host goes on
    assert again.counts["acme"]["tokens"] == 100


def test_quota_exceeded_travels_and_is_what_the_python_client_raises() -> None:
    import pickle

    from soul_runtime.errors import RuntimeBusy
    from soul_runtime.http_client import wire
    e = pickle.loads(pickle.dumps(QuotaExceeded("over its souls", 60.0)))
    assert isinstance(e, RuntimeBusy) and e.retry_after == 60.0 and str(e) == "over its souls"
    got = wire.error(429, {"error": {"type": "QuotaExceeded", "message": "the tenant has 8 turns in flight"}})
    assert type(got) is QuotaExceeded and str(got) == "the tenant has 8 turns in flight"


def test_the_model_behind_a_fair_gate_of_its_concurrency() -> None:
    from actors.fair_gate import FairModel, fair_model
    from soul_runtime.models.base import AsyncLanguageModel
    from soul_runtime.models.offline import OfflineModel

    class Slow(AsyncLanguageModel):
        model_id = "slow-1"
        max_concurrency = 2

        def __init__(self) -> None:
            self.out = 0
            self.most = 0

        async def _one(self) -> str:
            self.out += 1
            self.most = max(self.most, self.out)
            await asyncio.sleep(0.001)
            self.out -= 1
            return "ok"

        async def reply(self, request: object) -> str:  # type: ignore[override]
            return await self._one()

        async def decide(self, exchange: object) -> str:  # type: ignore[override]
            return await self._one()

        async def decide_window(self, window: object) -> str:
            return await self._one()

        async def classify_task(self, text: str, known: tuple[str, ...]) -> str:  # type: ignore[override]
            return await self._one()

    offline = OfflineModel()
    assert fair_model(offline, 0, lambda t: 1.0) is offline  # runs on the host's fair threads instead
    inner = Slow()
    m = fair_model(inner, 0, lambda t: 1.0)
    assert isinstance(m, FairModel) and m.gate.q.slots == 2 and m.model_id == "slow-1"

    async def main() -> None:
        async def one(tenant: str) -> str:
            TENANT.set(tenant)
            return str(await m.reply(None))
        got = await asyncio.gather(*(one(t) for t in ("a",) * 10 + ("b",) * 2))
        assert got == ["ok"] * 12
    asyncio.run(main())
    assert inner.most == 2 and m.gate.admitted == {"a": 10, "b": 2}


def test_a_flood_s_own_recent_use_keeps_no_newcomer_out() -> None:
    """A floods alone (all 16 slots, its record live); B arrives for the first time: at the next slot A gives back,
    B takes it, though A held 16 a moment ago (A keeps at most its share beside B: 8)."""
    q = FairQueue(slots=16, window=5.0)
    for i in range(200):
        q, _ = _arrive(q, i, "a", now=0.0)
    assert q.holds("a") == 16
    q, b_now = _arrive(q, 1000, "b", now=1.0)
    assert not b_now
    q, started = release(q, "a", 1.1)
    assert [w.tenant for w in started] == ["b"]
    for _ in range(9):  # A gives back 9 more; B's one item is served, the rest go to A
        q, started = release(q, "a", 1.2)
        assert [w.tenant for w in started] == ["a"]
    assert q.holds("b") == 1 and q.holds("a") == 15


def test_the_pool_runs_at_most_its_slots_and_cancels_what_waits_at_shutdown() -> None:
    release_all = threading.Event()
    lock = threading.Lock()
    running, most = [0], [0]

    def step() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release_all.wait(30)
        with lock:
            running[0] -= 1
    pool = FairPool(8, slots=2)
    futs = [pool.submit(step) for _ in range(6)]
    assert pool.waiting == 4
    pool.shutdown(wait=False, cancel_futures=True)
    with pytest.raises(RuntimeError):
        pool.submit(step)
    release_all.set()
    pool.shutdown(wait=True)
    assert most[0] == 2 and sum(f.cancelled() for f in futs) == 4 and all(f.done() for f in futs)
    assert len([t for t in threading.enumerate() if t.name.startswith("fair-pool")]) == 0


def test_work_handed_over_from_a_loop_answers_on_it_in_fair_order_and_a_cancelled_item_never_runs() -> None:
    """``run_on``: the answer (or the error) arrives on the caller's loop; tenants keep their fair order; an item
    cancelled while it waits is not run, and one cancelled at shutdown neither."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        gate = threading.Event()
        ran: list[str] = []
        pool = FairPool(1)
        try:
            TENANT.set("a")
            blocker = pool.run_on(loop, gate.wait)
            a_items = [pool.run_on(loop, ran.append, "a") for _ in range(20)]
            dropped = pool.run_on(loop, ran.append, "dropped")
            TENANT.set("b")
            b_items = [pool.run_on(loop, ran.append, "b") for _ in range(3)]
            dropped.cancel()
            gate.set()
            await asyncio.gather(blocker, *a_items, *b_items)
            assert ran.index("b") <= 1 and [i for i, t in enumerate(ran) if t == "b"][-1] <= 5, ran
            assert "dropped" not in ran and len(ran) == 23
            with pytest.raises(ZeroDivisionError):
                await pool.run_on(loop, lambda: 1 / 0)
            assert threading.current_thread() is threading.main_thread()
            gate.clear()
            began = threading.Event()
            held = pool.run_on(loop, lambda: began.set() or gate.wait())
            waiting = pool.run_on(loop, ran.append, "after shutdown")
            await asyncio.to_thread(began.wait, 30)
            pool.shutdown(wait=False, cancel_futures=True)
            gate.set()
            assert await held is True
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert "after shutdown" not in ran
        finally:
            TENANT.set("")
            pool.shutdown()

    asyncio.run(main())


def test_an_item_that_leaves_from_the_head_of_its_tenant_gives_the_next_its_place() -> None:
    q = FairQueue(slots=1)
    q, _ = _arrive(q, 0, "x")
    for i in (1, 2):
        q, _ = _arrive(q, i, "a")
    q, _ = _arrive(q, 3, "b")
    q = leave(q, 1)  # a's first leaves: a's second is now a's head, with its own start tag (behind b's)
    assert q.waiting == 2 and q.queued("a") == 1
    q, started = release(q, "x", 0.0)
    assert [w.ticket for w in started] == [3]
    q = leave(q, 2)
    q, started = release(q, "b", 0.0)
    assert started == () and q.waiting == 0 and q.used == 0 and q.queued("a") == 0
