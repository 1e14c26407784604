"""The client side of the turn path without Ray: per-soul order in a process, the retry policy, moves.

The router's policy is a generator of calls and pauses (``Router.steps``); here it is driven by hand with
stand-in actor handles, and Ray's own error types are raised into it as a real call would."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray.exceptions

from actors import raycalls, routing, soul_host
from actors.keyed_locks import KeyedLocks
from actors.retry import RetryPolicy
from actors.routing import Actor, AsyncSoulLocks, Moved, Routed, Router
from actors.soul_host import SoulHost
from soul_runtime.errors import InvalidInput, RuntimeUnavailable, StaleOwner, TurnFailed
from soul_runtime.models.offline import OfflineModel
from soul_runtime.steps import Call, Pause


def test_soul_locks_serialise_one_soul_and_drop_their_entries() -> None:
    locks: KeyedLocks[threading.Lock] = KeyedLocks(threading.Lock)
    inside: dict[str, int] = {}
    worst: dict[str, int] = {}

    def work(soul: str) -> None:
        with locks.held(soul):
            inside[soul] = inside.get(soul, 0) + 1
            worst[soul] = max(worst.get(soul, 0), inside[soul])
            time.sleep(0.002)
            inside[soul] -= 1
    threads = [threading.Thread(target=work, args=(f"s{i % 3}",)) for i in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert worst == {"s0": 1, "s1": 1, "s2": 1}  # never two calls of one soul at once
    assert len(locks) == 0  # state bounded by the souls in flight


def test_async_soul_locks_keep_arrival_order() -> None:
    locks = AsyncSoulLocks(None)
    order: list[int] = []

    async def turn(i: int) -> None:
        with locks.locks.entry("a") as lock:
            async with lock:
                order.append(i)
                await asyncio.sleep(0.001)

    async def main() -> None:
        await asyncio.gather(*(turn(i) for i in range(20)))
    asyncio.run(main())
    assert order == list(range(20)) and len(locks.locks) == 0


class Handle:
    def __init__(self, name: str) -> None:
        self.name = name


def _task_error(err: BaseException) -> BaseException:
    return ray.exceptions.RayTaskError("run", "Traceback: remote", err)


@pytest.fixture
def router(monkeypatch: pytest.MonkeyPatch) -> tuple[Router, list[tuple[str, str]]]:
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(raycalls, "get_actor", lambda name, ns: Handle(name))
    monkeypatch.setattr(raycalls, "call", lambda h, method, *args: sent.append((h.name, method)) or (h.name, args))
    return Router(["soul-host-0", "soul-host-1"], "ns"), sent


def _to(step: Any) -> str:
    """The actor a step of the policy calls."""
    assert isinstance(step, Call) and isinstance(step.target, Actor)
    return step.target.name


def test_the_policy_retries_a_dead_owner_then_follows_a_move(router: Any) -> None:
    r, sent = router
    home = r.owner("maya")
    gen = r.steps(Routed("maya", "run", ("turn", None, "rid-1", {})))
    first = next(gen)
    assert isinstance(first, Call) and first.target.batchable and _to(first) == home
    assert first.args == ("maya", "turn", None, "rid-1", {})
    pause = gen.throw(ray.exceptions.RayActorError())  # the host died: wait a moment, same request again
    assert isinstance(pause, Pause) and pause.seconds > 0
    retry = gen.send(None)
    assert _to(retry) == home and retry.args == first.args  # the same request id: idempotent
    again = gen.throw(_task_error(Moved("maya", "soul-dedicated-maya")))  # moved: straight to the new owner
    assert _to(again) == "soul-dedicated-maya" and r.owner("maya") == "soul-dedicated-maya"
    # a batch answers an item's own error as itself (not wrapped by Ray): handled the same way
    assert _to(gen.throw(StaleOwner("superseded"))) == "soul-dedicated-maya"  # reactivates there
    with pytest.raises(StopIteration) as done:
        gen.send("the answer")
    assert done.value.value == "the answer"
    assert sent == []  # turns are sent by the driver, alone or in a batch
    gen = r.steps(Routed("maya", "run", ()))
    next(gen)
    assert _to(gen.throw(Moved("maya", home))) == home  # moved back home: the hash again
    assert "maya" not in r.dedicated
    gen = r.steps(Routed("maya", "traces", (3,)))
    step = next(gen)
    assert _to(step) == home and step.method == "traces" and not step.target.batchable  # other calls go alone


def test_the_callers_errors_are_not_retried(router: Any) -> None:
    r, sent = router
    for err in (_task_error(InvalidInput("turn text is empty")), InvalidInput("turn text is empty")):
        gen = r.steps(Routed("ana", "run", ()))
        next(gen)
        with pytest.raises(InvalidInput):
            gen.throw(err)
    gen = r.steps(Routed("ana", "trace", ("ana/1",)))
    calls = [next(gen)]
    with pytest.raises(TurnFailed):  # a failure that is not ours: reported once, not retried
        calls.append(gen.throw(_task_error(ZeroDivisionError("boom"))))
    assert len(calls) == 1 and sent == []  # one call, made by the driver


def test_an_owner_that_stays_dead_is_reported(router: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    r, _ = router
    r.retry = RetryPolicy(attempts=3)
    gen = r.steps(Routed("ana", "run", ()))
    step = next(gen)
    with pytest.raises(RuntimeUnavailable):
        while True:
            step = gen.send(None) if isinstance(step, Pause) else gen.throw(ray.exceptions.RayActorError())


class NoMemory:
    def __init__(self, soul_id: str, stores: object, directory: object = None) -> None:
        pass

    def fence(self, epoch: int) -> None:
        pass


def test_a_host_refuses_a_soul_served_elsewhere_and_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setattr(soul_host, "RemoteMemory", NoMemory)
    conf = {"data_dir": str(tmp_path), "model": "offline"}
    async def main() -> None:
        host = SoulHost("soul-host-0", conf, model=OfflineModel())
        assert await host.last_seq("maya") == 0 and "maya" in host.active_souls()
        assert await host.move("maya", "soul-dedicated-maya") is True  # passivated here
        with pytest.raises(Moved) as moved:
            await host.last_seq("maya")
        assert moved.value.to == "soul-dedicated-maya" and "maya" not in host.active_souls()
        (tmp_path / routing.REGISTRY).write_text('{"maya": "soul-dedicated-maya"}')
        restarted = SoulHost("soul-host-0", conf, model=OfflineModel())  # a restart reads the registry
        with pytest.raises(Moved):
            await restarted.last_seq("maya")
        dedicated = SoulHost("soul-dedicated-maya", {**conf, "host_capacity": 1}, model=OfflineModel())
        assert await dedicated.last_seq("maya") == 0  # its own soul
        host.unmove("maya")
        assert await host.last_seq("maya") == 0
    asyncio.run(main())
    assert Moved("x", "y").__reduce__()[1] == ("x", "y")  # crosses Ray intact


def test_the_async_driver_serves_any_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each asyncio.run() has its own loop: the per-soul locks are per loop and go with it."""
    import gc

    async def answer(value: Any) -> Any:
        return value
    monkeypatch.setattr(raycalls, "get_actor", lambda name, ns: Handle(name))
    monkeypatch.setattr(raycalls, "call", lambda h, method, soul, *args: answer((h.name, soul, args)))
    r = Router(["soul-host-0"], "ns")
    for _ in range(2):
        assert asyncio.run(r.run_async(Routed("maya", "traces", (5,)))) == ("soul-host-0", "maya", (5,))
    gc.collect()
    assert len(r._async_locks) == 0


