"""Turns that wait for their model hold no thread: a host keeps hundreds in flight on its event loop, admits a
bounded number, and a caller that gives up never leaves a turn half applied (no Ray: the host class on a loop
of the test's, with in-process stores)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from actors import soul_host
from actors.routing import Routed, Router
from actors.soul_host import SoulHost
from actors.transport import DirectTransport
from soul_runtime.errors import RuntimeBusy
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.base import (
    AsyncLanguageModel,
    Exchange,
    MemoryDecision,
    ModelReply,
    ReplyRequest,
    TaskClassification,
)
from soul_runtime.models.offline import OfflineModel

from .fakes import HashEmbedder

T0 = 1_780_000_000


class SlowModel(AsyncLanguageModel):
    """The offline model's answers after ``delay_s`` of waiting (a remote model's latency), counting the calls
    waiting at once."""

    model_id = "slow-test-1"

    def __init__(self, delay_s: float) -> None:
        self.inner = OfflineModel()
        self.delay_s = delay_s
        self.waiting = 0
        self.peak = 0
        self.calls: list[str] = []
        self.decide_gate: asyncio.Event | None = None
        """When set up, a memory decision also waits for it (the test opens it)."""

    async def _wait(self, what: str) -> None:
        self.calls.append(what)
        self.waiting += 1
        self.peak = max(self.peak, self.waiting)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.waiting -= 1

    async def reply(self, request: ReplyRequest) -> ModelReply:
        await self._wait("reply")
        return self.inner.reply(request)

    async def decide(self, exchange: Exchange) -> MemoryDecision:
        await self._wait("decide")
        if self.decide_gate is not None:
            await self.decide_gate.wait()
        return self.inner.decide(exchange)

    async def classify_task(self, text: str, known: tuple[str, ...]) -> TaskClassification:
        return self.inner.classify_task(text, known)


class LocalMemory:
    """The host's memory port on in-process stores (the shards' own engine, without actors)."""

    def __init__(self, soul_id: str, calls: object, directory: Path | None = None) -> None:
        assert directory is not None
        self.mem = SoulMemory(directory, embedder=HashEmbedder())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.mem, name)


def make_host(tmp: Path, monkeypatch: pytest.MonkeyPatch, model: SlowModel, **cfg: Any) -> SoulHost:
    monkeypatch.setattr(soul_host, "RemoteMemory", LocalMemory)
    conf = {"data_dir": str(tmp), "model": "offline", "host_capacity": 1000, "idle_check_s": 0, **cfg}
    return SoulHost("soul-host-0", conf, model=model)


def turn(text: str, i: int = 0, **payload: Any) -> dict[str, Any]:
    return {"text": text, "user": "maya", "at": T0 + 60 * i, **payload}


def test_hundreds_of_turns_wait_for_their_model_at_once_on_a_few_threads(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    model = SlowModel(0.5)
    souls = [f"s{i}" for i in range(300)]

    async def main() -> tuple[list[Any], int, float]:
        host = make_host(tmp_path, monkeypatch, model, host_threads=4)
        before = threading.active_count()
        peak_threads = [before]

        async def watch() -> None:
            while True:
                peak_threads[0] = max(peak_threads[0], threading.active_count())
                await asyncio.sleep(0.02)
        watcher = asyncio.ensure_future(watch())
        t0 = time.monotonic()
        out = await asyncio.gather(*(host.run(s, "turn", None, f"r-{s}", turn(f"{s} ships the Orca release on Friday."))
                                     for s in souls))
        took = time.monotonic() - t0
        watcher.cancel()
        assert host.in_progress == 0
        await host.stop()
        return out, peak_threads[0] - before, took
    out, more_threads, took = asyncio.run(main())
    assert [r.seq for r in out] == [1] * 300 and all(r.turn_id == f"{s}/1" for r, s in zip(out, souls, strict=True))
    assert model.peak >= 250  # the replies (then the memory decisions) waited side by side
    assert more_threads <= 4 + 2  # the host's threads and its closing thread, whatever is in flight
    assert len(model.calls) == 600


def test_a_users_async_model_named_by_import_path_is_awaited_on_the_hosts_loop(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The host makes the model from its name (as ``connect(model="package.module:attr")`` does): its coroutines
    wait side by side on the host's loop, many more at once than the host has threads."""
    from tests.user_models import WaitingModel
    monkeypatch.setattr(soul_host, "RemoteMemory", LocalMemory)
    monkeypatch.setattr(WaitingModel, "peak", 0)
    threads = 2

    async def main() -> list[Any]:
        host = SoulHost("soul-host-0", {"data_dir": str(tmp_path), "model": "tests.user_models:WaitingModel",
                                        "model_args": {"delay_s": "0.3"}, "host_capacity": 1000, "idle_check_s": 0,
                                        "host_threads": threads})
        assert isinstance(host.model, WaitingModel)  # the model as the user wrote it, not a blocking view of it
        out = await asyncio.gather(*(host.run(f"u{i}", "turn", None, f"r{i}", turn(f"u{i} moved to Lisbon."))
                                     for i in range(120)))
        await host.stop()
        return out
    out = asyncio.run(main())
    assert [r.reply for r in out] == [f"waited: u{i} moved to Lisbon." for i in range(120)]
    assert WaitingModel.peak >= 100 > threads  # on threads, at most ``threads`` calls would wait at once


