"""The local channel (a Unix socket per store shard and soul host): calls, errors, breakage and the fallback
to Ray."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from actors.channel import ChannelBook, ChannelBroken, ChannelClient, ChannelServer, ChannelTimeout, connect, machine_id
from soul_runtime.errors import InvalidInput, TurnFailed


class Target:
    def __init__(self) -> None:
        self.seen: list[object] = []

    def recall_batch(self, items: list[int]) -> list[object]:
        self.seen.append(list(items))
        time.sleep(0.001 * len(items))
        return [InvalidInput(f"bad {x}") if x < 0 else x * 2 for x in items]

    def apply_batch(self, items: list[int]) -> object:
        if items == [13]:
            raise InvalidInput("thirteen refused")
        return lambda: None  # cannot be pickled

    def secret(self) -> str:
        return "not for the channel"


def test_calls_come_back_with_their_own_answers_and_errors() -> None:
    target = Target()
    server = ChannelServer(target, ("recall_batch", "apply_batch"))
    try:
        assert stat.S_IMODE(os.stat(server.dir).st_mode) == 0o700  # this user's processes only
        client = connect(server.address)
        assert isinstance(client, ChannelClient)
        out = client.call("recall_batch", [1, -2, 3])
        assert out[0] == 2 and out[2] == 6 and isinstance(out[1], InvalidInput)  # an item's error, as itself
        with pytest.raises(InvalidInput, match="thirteen refused"):  # a call's error, as itself
            client.call("apply_batch", [13])
        with pytest.raises(TurnFailed, match="cannot be sent back"):
            client.call("apply_batch", [1])
        with pytest.raises(TurnFailed, match="not served"):
            client.call("secret")
        assert not client.broken  # errors are answers; the channel stays

        # several callers at once, each on its own connection, each with its own answer
        got: dict[int, object] = {}
        wide = ChannelClient(server.path, max_open=8)

        def one(i: int) -> None:
            got[i] = wide.call("recall_batch", [i, i + 100])
        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == {i: [2 * i, 2 * (i + 100)] for i in range(8)}
        # started calls can be awaited later, in any order
        a, b = client.start("recall_batch", [5]), client.start("recall_batch", [7])
        assert (b.result(), a.result()) == ([14], [10])
    finally:
        server.close()
    assert not os.path.exists(server.path)


def test_a_new_server_removes_the_sockets_dead_processes_left() -> None:
    import subprocess
    import sys
    code = ("from actors.channel import ChannelServer; import os; "
            "s = ChannelServer(object(), ()); print(s.path, flush=True); os._exit(0)")  # dies without closing
    left = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.exists(left)
    server = ChannelServer(Target(), ("recall_batch",))
    try:
        assert not os.path.exists(left) and os.path.exists(server.path)
        assert os.path.dirname(left) == server.dir
    finally:
        server.close()


def test_a_socket_listened_on_but_never_accepting_does_not_hold_up_a_new_server() -> None:
    """A socket left under a dead process's name whose listener still lives (a child that kept the descriptor) and
    whose queue is full: a new server's sweep keeps it and goes on; it neither waits on it nor removes it."""
    import socket
    import subprocess
    import sys

    from actors.channel import socket_dir, sweep_dead
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    path = os.path.join(socket_dir(), f"{dead}-feedbeef")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(0)
    queued = []
    try:
        while True:  # fill its queue: nothing accepts
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            queued.append(c)
            try:
                c.connect(path)
            except BlockingIOError:
                break
        done = threading.Event()
        swept: list[int] = []
        t = threading.Thread(target=lambda: (swept.append(sweep_dead(socket_dir())), done.set()), daemon=True)
        t.start()
        assert done.wait(60), "the sweep waits on a socket nobody accepts on"
        assert os.path.exists(path)  # listened on: not a dead process's
        server = ChannelServer(Target(), ("recall_batch",))
        try:
            assert connect(server.address).call("recall_batch", [4]) == [8]  # type: ignore[union-attr]
        finally:
            server.close()
    finally:
        for c in queued:
            c.close()
        listener.close()
        os.unlink(path)


