"""Micro-batching: concurrent callers share calls, each gets exactly its own results and errors."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from soul_runtime.batching import MicroBatcher
from soul_runtime.embedding.batching import BatchingEmbedder
from soul_runtime.embedding.fast import FastEmbedder
from soul_runtime.errors import EmbedderError, InvalidInput


def _run_threads(n: int, fn) -> list:
    out: list = [None] * n
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fn(i)
        except BaseException as e:  # collected for the assertions
            out[i] = e
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_concurrent_callers_share_calls_and_get_their_own_results() -> None:
    calls: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        calls.append(list(items))
        time.sleep(0.005)
        return [x * 10 for x in items]
    b: MicroBatcher[int, int] = MicroBatcher(run, max_batch=64, max_wait_s=0.05)
    out = _run_threads(16, lambda i: b.submit([i, 100 + i]))
    assert out == [[i * 10, (100 + i) * 10] for i in range(16)]
    assert sum(len(c) for c in calls) == 32
    assert len(calls) < 16  # shared, not one call per caller


def test_max_batch_splits_batches() -> None:
    sizes: list[int] = []

    def run(items: list[int]) -> list[int]:
        sizes.append(len(items))
        return items
    b: MicroBatcher[int, int] = MicroBatcher(run, max_batch=4, max_wait_s=0.05)
    out = _run_threads(12, lambda i: b.submit([i]))
    assert out == [[i] for i in range(12)]
    assert max(sizes) <= 4 and sum(sizes) == 12


def test_an_item_error_reaches_only_its_caller_and_a_run_error_reaches_all() -> None:
    def run(items: list[int]) -> list[object]:
        return [ValueError(f"bad {x}") if x % 2 else x for x in items]
    b: MicroBatcher[int, int] = MicroBatcher(run, max_batch=64, max_wait_s=0.02)
    out = _run_threads(6, lambda i: b.submit([i]))
    for i, r in enumerate(out):
        if i % 2:
            assert isinstance(r, ValueError) and str(r) == f"bad {i}"
        else:
            assert r == [i]

    def broken(items: list[int]) -> list[int]:
        raise RuntimeError("down")
    b2: MicroBatcher[int, int] = MicroBatcher(broken, max_batch=64, max_wait_s=0.02)
    assert all(isinstance(r, RuntimeError) for r in _run_threads(4, lambda i: b2.submit([i])))


def test_start_lets_a_caller_send_several_batches_before_waiting() -> None:
    resolved = []

    def resolve(value: list[int]) -> list[int]:
        resolved.append(value)
        return value
    a: MicroBatcher[int, int] = MicroBatcher(lambda items: [x + 1 for x in items], resolve=resolve, max_wait_s=0)
    b: MicroBatcher[int, int] = MicroBatcher(lambda items: [x + 2 for x in items], resolve=resolve, max_wait_s=0)
    ta, tb = a.start([1]), b.start([1])
    assert tb.result() == [3] and ta.result() == [2]
    assert len(resolved) == 2


class SlowEmbedder(FastEmbedder):
    """A model call that takes a while, as a real one does: callers arriving meanwhile wait to share the next."""

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        time.sleep(0.02)
        return super()._embed_batch(texts)


def test_serial_batches_gather_what_arrives_while_the_model_runs() -> None:
    """serial: one run at a time; callers arriving during a run share the next call instead of running beside it."""
    calls: list[list[int]] = []
    inside = threading.Event()
    overlap: list[int] = []
    running = [0]

    def run(items: list[int]) -> list[int]:
        running[0] += 1
        overlap.append(running[0])
        calls.append(list(items))
        inside.set()
        time.sleep(0.15)
        running[0] -= 1
        return [x + 1 for x in items]
    def during_a_run(b: MicroBatcher[int, int]) -> list:
        inside.clear()
        first = threading.Thread(target=lambda: b.submit([0]))
        first.start()
        assert inside.wait(5)
        out = _run_threads(12, lambda i: b.submit([i + 1]))  # all arrive while the first call runs
        first.join(5)
        return out
    out = during_a_run(MicroBatcher(run, max_batch=64, max_wait_s=0.0, serial=True))
    assert out == [[i + 2] for i in range(12)]
    assert max(overlap) == 1  # never two runs at once
    assert len(calls) <= 3 and sorted(x for c in calls[1:] for x in c) == list(range(1, 13))
    overlap.clear()
    during_a_run(MicroBatcher(run, max_batch=64, max_wait_s=0.0))
    assert max(overlap) > 1  # without serial, a new batch runs beside the first (what serial is for)


def _returns_soon(fn: Any) -> Any:
    """``fn()`` on a thread; its value once it returned, within 20 s (a batcher that waited would take its
    ``max_wait_s`` of 600 s)."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(20)
    assert out, "still waiting"
    return out[0]