def test_memory_work_beside_the_reply_runs_as_tasks_and_the_next_turn_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = SlowModel(0.2)

    async def main() -> None:
        host = make_host(tmp_path, monkeypatch, model, host_threads=2)
        model.decide_gate = asyncio.Event()
        before = threading.active_count()
        first = await asyncio.gather(*(host.run(f"w{i}", "turn", None, f"a{i}",
                                                turn(f"w{i}'s deploy key rotates every 30 days.", wait_writes=False))
                                       for i in range(50)))
        assert all(r.writes_pending and r.writes == () for r in first)
        assert host.metrics_snapshot()["memory_work"] == 50 and threading.active_count() - before <= 2 + 2
        model.decide_gate.set()  # the memory decisions answer; each soul's next turn waits for its own
        second = await asyncio.gather(*(host.run(f"w{i}", "turn", None, f"b{i}",
                                                 turn("How often does the deploy key rotate?", 1))
                                        for i in range(50)))
        for i, r in enumerate(second):
            assert r.seq == 2 and any("30 days" in it.text for it in r.recalled), i  # the first turn's writes
        assert await host.stop() == 50
    asyncio.run(main())


def test_a_host_admits_a_bounded_number_of_calls_and_refuses_the_rest_untouched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = SlowModel(0.3)

    async def main() -> None:
        host = make_host(tmp_path, monkeypatch, model, host_admission=10)
        out = await asyncio.gather(*(host.run(f"a{i}", "turn", None, f"r{i}", turn("Ana moved to Lisbon in May."))
                                     for i in range(30)), return_exceptions=True)
        busy = [i for i, r in enumerate(out) if isinstance(r, RuntimeBusy)]
        assert len(busy) == 20 and all(not isinstance(r, BaseException) for r in out[:10])
        assert host.metrics.local["busy"] == 20
        for i in busy:  # refused before anything of it ran: no turn, no model call, nothing stored
            assert await host.last_seq(f"a{i}") == 0
            assert (await host.traces(f"a{i}", 5)) == []
        assert len(model.calls) == 20  # the admitted ten: a reply and a decision each
        assert model.peak <= 10
        again = await host.run("a15", "turn", None, "r15", turn("Ana moved to Lisbon in May."))  # room again
        assert again.seq == 1
        await host.stop()
    asyncio.run(main())