def test_a_pending_call_collected_while_its_client_holds_its_lock_gives_its_place_back() -> None:
    """A call dropped unread gives its place back when it is collected, whichever thread the collector runs in,
    also one inside the client's own lock (its close() allocates under it)."""
    server = ChannelServer(Target(), ("recall_batch",))
    try:
        client = ChannelClient(server.path, max_open=2)
        pending = client.start("recall_batch", [1])
        assert client._out == 1
        done = threading.Event()

        def collect_under_the_lock() -> None:
            nonlocal pending
            with client._lock:
                del pending  # the last reference: Pending.__del__ gives the slot back here
            done.set()
        t = threading.Thread(target=collect_under_the_lock, daemon=True)
        t.start()
        assert done.wait(60), "a dropped call's place is given back under a lock its thread holds"
        assert client._out == 0 and client.call("recall_batch", [2]) == [4]
    finally:
        server.close()


def _step_loop_registrations_without_a_descriptor() -> list[int]:
    """Descriptors the step loop's selector holds a registration for that its epoll set lacks (a descriptor
    closed behind the loop's back: a later socket given that number would be taken for registered)."""
    import re

    from soul_runtime.steps import step_loop
    loop: Any = step_loop()
    with open(f"/proc/self/fdinfo/{loop._selector._selector.fileno()}") as f:
        polled = {int(n) for n in re.findall(r"tfd:\s+(\d+)", f.read())}
    return sorted({k.fd for k in loop._selector.get_map().values()} - polled)


@pytest.mark.skipif(not os.path.exists("/proc/self/fdinfo"), reason="reads the epoll set from /proc (Linux)")
def test_a_server_closed_while_it_starts_leaves_the_loop_nothing_stale() -> None:
    """A server closed from another thread while the step loop starts serving it (its test or its actor done
    quickly) is stopped through the loop: the loop keeps no registration for its closed socket, and the next
    server, whose socket may get the same number, accepts."""
    import random
    rnd = random.Random(7)
    for i in range(300):
        server = ChannelServer(Target(), ("recall_batch",))
        end = time.perf_counter() + rnd.uniform(0, 0.008)  # the main thread busy while the loop thread starts it
        while time.perf_counter() < end:
            pass
        server.close()
        time.sleep(0.002)
        assert _step_loop_registrations_without_a_descriptor() == [], f"after {i + 1} servers"
    server = ChannelServer(Target(), ("recall_batch",))
    try:
        assert ChannelClient(server.path).start("recall_batch", [5]).result(timeout=30) == [10]
    finally:
        server.close()


def test_a_full_client_refuses_a_call_without_breaking() -> None:
    server = ChannelServer(Target(), ("recall_batch",))
    try:
        client = ChannelClient(server.path, max_open=2)
        first, second = client.start("recall_batch", [1]), client.start("recall_batch", [2])
        with pytest.raises(ChannelBroken, match="2 calls out"):
            client.start("recall_batch", [3])
        assert not client.broken
        assert (first.result(), second.result()) == ([2], [4])
        assert client.call("recall_batch", [3]) == [6]  # a connection came back to the pool
    finally:
        server.close()


def test_a_closed_server_breaks_the_channel_and_unreachable_addresses_give_none(tmp_path) -> None:
    target = Target()
    server = ChannelServer(target, ("recall_batch", "apply_batch"))
    client = connect(server.address)
    assert client is not None and client.call("recall_batch", [1]) == [2]
    release = threading.Event()
    target.apply_batch = lambda items: release.wait(5)  # type: ignore[method-assign]
    pending = client.start("apply_batch", [50])  # out, unanswered, while the server goes away
    server.close()
    release.set()
    with pytest.raises(ChannelBroken):
        pending.result()
    assert client.broken
    with pytest.raises(ChannelBroken):
        client.start("recall_batch", [1])
    assert connect(server.address) is None  # the socket is gone
    assert connect(("another-machine/boot", server.path)) is None
    assert connect(None) is None and connect("nonsense") is None
    assert connect((machine_id(), str(tmp_path / "no-socket"))) is None


