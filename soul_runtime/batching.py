"""Micro-batching across threads: what concurrent callers ask for within a moment goes out as one call.

``MicroBatcher(run, max_batch, max_wait_s)``: a caller's items join the batch being gathered; the first caller
of a batch (the leader) waits at most ``max_wait_s`` or until ``max_batch`` items have arrived, then calls
``run(items)`` once for everyone and each caller takes its slice of the results (the pattern of Ray Serve's
``@serve.batch``, for threads). The results are one per item, in order; an item whose result is an exception
raises it in its own caller only. An exception from ``run`` itself reaches every caller of the batch.

Used for the embedder (one model call for the texts of concurrent callers).

``serial=True`` (the embedder): one ``run`` at a time, and the batch waiting for it stays open, so what arrives
while the model is busy goes in its next call. Batches grow with the load by themselves instead of model calls
running side by side on the same cores.

:class:`AsyncBatcher` is the same for coroutines of one event loop: what is submitted while the loop runs one
round goes out as one call, with no timer (a soul host's calls to its store shards, a client's turns to a host).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from soul_runtime.errors import RuntimeUnavailable

In = TypeVar("In")
Out = TypeVar("Out")


class _Batch(Generic[In, Out]):
    __slots__ = ("items", "full", "done", "value", "error", "resolved", "lock")

    def __init__(self) -> None:
        self.items: list[In] = []
        self.full = threading.Event()
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.resolved: Sequence[Out | BaseException] | None = None
        self.lock = threading.Lock()


class Ticket(Generic[In, Out]):
    """A caller's place in a batch that has been sent; :meth:`result` waits for its results."""

    __slots__ = ("_batcher", "_batch", "_start", "_count")

    def __init__(self, batcher: MicroBatcher[In, Out], batch: _Batch[In, Out], start: int, count: int) -> None:
        self._batcher, self._batch, self._start, self._count = batcher, batch, start, count

    def result(self) -> list[Out]:
        try:
            return self._result()
        finally:
            with self._batcher._lock:
                self._batcher._active -= 1

    def _result(self) -> list[Out]:
        batch = self._batch
        if not batch.done.is_set():
            batch.done.wait()
        if batch.error is None and batch.resolved is None:
            with batch.lock:  # the first caller resolves (waits for the answer)
                if batch.resolved is None and batch.error is None:
                    try:
                        resolved = self._batcher._resolve(batch.value)
                        _check_count(len(batch.items), resolved)
                        batch.resolved = resolved
                    except BaseException as e:
                        batch.error = e
        if batch.error is not None:
            raise batch.error
        assert batch.resolved is not None
        out: list[Out] = []
        for r in batch.resolved[self._start:self._start + self._count]:
            if isinstance(r, BaseException):
                raise r
            out.append(r)
        return out


def _check_count(items: int, results: Sequence[Any]) -> None:
    """A batch's answer has one result per item, or the other side speaks another protocol."""
    if len(results) != items:
        raise RuntimeUnavailable(f"a batch of {items} items was answered with {len(results)} results "
                                 "(is the cluster running another version of soul-runtime?)")


def _identity(value: Any) -> Any:
    return value


class MicroBatcher(Generic[In, Out]):
    """``run(items)`` sends a batch and returns its value; ``resolve(value)`` turns that value into one result
    per item (default: the value is the results). A ``run`` that only starts the work (a Ray call returning an
    object ref) lets a caller start several batches before it waits for any (:meth:`start`)."""

    def __init__(self, run: Callable[[list[In]], Any], *, resolve: Callable[[Any], Sequence[Out | BaseException]]
                 = _identity, max_batch: int = 32, max_wait_s: float = 0.002, serial: bool = False) -> None:
        if max_batch < 1 or max_wait_s < 0:
            raise ValueError("max_batch must be >= 1 and max_wait_s >= 0")
        self._run = run
        self._resolve = resolve
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._lock = threading.Lock()
        self._open: _Batch[In, Out] | None = None
        self._active = 0  # callers between start() and the end of their result()
        self._running: threading.Lock | None = threading.Lock() if serial else None  # held by the batch in run()
        self.calls = 0
        self.items = 0

    def submit(self, items: Sequence[In]) -> list[Out]:
        """Run ``items`` (in one batch with whatever else is waiting); their results, in order."""
        return self.start(items).result()

    def start(self, items: Sequence[In]) -> Ticket[In, Out]:
        """Join the gathering batch; returns once the batch has been sent (not answered)."""
        items = list(items)
        with self._lock:
            self._active += 1
            batch = self._open
            leader = batch is None or len(batch.items) + len(items) > self.max_batch
            if leader:
                if batch is not None:
                    batch.full.set()  # the gathering batch leaves now; this caller starts the next one
                batch = self._open = _Batch()
            assert batch is not None
            start = len(batch.items)
            batch.items.extend(items)
            if len(batch.items) >= self.max_batch:
                batch.full.set()
        if leader:
            with self._lock:
                alone = self._active == 1
            if not alone:  # others are busy and may join within a moment; alone, nobody would
                batch.full.wait(self.max_wait_s)
            if self._running is not None:  # serial: the batch stays open while the previous one runs
                self._running.acquire()
            try:
                with self._lock:
                    if self._open is batch:
                        self._open = None
                    todo = list(batch.items)
                batch.value = self._run(todo)
                self.calls += 1
                self.items += len(todo)
            except BaseException as e:  # every caller of the batch gets the failure
                batch.error = e
            finally:
                if self._running is not None:
                    self._running.release()
                batch.done.set()
        else:
            batch.done.wait()
        return Ticket(self, batch, start, len(items))