def test_a_lone_caller_is_not_kept_waiting() -> None:
    b: MicroBatcher[int, int] = MicroBatcher(lambda items: items, max_wait_s=600.0)
    assert _returns_soon(lambda: b.submit([1])) == [1]


def test_batching_embedder_gives_the_inner_vectors_and_batches() -> None:
    inner = SlowEmbedder()
    emb = BatchingEmbedder(inner, max_batch=64, max_wait_s=0.05)
    texts = [f"message number {i} about the deploy" for i in range(24)]
    out = _run_threads(24, lambda i: emb.embed([texts[i]])[0])
    want = inner.embed(texts)
    assert all(np.allclose(out[i], want[i]) for i in range(24))
    assert emb.model_calls < 24
    before = emb.model_calls
    again = emb.embed(texts[:3])  # cached: no model call
    assert np.allclose(again, want[:3]) and emb.model_calls == before and emb.cache_hits >= 3
    mixed = [texts[0], "a text nobody asked for yet", "", texts[0]]  # hits, a miss, an empty text, a repeat
    assert np.array_equal(emb.embed(mixed), inner.embed(mixed))  # the very same vectors (unit rows, zero stays)
    with pytest.raises(InvalidInput):
        emb.embed("one string")  # type: ignore[arg-type]


def test_batching_embedder_keeps_the_error_tree() -> None:
    emb = BatchingEmbedder(FastEmbedder())
    with pytest.raises(InvalidInput):
        emb.embed(["ok", 3])  # type: ignore[list-item]

    class Broken(FastEmbedder):
        def _embed_batch(self, texts: list[str]) -> np.ndarray:
            raise OSError("model file gone")
    with pytest.raises(EmbedderError):
        BatchingEmbedder(Broken()).embed(["x"])


def test_async_batcher_sends_one_round_as_one_call_and_answers_each() -> None:
    import asyncio

    from soul_runtime.batching import AsyncBatcher
    sent: list[list[int]] = []

    async def send(items: list[int]) -> list[object]:
        sent.append(list(items))
        await asyncio.sleep(0.01)
        return [ValueError(f"bad {x}") if x == 3 else x * 10 for x in items]
    b: AsyncBatcher[int, int] = AsyncBatcher(send, max_batch=4, max_calls=2)

    async def main() -> list[object]:
        return await asyncio.gather(*(b.submit(i) for i in range(10)), return_exceptions=True)
    out = asyncio.run(main())
    assert [o for i, o in enumerate(out) if i != 3] == [i * 10 for i in range(10) if i != 3]
    assert isinstance(out[3], ValueError) and str(out[3]) == "bad 3"  # its own caller only
    # two calls out at most; the rest waited and went together when one answered
    assert sent == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert (b.calls, b.items) == (3, 10)


def test_async_batcher_holds_items_while_its_calls_are_out_and_fails_a_whole_batch_together() -> None:
    import asyncio

    from soul_runtime.batching import AsyncBatcher
    sent: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        sent.append(list(items))
        await asyncio.sleep(0.02)
        if 99 in items:
            raise RuntimeError("host down")
        return items

    async def main() -> tuple[list[object], list[object]]:
        b: AsyncBatcher[int, int] = AsyncBatcher(send, max_batch=32, max_calls=1)
        first = asyncio.ensure_future(b.submit(0))
        await asyncio.sleep(0)  # the first call is out
        later = [asyncio.ensure_future(b.submit(i)) for i in (1, 2, 99)]
        await asyncio.sleep(0.005)
        more = [asyncio.ensure_future(b.submit(i)) for i in (4, 5)]
        return [await first], await asyncio.gather(*later, *more, return_exceptions=True)
    first, rest = asyncio.run(main())
    assert first == [0]
    assert sent == [[0], [1, 2, 99, 4, 5]]  # held while the one call allowed was out, then sent together
    assert all(isinstance(r, RuntimeError) for r in rest)  # the call failed: every caller of it hears so