@pytest.mark.ray
def test_a_host_calls_its_shards_over_their_channels_and_survives_a_killed_shard(runtime, soul_id) -> None:
    """On one machine the shards' batch calls go over the channels; a shard SIGKILLed between turns is
    reached through Ray until its new channel is found, and no turn fails or is lost."""
    import signal

    from actors import raycalls
    from actors.runtime import host_name
    from actors.shard_client import StoreLocator

    def channel_calls(prefix: str = "shard_channel_calls:") -> int:
        n = 0
        for i in range(runtime.cfg.hosts):
            m = raycalls.get(raycalls.call(raycalls.get_actor(host_name(i), runtime.cfg.namespace), "metrics_snapshot"))
            n += sum(v for k, v in m.items() if k.startswith(prefix))
        return n

    soul = runtime.soul(soul_id)
    before, turns_before = channel_calls(), channel_calls("channel_calls")
    for i in range(4):
        soul.turn(f"I planted {i + 2} apple trees behind the barn")
    assert channel_calls() > before  # the host's calls to the shards
    assert channel_calls("channel_calls") >= turns_before + 3  # the blocking turns to the host (the first asks)
    shard = StoreLocator(runtime.cfg).handle("episodic", soul_id)
    pid = raycalls.get(raycalls.call(shard, "pid"))
    os.kill(pid, signal.SIGKILL)
    for i in range(6):
        r = soul.turn(f"My sister visited on day {i + 10} of the harvest")
        assert r.seq == 5 + i
        time.sleep(0.3)
    assert raycalls.get(raycalls.call(shard, "pid")) != pid  # restarted
    assert [t.seq for t in soul.traces(last=20)] == list(range(1, 11))  # type: ignore[union-attr]
    mid = channel_calls()
    soul.turn("The barn roof was fixed last week")
    assert channel_calls() > mid  # back on the new shard's channel


def test_a_server_refuses_connections_beyond_its_limit() -> None:
    server = ChannelServer(Target(), ("recall_batch",), max_conns=1)
    try:
        first = ChannelClient(server.path)
        assert first.call("recall_batch", [1]) == [2]  # holds the one connection (idle in its pool)
        second = ChannelClient(server.path)
        with pytest.raises(ChannelBroken):
            second.call("recall_batch", [2])
        assert second.broken and not first.broken
        assert first.call("recall_batch", [3]) == [6]
    finally:
        server.close()


@pytest.mark.ray
def test_async_turns_go_to_their_host_over_its_channel_in_batches(runtime, soul_id) -> None:
    import asyncio

    from actors import raycalls
    from actors.runtime import host_name

    def host_counts() -> tuple[int, int]:
        calls = items = 0
        for i in range(runtime.cfg.hosts):
            m = raycalls.get(raycalls.call(raycalls.get_actor(host_name(i), runtime.cfg.namespace), "metrics_snapshot"))
            calls += m.get("channel_calls", 0)
            items += m.get("turn_items", 0)
        return calls, items

    souls = [runtime.async_soul(f"{soul_id}-{k}") for k in range(6)]

    async def main() -> list[int]:
        rs = []
        for rnd in range(3):
            rs += await asyncio.gather(*(s.turn(f"Round {rnd}: I fed the goats at dawn") for s in souls))
        return [r.seq for r in rs]
    calls0, items0 = host_counts()
    seqs = asyncio.run(main())
    calls1, items1 = host_counts()
    assert sorted(seqs) == sorted([1] * 6 + [2] * 6 + [3] * 6)
    assert items1 - items0 == 18  # every turn went in a host batch
    assert 1 <= calls1 - calls0 < 18  # over the channels, several turns a call



class Odd(Exception):
    def __init__(self, *, code: int) -> None:  # pickles, but cannot be loaded again
        super().__init__(f"odd {code}")