class AsyncBatcher(Generic[In, Out]):
    """Micro-batching for the coroutines of one event loop: the items submitted while the loop runs one round
    go out as one ``send(items)`` (at most ``max_batch``; no timer), and each caller awaits its own result.

    At most ``max_calls`` calls are out at a time: what is submitted meanwhile waits for one of them to answer
    and goes in the next call, so under load the calls carry more items instead of splitting into ever smaller
    ones (each answer wakes its callers, whose next items then go together). A call out for longer than
    ``release_after_s`` stops counting (it waits on something slow, a model, not on a busy receiver), so items
    submitted meanwhile wait at most about that long to be sent.

    ``send`` returns an awaitable of one result per item; a result that is an exception is raised in its own
    caller only. An exception from ``send`` (or its awaitable) reaches every caller of the batch.

    ``early=True``: ``send(items, answer)`` may hand items' results over before its call ends, each with
    ``answer(index, result)`` (its caller goes on at once), and then return None once every item is answered.
    """

    def __init__(self, send: Callable[..., Awaitable[Sequence[Out | BaseException] | None]], *,
                 max_batch: int = 32, max_calls: int = 2, release_after_s: float | None = None,
                 early: bool = False) -> None:
        if max_batch < 1 or max_calls < 1:
            raise ValueError("max_batch and max_calls must be >= 1")
        if release_after_s is not None and not release_after_s > 0:
            raise ValueError("release_after_s must be > 0 (or None)")
        self._send = send
        self.early = early
        self.max_batch = max_batch
        self.max_calls = max_calls
        self.release_after_s = release_after_s
        self._waiting: list[tuple[In, asyncio.Future[Out]]] = []
        self._scheduled = False
        self._out = 0  # calls sent, not answered and not released
        self._calls_out = 0  # calls sent and not answered
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0
        self.items = 0

    @property
    def idle(self) -> bool:
        """Nothing waits to be sent and no call is out."""
        return not self._waiting and self._calls_out == 0

    async def submit(self, item: In) -> Out:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Out] = loop.create_future()
        self._waiting.append((item, fut))
        self._schedule(loop)
        try:
            return await fut
        except asyncio.CancelledError:  # not sent yet: it is not sent at all (nor kept, with its loop)
            self._waiting = [e for e in self._waiting if e[1] is not fut]
            raise

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._scheduled and self._waiting and self._out < self.max_calls:
            self._scheduled = True
            loop.call_soon(self._flush)  # after the coroutines ready in this round have had their turn

    def _flush(self) -> None:
        self._scheduled = False
        while self._waiting and self._out < self.max_calls:
            batch, self._waiting = self._waiting[:self.max_batch], self._waiting[self.max_batch:]
            self._out += 1
            task = asyncio.ensure_future(self._call(batch))
            self._tasks.add(task)  # held until done (the loop keeps only weak references)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, batch: list[tuple[In, asyncio.Future[Out]]]) -> None:
        self.calls += 1
        self.items += len(batch)
        loop = asyncio.get_running_loop()
        counted = [True]

        def release(schedule: bool = True) -> None:  # answered, or out too long: its place among max_calls is free
            if counted[0]:
                counted[0] = False
                self._out -= 1
                if schedule:
                    self._schedule(loop)
        timer = None if self.release_after_s is None else loop.call_later(self.release_after_s, release)
        self._calls_out += 1

        def answer(i: int, r: Out | BaseException) -> None:
            fut = batch[i][1]
            if not fut.done():  # not cancelled by its caller
                if isinstance(r, BaseException):
                    fut.set_exception(r)
                else:
                    fut.set_result(r)
        try:
            items = [item for item, _ in batch]
            sent = await (self._send(items, answer) if self.early else self._send(items))
            results: Sequence[Out | BaseException] | BaseException
            if sent is None:  # answered item by item: one left without an answer has none coming
                results = [RuntimeUnavailable("the call ended without this item's answer")] * len(batch)
            else:
                results = sent
                _check_count(len(batch), results)
        except asyncio.CancelledError:
            self._calls_out -= 1
            if timer is not None:
                timer.cancel()
            release(schedule=False)
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as e:  # every caller of the batch gets it
            results = e
        for i, (_, fut) in enumerate(batch):
            if fut.done():  # answered early, or its caller was cancelled
                continue
            r = results if isinstance(results, BaseException) else results[i]
            if isinstance(r, BaseException):
                fut.set_exception(r)
            else:
                fut.set_result(r)
        self._calls_out -= 1
        if timer is not None:
            timer.cancel()
        release()  # what waited goes after the woken callers add theirs