@pytest.mark.parametrize("wait_writes", [True, False], ids=["wait-writes", "reply-first"])
def test_a_caller_that_gives_up_mid_model_call_leaves_the_turn_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    wait_writes: bool) -> None:
    """Cancelled while its reply is being made: the turn runs to its end exactly once; asked again with its
    request id it answers the recorded result; the next turn is number 2 and reads what the first wrote."""
    model = SlowModel(0.4)

    async def main() -> None:
        host = make_host(tmp_path, monkeypatch, model)
        first = turn("The staging database moved to port 6543.", wait_writes=wait_writes)
        caller = asyncio.ensure_future(host.run("maya", "turn", None, "req-1", first))

        async def reply_asked() -> None:
            while "reply" not in model.calls:
                await asyncio.sleep(0.005)
        await asyncio.wait_for(reply_asked(), timeout=60)  # a guard against a hang, not a measurement
        assert model.calls == ["reply"] and model.waiting == 1
        caller.cancel()  # the caller gives up while the model is still answering
        with pytest.raises(asyncio.CancelledError):
            await caller
        again = await host.run("maya", "turn", None, "req-1", first)  # the caller's retry: the same turn
        assert again.seq == 1 and again.turn_id == "maya/1"
        nxt = await host.run("maya", "turn", None, "req-2", turn("Which port is the staging database on?", 1))
        assert nxt.seq == 2 and any("6543" in it.text for it in nxt.recalled)
        assert model.calls.count("reply") == 2  # the cancelled turn's reply was made once, not twice
        traces = await host.traces("maya", 10)
        assert [t.seq for t in traces] == [1, 2] and traces[0].request_id == "req-1" and traces[0].writes
        eps = host.active["maya"].live.memory.mem.episodes()
        assert sum("6543" in e.text for e in eps) >= 1 and len({e.id for e in eps}) == len(eps)
        await host.stop()
    asyncio.run(main())


class BusyHost:
    """A host object answering RuntimeBusy ``busy`` times, then the turn."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.calls = 0

    def run(self, soul_id: str, *args: Any) -> str:
        self.calls += 1
        if self.calls <= self.busy:
            raise RuntimeBusy("soul-host-0 has 1000 calls in progress (host_admission)")
        return f"done {soul_id}"

    def run_batch(self, items: list[tuple[Any, ...]]) -> list[Any]:
        out: list[Any] = []
        for it in items:
            try:
                out.append(self.run(*it))
            except RuntimeBusy as e:
                out.append(e)
        return out


def test_the_router_waits_out_a_busy_host_then_says_runtime_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    from actors import routing
    monkeypatch.setattr(routing, "BUSY_PAUSE_S", (0.01, 0.05))
    for driver in ("blocking", "async"):
        host = BusyHost(busy=5)
        r = Router(["soul-host-0"], "ns", transport=DirectTransport({"soul-host-0": host}), busy_wait_s=10)
        monkeypatch.setattr(r.handles, "get", lambda name: name)
        call = Routed("maya", "run", ("turn", None, "r1", {}))
        got = r.run(call) if driver == "blocking" else asyncio.run(r.run_async(call))
        assert got == "done maya" and host.calls == 6  # five busy answers waited out, not counted as attempts
        stuck = BusyHost(busy=10**6)
        r = Router(["soul-host-0"], "ns", transport=DirectTransport({"soul-host-0": stuck}), busy_wait_s=0.3)
        monkeypatch.setattr(r.handles, "get", lambda name: name)
        t0 = time.monotonic()
        with pytest.raises(RuntimeBusy, match="busy_wait_s"):
            r.run(call) if driver == "blocking" else asyncio.run(r.run_async(call))
        assert time.monotonic() - t0 >= 0.3 and stuck.calls > 3  # busy_wait_s waited out, then given up


def test_the_async_model_bench_counts_turns_only_while_every_client_is_sending() -> None:
    from soul_apps.bench.async_model import steady_rate
    # two clients: the second's first answer at 4 s; the first finds no turn left at 10 s; a straggler at 12 s
    answered = [1.0, 2.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 12.0]
    rate, window = steady_rate(answered, first=[1.0, 4.0], dry=[10.0, 12.5], wall=12.5)
    assert window == (4.0, 10.0) and rate == 6 / 6.0
    assert steady_rate([1.0], first=[5.0], dry=[3.0], wall=6.0)[0] is None  # too short to have a window