def test_errors_travel_as_through_ray_and_a_bad_answer_keeps_the_channel() -> None:
    class Raising:
        def recall_batch(self, kind: str) -> object:
            if kind == "odd":
                raise Odd(code=3)
            if kind == "zero":
                return 1 / 0
            return kind
    server = ChannelServer(Raising(), ("recall_batch",))
    try:
        client = ChannelClient(server.path, max_open=1)
        with pytest.raises(TurnFailed, match="ZeroDivisionError"):  # not ours: as TurnFailed
            client.call("recall_batch", "zero")
        with pytest.raises(TurnFailed, match="Odd: odd 3"):  # would not load on this side
            client.call("recall_batch", "odd")
        assert client.call("recall_batch", "fine") == "fine" and not client.broken  # the one connection is reused
    finally:
        server.close()


def test_a_call_left_unread_or_timed_out_gives_its_connection_up() -> None:
    import gc
    release = threading.Event()

    class Slow:
        def recall_batch(self, items: list[int]) -> list[int]:
            release.wait(5)
            return items
    server = ChannelServer(Slow(), ("recall_batch",))
    try:
        client = ChannelClient(server.path, max_open=2)
        abandoned = client.start("recall_batch", [1])
        del abandoned  # its caller failed elsewhere and never reads it
        gc.collect()
        with pytest.raises(ChannelTimeout):
            client.call("recall_batch", [2], timeout=0.05)
        assert not client.broken
        release.set()
        first, second = client.start("recall_batch", [3]), client.start("recall_batch", [4])  # both slots free
        assert (first.result(), second.result()) == ([3], [4])
    finally:
        release.set()
        server.close()


def test_the_book_asks_an_actor_again_only_when_due_and_forgets_one_gone() -> None:
    now = [100.0]
    asked: list[str] = []
    server = ChannelServer(Target(), ("recall_batch",))
    answers = {"shard-a": server.address, "far": ("another-machine/boot", "/x")}

    def ask(handle: str) -> object:
        asked.append(handle)
        if handle == "down":
            raise TimeoutError("no answer")
        return answers[handle]
    book = ChannelBook(ask, clock=lambda: now[0], reask_s=1.0, reask_none_s=60.0)
    try:
        assert book.client("far", "far") is None and book.client("down", "down") is None
        now[0] += 30
        assert book.client("far", "far") is None and asked.count("far") == 1  # none here: asked again after 60 s
        now[0] += 31
        book.client("far", "far")
        assert asked.count("far") == 2
        ch = book.client("shard-a", "shard-a")
        assert ch is not None and book.client("shard-a", "shard-a") is ch and asked.count("shard-a") == 1
        ch._break()  # it broke (the actor restarted): asked again 1 s after the last ask, not before
        assert book.client("shard-a", "shard-a") is None and asked.count("shard-a") == 1
        now[0] += 1.5
        again = book.client("shard-a", "shard-a")
        assert again is not None and again is not ch and asked.count("shard-a") == 2
        book.forget("shard-a")
        assert book.known("shard-a") is None
        off = ChannelBook(ask, enabled=False)
        assert off.client("shard-a", "shard-a") is None and asked.count("shard-a") == 2
    finally:
        server.close()


def test_a_batch_whose_channel_breaks_mid_call_is_sent_again_through_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    from actors import raycalls, shard_client
    from actors.channel import Pending
    from actors.transport import ChannelReply, RayReply

    class Broken(Pending):
        def __init__(self) -> None:
            pass

        def result(self, timeout: float | None = None) -> object:
            raise ChannelBroken("reset by peer")

        def __del__(self) -> None:
            pass
    again: list[str] = []
    monkeypatch.setattr(raycalls, "get_raw", lambda ref, timeout=None: ["by ray", ref])
    value = ChannelReply(Broken(), lambda: again.append("sent") or RayReply("ref"))
    assert shard_client._resolve(value) == ["by ray", "ref"] and again == ["sent"]