def test_the_async_driver_batches_turns_per_host_and_retries_each_after_a_dead_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Turns submitted together go to their host as one ``run_batch``; a host that dies under a batch fails
    the whole call and every turn of it is retried on its own (same request id); an item's own error reaches
    its caller only."""
    batches: list[list[tuple[Any, ...]]] = []
    dead = {"soul-host-0": 1}  # the first call to this host dies

    async def run_batch(name: str, items: list[tuple[Any, ...]]) -> list[Any]:
        batches.append(items)
        await asyncio.sleep(0.005)
        if dead.get(name):
            dead[name] -= 1
            raise ray.exceptions.RayActorError()
        return [InvalidInput("turn text is empty") if it[0] == "bad" else (name, it[0], it[3]) for it in items]
    monkeypatch.setattr(raycalls, "get_actor", lambda name, ns: Handle(name))
    monkeypatch.setattr(raycalls, "call", lambda h, method, items: run_batch(h.name, items))
    r = Router(["soul-host-0", "soul-host-1"], "ns")
    souls = [f"s{i}" for i in range(12)] + ["bad"]

    async def main() -> list[Any]:
        return await asyncio.gather(*(r.run_async(Routed(s, "run", ("turn", None, f"rid-{s}", {})))
                                      for s in souls), return_exceptions=True)
    out = asyncio.run(main())
    for s, o in zip(souls, out, strict=True):
        if s == "bad":
            assert isinstance(o, InvalidInput)
        else:
            assert o == (r.owner(s), s, f"rid-{s}")  # its own answer, from its own host
    first_round = [b for b in batches[:2]]
    assert sorted(it[0] for b in first_round for it in b) == sorted(souls)  # all went in the first two calls
    assert {len({r.owner(it[0]) for it in b}) for b in batches} == {1}  # a batch goes to one host
    retried = [it for b in batches[2:] for it in b]
    assert sorted(it[0] for it in retried) == sorted(s for s in souls if r.owner(s) == "soul-host-0")


def test_a_straggler_of_a_batch_is_asked_for_alone_with_the_same_request(router: Any) -> None:
    r, sent = router
    gen = r.steps(Routed("maya", "run", ("turn", None, "rid-9", {})))
    first = next(gen)
    assert isinstance(first, Call) and first.target.batchable
    alone = gen.send(routing.Later())  # the host answered the others; this turn was still running
    assert _to(alone) == r.owner("maya") and alone.args == ("maya", "turn", None, "rid-9", {})
    assert alone.method == "run" and not alone.target.batchable  # asked for alone, with the same request
    with pytest.raises(StopIteration) as done:
        gen.send("the result")
    assert done.value.value == "the result"


def test_a_host_answers_a_batch_without_waiting_for_its_stragglers(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """run_batch: each item's result or own error, in order; a turn still running long after the others is
    answered Later (and finishes anyway); an error that cannot cross Ray arrives as TurnFailed."""
    import pickle
    monkeypatch.setattr(soul_host, "RemoteMemory", NoMemory)
    host = SoulHost("soul-host-0", {"data_dir": str(tmp_path), "model": "offline"}, model=OfflineModel())
    finished: list[str] = []

    class Unpicklable(InvalidInput):
        def __reduce__(self) -> Any:
            raise TypeError("cannot pickle")

    slow_may_finish = asyncio.Event()

    async def run(soul_id: str, op: str, seq: Any, rid: str, payload: dict[str, Any]) -> Any:
        if soul_id == "slow":
            await slow_may_finish.wait()  # runs until the test lets it, long after the others
        else:
            await asyncio.sleep(payload["s"])
        finished.append(soul_id)
        if soul_id == "bad":
            raise InvalidInput("turn text is empty")
        if soul_id == "odd":
            raise Unpicklable("odd")
        if soul_id == "bug":
            raise ZeroDivisionError("boom")
        return f"done {soul_id}"
    monkeypatch.setattr(host, "run", run)
    items = [(s, "turn", None, f"rid-{s}", {"s": d}) for s, d in
             (("a", 0.01), ("slow", None), ("bad", 0.01), ("b", 0.02), ("odd", 0.01), ("bug", 0.01))]
    async def main() -> None:
        out = await host.run_batch(items)
        assert "slow" not in finished  # answered without waiting for the slow turn
        assert out[0] == "done a" and out[3] == "done b" and isinstance(out[1], routing.Later)
        assert isinstance(out[2], InvalidInput) and isinstance(out[4], TurnFailed) and isinstance(out[5], TurnFailed)
        pickle.dumps(out)  # the whole answer crosses Ray
        slow_may_finish.set()
        while "slow" not in finished:
            await asyncio.sleep(0.01)  # the straggler runs to its end on the host
        assert host.metrics_snapshot()["turn_stragglers"] == 1
        with pytest.raises(InvalidInput):
            await host.run_batch("not a list")  # type: ignore[arg-type]
    asyncio.run(main())


def test_the_async_driver_forgets_the_batcher_of_a_dedicated_actor_once_idle(monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    """A dedicated actor's batcher goes when nothing of it is waiting or out (such actors come and go); a
    host's stays."""
    async def run_batch(name: str, items: list[tuple[Any, ...]]) -> list[Any]:
        await asyncio.sleep(0.001)
        return [(name, it[0]) for it in items]
    monkeypatch.setattr(raycalls, "get_actor", lambda name, ns: Handle(name))
    monkeypatch.setattr(raycalls, "call", lambda h, method, items: run_batch(h.name, items))
    r = Router(["soul-host-0"], "ns", dedicated={"hot": "soul-dedicated-hot"})

    async def main() -> tuple[list[Any], set[tuple[str, str]]]:
        out = await asyncio.gather(*(r.run_async(Routed(s, "run", ("turn", None, f"rid-{s}-{i}", {})))
                                     for i in range(3) for s in ("hot", "cold", "acme:warm")))
        return out, set(r._async_locks[asyncio.get_running_loop()].batchers)
    out, kept = asyncio.run(main())
    assert ("soul-dedicated-hot", "hot") in out and ("soul-host-0", "cold") in out
    assert ("soul-host-0", "acme:warm") in out
    assert kept == {("soul-host-0", "")}  # a tenant's batcher goes too once idle (tenants come and go)


