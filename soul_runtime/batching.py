"""Micro-batching across threads: what concurrent callers ask for within a moment goes out as one call.

``MicroBatcher(run, max_batch, max_wait_s)``: a caller's items join the batch being gathered; the first caller
of a batch (the leader) waits at most ``max_wait_s`` or until ``max_batch`` items have arrived, then calls
``run(items)`` once for everyone and each caller takes its slice of the results (the pattern of Ray Serve's
``@serve.batch``, for threads). The results are one per item, in order; an item whose result is an exception
raises it in its own caller only. An exception from ``run`` itself reaches every caller of the batch.

Used for the embedder (one model call for the texts of concurrent turns) and for a soul host's calls to a
store shard (one call carrying the recalls or writes of several souls).

``serial=True`` (the embedder): one ``run`` at a time, and the batch waiting for it stays open, so what arrives
while the model is busy goes in its next call. Batches grow with the load by themselves instead of model calls
running side by side on the same cores.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

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
        batch.done.wait()
        if batch.error is None and batch.resolved is None:
            with batch.lock:  # the first caller resolves the batch's value for everyone
                if batch.resolved is None and batch.error is None:
                    try:
                        resolved = self._batcher._resolve(batch.value)
                        if len(resolved) != len(batch.items):
                            raise RuntimeError(f"a batch of {len(batch.items)} items returned {len(resolved)} results")
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