def test_an_async_batch_goes_through_ray_when_its_host_has_no_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from actors import raycalls
    from actors.routing import HOST_CHANNEL_METHODS, AsyncSoulLocks
    from actors.transport import Transport

    class NoChannel:
        enabled = True

        async def call_async(self, name: str, handle: object, method: str, *args: object,
                             parts: object = None) -> object:
            raise ChannelBroken("none here")

    async def by_ray(items: list[tuple[object, ...]]) -> list[object]:
        return [("ray", it[0]) for it in items]
    monkeypatch.setattr(raycalls, "call", lambda h, method, items: by_ray(items))
    locks = AsyncSoulLocks(Transport(NoChannel(), HOST_CHANNEL_METHODS))  # type: ignore[arg-type]

    async def main() -> list[object]:
        b = locks.batcher("soul-host-0")
        return list(await asyncio.gather(b.submit(("h", ("a",))), b.submit(("h", ("b",)))))
    assert asyncio.run(main()) == [("ray", "a"), ("ray", "b")]


def test_a_shards_channel_serves_tenants_in_fair_order() -> None:
    """A shard's channel hands its calls to a fair pool by the tenant of their items: with one thread busy and a
    tenant's flood queued, another tenant's call goes next, not after the flood."""
    from actors.fair_pool import FairPool
    from actors.layer_shard import call_tenant

    assert [call_tenant("apply_batch", (items,)) for items in ([("acme:s1", [], {})], [("s2", "q", 5)], [], ())] \
        == ["acme", "", "", ""]
    gate, order = threading.Event(), []

    class Shard:
        def recall_batch(self, items: list[tuple[str, int]]) -> int:
            if items[0][1] == 0:
                gate.wait(10)
            order.append(items[0][0])
            return items[0][1]

    server = ChannelServer(Shard(), ("recall_batch",), pool=FairPool(1), tenant=call_tenant)
    try:
        client = ChannelClient(server.path, max_open=16)
        first = client.start("recall_batch", [("a:s", 0)])  # holds the one thread
        while server.calls < 1:
            time.sleep(0.01)
        flood = [client.start("recall_batch", [("a:s", i)]) for i in range(1, 9)]
        while server.calls < 9:
            time.sleep(0.01)
        mine = client.start("recall_batch", [("b:s", 99)])
        while server.calls < 10:
            time.sleep(0.01)
        gate.set()
        assert mine.result() == 99 and first.result() == 0 and [f.result() for f in flood] == list(range(1, 9))
        assert order.index("b:s") <= 2  # after the running call and at most one of the flood's
    finally:
        server.close()


def test_an_answer_in_parts_reaches_its_caller_part_by_part() -> None:
    """An async generator method answers in parts: each part reaches the caller as it is yielded (the slow
    item's wait does not hold back the fast one's answer); its error ends the call as its answer; the
    connection is clean for the next call."""
    import asyncio

    release = asyncio.Event()

    class Streaming:
        async def run_stream(self, items: list[int]) -> AsyncIterator[list[tuple[int, int]]]:
            yield [(0, items[0] * 2)]
            await release.wait()
            if items[1] < 0:
                raise InvalidInput("negative")
            yield [(1, items[1] * 2)]

    async def main() -> None:
        server = ChannelServer(Streaming(), ("run_stream",), loop=asyncio.get_running_loop())
        try:
            await asyncio.sleep(0.05)
            client = connect(server.address)
            assert client is not None
            got: list[list[tuple[int, int]]] = []
            call = asyncio.ensure_future(client.call_async("run_stream", [1, 2], parts=got.append))
            for _ in range(200):  # the first part arrives while the second waits
                if got:
                    break
                await asyncio.sleep(0.01)
            assert got == [[(0, 2)]] and not call.done()
            release.set()
            assert await call is None and got == [[(0, 2)], [(1, 4)]]
            got.clear()
            with pytest.raises(InvalidInput, match="negative"):
                await client.call_async("run_stream", [3, -1], parts=got.append)
            assert got == [[(0, 6)]] and not client.broken
        finally:
            server.close()
    asyncio.run(main())