def test_each_tenant_s_turns_go_to_a_host_in_calls_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Turns of two tenants submitted together reach the host in separate ``run_batch`` calls."""
    calls: list[list[str]] = []

    async def run_batch(name: str, items: list[tuple[Any, ...]]) -> list[Any]:
        calls.append(sorted(it[0] for it in items))
        await asyncio.sleep(0.001)
        return [(name, it[0]) for it in items]
    monkeypatch.setattr(raycalls, "get_actor", lambda name, ns: Handle(name))
    monkeypatch.setattr(raycalls, "call", lambda h, method, items: run_batch(h.name, items))
    r = Router(["soul-host-0"], "ns")

    async def main() -> None:
        await asyncio.gather(*(r.run_async(Routed(s, "run", ("turn", None, f"rid-{s}", {})))
                               for s in ("a:1", "a:2", "a:3", "b:1", "b:2")))
    asyncio.run(main())
    assert all(len({s.split(":")[0] for s in c}) == 1 for c in calls) and sum(map(len, calls)) == 5, calls


def test_a_blocking_turn_goes_over_its_hosts_channel_and_falls_back_to_ray(monkeypatch: pytest.MonkeyPatch
                                                                            ) -> None:
    """A turn to a host with a local channel goes over it; a broken channel sends the same request through Ray;
    a host's error over the channel reaches the policy as itself (a move is followed); no answer in time fails
    the turn."""
    from actors.channel import ChannelBroken, ChannelTimeout
    over_channel: list[tuple[str, tuple[Any, ...]]] = []
    over_ray: list[tuple[str, tuple[Any, ...]]] = []
    behaviour: dict[str, Any] = {}

    class Client:
        def __init__(self, name: str) -> None:
            self.name = name

        def start(self, method: str, *args: Any) -> Any:
            over_channel.append((self.name, args))
            b = behaviour.pop(self.name, None)
            name = self.name

            class Sent:
                def result(self, timeout: float | None = None) -> Any:
                    if b is not None:
                        raise b
                    return ("by channel", name, args[3])
            return Sent()
    monkeypatch.setattr(raycalls, "get_actor", lambda name, ns: Handle(name))
    monkeypatch.setattr(raycalls, "call", lambda h, method, *args: over_ray.append((h.name, args)) or h.name)
    monkeypatch.setattr(raycalls, "get_raw", lambda ref, timeout=None: ("by ray", ref))
    r = Router(["soul-host-0", "soul-host-1"], "ns", channels=True)
    monkeypatch.setattr(r.channels, "client", lambda name, handle: Client(name))
    home = r.owner("maya")
    assert r.run(Routed("maya", "run", ("turn", None, "rid-1", {}))) == ("by channel", home, "rid-1")
    behaviour[home] = ChannelBroken("gone")
    assert r.run(Routed("maya", "run", ("turn", None, "rid-2", {}))) == ("by ray", home)
    assert over_ray == [(home, ("maya", "turn", None, "rid-2", {}))]  # the same request, through Ray
    other = next(h for h in r.hosts if h != home)
    behaviour[home] = Moved("maya", other)
    assert r.run(Routed("maya", "run", ("turn", None, "rid-3", {}))) == ("by channel", other, "rid-3")
    behaviour[other] = ChannelTimeout("slow")
    with pytest.raises(TurnFailed, match="no answer in time"):
        r.run(Routed("maya", "run", ("turn", None, "rid-4", {})))
    behaviour[other] = InvalidInput("turn text is empty")
    with pytest.raises(InvalidInput):
        r.run(Routed("maya", "run", ("turn", None, "rid-5", {})))


def test_the_blocking_driver_runs_the_policy_over_any_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    """The router sends through its transport: with a direct one, plain objects stand for the hosts; a host
    that answers Moved hands the soul to the actor it names, and the caller's own error comes back as itself."""
    from actors.transport import DirectTransport

    class Host:
        def __init__(self, name: str, moved_to: str | None = None) -> None:
            self.name, self.moved_to = name, moved_to

        def run(self, soul_id: str, op: str, seq: Any, rid: str, payload: dict[str, Any]) -> Any:
            if self.moved_to is not None:
                raise Moved(soul_id, self.moved_to)
            if not payload.get("text"):
                raise InvalidInput("turn text is empty")
            return (self.name, soul_id, rid)
    monkeypatch.setattr(raycalls, "get_actor", lambda name, ns: Handle(name))
    hosts = {"soul-host-0": Host("soul-host-0"), "soul-host-1": Host("soul-host-1")}
    t = DirectTransport(hosts)
    r = Router(list(hosts), "ns", transport=t)
    home = r.owner("maya")
    assert r.run(Routed("maya", "run", ("turn", None, "rid-1", {"text": "hi"}))) == (home, "maya", "rid-1")
    other = next(h for h in hosts if h != home)
    hosts[home].moved_to = other
    assert r.run(Routed("maya", "run", ("turn", None, "rid-2", {"text": "hi"}))) == (other, "maya", "rid-2")
    assert t.calls[-2:] == [(home, "run"), (other, "run")]
    with pytest.raises(InvalidInput):
        r.run(Routed("maya", "run", ("turn", None, "rid-3", {})))