def test_async_batcher_drops_a_cancelled_unsent_item_and_refuses_a_wrong_count() -> None:
    import asyncio

    from soul_runtime.batching import AsyncBatcher
    from soul_runtime.errors import RuntimeUnavailable, SoulError
    sent: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        sent.append(list(items))
        await asyncio.sleep(0.02)
        return items[:-1] if 7 in items else items  # one result short: another protocol

    async def main() -> tuple[bool, object]:
        b: AsyncBatcher[int, int] = AsyncBatcher(send, max_batch=32, max_calls=1)
        first = asyncio.ensure_future(b.submit(0))
        await asyncio.sleep(0)  # the one call allowed is out
        held = asyncio.ensure_future(b.submit(1))
        await asyncio.sleep(0)
        held.cancel()  # its caller gave up before it was sent
        await asyncio.gather(first, held, return_exceptions=True)
        idle_after = b.idle
        short = await asyncio.gather(b.submit(7), b.submit(8), return_exceptions=True)
        return idle_after, short
    idle_after, short = asyncio.run(main())
    assert sent[0] == [0] and [1] not in sent and 1 not in sent[-1]  # the cancelled item never went out
    assert idle_after  # and is not kept (nor its loop)
    assert all(isinstance(r, RuntimeUnavailable) and isinstance(r, SoulError) for r in short)  # type: ignore[union-attr]
    assert "2 items was answered with 1 results" in str(short[0])


def test_micro_batcher_refuses_a_wrong_count_with_the_error_tree() -> None:
    from soul_runtime.errors import RuntimeUnavailable
    b: MicroBatcher[int, int] = MicroBatcher(lambda items: items[:-1], max_wait_s=0.0)
    with pytest.raises(RuntimeUnavailable, match="answered with 0 results"):
        b.start([5]).result()


def test_async_batcher_stops_counting_a_call_out_longer_than_release_after_s() -> None:
    """A call waiting on something slow frees its place among max_calls after release_after_s: items submitted
    meanwhile go out then, not when the slow call answers; without it they wait for the answer."""
    import asyncio

    from soul_runtime.batching import AsyncBatcher

    async def run(release: float | None) -> tuple[list[str], float, bool]:
        events: list[str] = []  # the order things happened in, not how long they took
        sent_at: list[float] = []
        t0 = asyncio.get_running_loop().time()

        async def send(items: list[int]) -> list[int]:
            events.append(f"send {items}")
            sent_at.append(asyncio.get_running_loop().time() - t0)
            await asyncio.sleep(0.6 if 0 in items else 0.01)
            events.append(f"answered {items}")
            return items
        b: AsyncBatcher[int, int] = AsyncBatcher(send, max_batch=32, max_calls=1, release_after_s=release)
        slow = asyncio.ensure_future(b.submit(0))
        await asyncio.sleep(0.01)
        assert await b.submit(1) == 1
        busy = not b.idle  # the slow call is still out
        assert await slow == 0 and b.idle
        return events, sent_at[-1], busy
    released, second_sent_at, busy = asyncio.run(run(0.1))
    assert released == ["send [0]", "send [1]", "answered [1]", "answered [0]"] and busy
    assert second_sent_at >= 0.08  # not before release_after_s
    held, _, _ = asyncio.run(run(None))
    assert held == ["send [0]", "answered [0]", "send [1]", "answered [1]"]
    with pytest.raises(ValueError):
        AsyncBatcher(lambda items: asyncio.sleep(0), release_after_s=0)  # type: ignore[arg-type,return-value]


def test_an_async_batch_answered_early_lets_each_caller_go_on_its_own_answer() -> None:
    """``early=True``: a caller whose item is answered goes on while the rest of its batch is still out; an
    item the call ends without answering gets an error of its own."""
    import asyncio

    from soul_runtime.batching import AsyncBatcher
    from soul_runtime.errors import RuntimeUnavailable

    async def main() -> None:
        slow = asyncio.Event()

        async def send(items: list[int], answer: Any) -> None:
            answer(0, items[0] * 10)
            await slow.wait()
            if len(items) > 2:
                answer(1, ValueError("item 1"))  # an item's own error; item 2 left unanswered
                return None
            answer(1, items[1] * 10)
            return None
        b: AsyncBatcher[int, int] = AsyncBatcher(send, max_batch=8, early=True)
        first, second = asyncio.ensure_future(b.submit(1)), asyncio.ensure_future(b.submit(2))
        assert await asyncio.wait_for(first, 5) == 10 and not second.done()  # not held by its batch
        slow.set()
        assert await second == 20
        slow.clear()
        calls = [asyncio.ensure_future(b.submit(i)) for i in (3, 4, 5)]
        assert await calls[0] == 30
        slow.set()
        with pytest.raises(ValueError, match="item 1"):
            await calls[1]
        with pytest.raises(RuntimeUnavailable):
            await calls[2]
    asyncio.run(main())
