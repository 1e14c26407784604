"""The soul host's threads, handed out in weighted fair order per tenant.

A host runs the code of its souls' turns on a thread pool (between the waits for the model and the stores). A
plain pool serves its queue first come, first served, so a tenant with 200 turns in flight keeps the queue full
and another tenant's step waits behind all of them. :class:`FairPool` is an ``Executor`` whose threads take the
waiting work in weighted fair order (:mod:`actors.fair_queue`): a tenant's flood waits on its own share. The
tenant of a submission is :data:`TENANT` of the submitting context (``loop.run_in_executor`` submits in the
caller's context; the host sets it for each call it runs).

The items that took a slot go to the threads through a ``queue.SimpleQueue`` (a thread waiting on it wakes in C, as
a plain pool's do); the fair order itself is kept under one lock, taken once per submission and once per finish.
A coroutine hands work over with :meth:`FairPool.run_on`, which answers on the coroutine's own loop without the
``concurrent.futures.Future`` and the chained callbacks of ``loop.run_in_executor`` (a third less CPU a hand-off).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from .fair_queue import FairQueue, Waiting, arrive, release

TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("soul_tenant", default="")
"""The tenant whose work the current context does ("" for work of no tenant)."""


def tenant_of(soul_id: str) -> str:
    """The tenant of a soul: the prefix of ``TENANT:soul`` as the service names souls ("" without one)."""
    head, sep, _ = soul_id.partition(":")
    return head if sep else ""


Item = tuple[Future[Any] | None, Callable[..., Any], tuple[Any, ...], dict[str, Any]]
"""(its future, the function, its arguments); an item of :meth:`FairPool.run_on` has no future (:func:`_on_loop`
answers it)."""


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if not fut.done():  # cancelled meanwhile: the answer has no taker
        if error is None:
            fut.set_result(result)
        else:
            fut.set_exception(error)


def _on_loop(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any], fn: Callable[..., Any],
             args: tuple[Any, ...]) -> None:
    """On a pool thread: ``fn(*args)``, its answer to ``fut`` on ``loop`` (not run when ``fut`` was cancelled
    before it began, as ``run_in_executor`` leaves a cancelled item unrun)."""
    if fut.cancelled():
        return
    result, error = None, None
    try:
        result = fn(*args)
    except BaseException as e:  # noqa: BLE001 — the submitter's to see
        error = e
    try:
        loop.call_soon_threadsafe(_settle, fut, result, error)
    except RuntimeError:  # the loop is closed: nobody waits for it
        pass


class FairPool(Executor):
    def __init__(self, threads: int, weights: Callable[[str], float] = lambda tenant: 1.0,
                 thread_name_prefix: str = "", clock: Callable[[], float] = time.monotonic, slots: int = 0) -> None:
        """``threads``: the pool's threads, started as work comes; ``slots``: items run at once (0: ``threads``;
        fewer leaves each running item more of the process's interpreter lock, so a tenant's step that goes first
        also runs at the speed it would alone). No more threads than slots are started."""
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads!r}")
        self.weights = weights
        self.clock = clock
        self.name = thread_name_prefix or "fair-pool"
        self._lock = threading.Lock()
        self._q = FairQueue(min(threads, slots) if slots > 0 else threads)
        self._items: dict[int, Item] = {}
        self._ready: queue.SimpleQueue[tuple[str, Item] | None] = queue.SimpleQueue()  # items given a slot
        self._threads: list[threading.Thread] = []
        self._tickets = itertools.count()
        self._shut = False
        self._stopped = False
        self.waited_s: defaultdict[str, float] = defaultdict(float)
        """Seconds each tenant's work waited for a thread, in all."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self._enter((fut, fn, args, kwargs))
        return fut

    def run_on(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], /, *args: Any) -> asyncio.Future[Any]:
        """``fn(*args)`` on the pool, in fair order, as ``loop.run_in_executor(self, fn, *args)`` does (called on
        ``loop``'s thread): its answer comes back to ``loop`` directly."""
        fut = loop.create_future()
        self._enter((None, _on_loop, (loop, fut, fn, args), {}))
        return fut

    def _enter(self, item: Item) -> None:
        tenant = TENANT.get()
        weight = self.weights(tenant)
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            ticket = next(self._tickets)
            self._items[ticket] = item
            self._q, started = arrive(self._q, ticket, tenant, weight, self.clock())
            if started:
                self._hand_out(started)

    def _hand_out(self, started: tuple[Waiting, ...]) -> None:
        """(Under the lock.) The items that took a slot go to the threads (one is started while there are fewer
        threads than slots in use), their waits counted."""
        now = self.clock()
        for w in started:
            if w.since != now:
                self.waited_s[w.tenant] += now - w.since
            self._ready.put((w.tenant, self._items.pop(w.ticket)))
        while len(self._threads) < self._q.used:
            t = threading.Thread(target=self._work, name=f"{self.name}_{len(self._threads)}", daemon=True)
            self._threads.append(t)
            t.start()

    def _work(self) -> None:
        while True:
            got = self._ready.get()
            if got is None:  # shut down
                return
            tenant, (fut, fn, args, kwargs) = got
            try:
                if fut is None:
                    fn(*args)  # _on_loop: it answers itself
                elif fut.set_running_or_notify_cancel():
                    try:
                        result = fn(*args, **kwargs)
                    except BaseException as e:  # noqa: BLE001 — the submitter's to see
                        fut.set_exception(e)
                    else:
                        fut.set_result(result)
            finally:
                del got, fut, fn, args, kwargs
                with self._lock:
                    self._q, started = release(self._q, tenant, self.clock())
                    if started:
                        self._hand_out(started)
                    self._stop_if_done()

    def take_waits(self) -> defaultdict[str, float]:
        """The seconds each tenant's work waited since the last take (and the count starts again)."""
        with self._lock:
            waits, self.waited_s = self.waited_s, defaultdict(float)
        return waits

    @property
    def waiting(self) -> int:
        return self._q.waiting

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more submissions; the work submitted still runs (``cancel_futures``: the work that has not started
        is cancelled instead; its place goes on as it comes up). ``wait``: until the threads are done."""
        with self._lock:
            self._shut = True
            if cancel_futures:
                for item in self._items.values():
                    _cancel(item)
            threads = list(self._threads)
            self._stop_if_done()
        if cancel_futures:  # those already handed to the threads but not started
            held: list[tuple[str, Item] | None] = []
            while True:
                try:
                    held.append(self._ready.get_nowait())
                except queue.Empty:
                    break
            for got in held:
                if got is not None:
                    _cancel(got[1])
                self._ready.put(got)
        if wait:
            for t in threads:
                t.join()

    def _stop_if_done(self) -> None:
        """(Under the lock.) Once shut down with no work left, each thread gets a ``None`` to stop at."""
        if self._shut and not self._stopped and not self._items and self._q.used == 0:
            self._stopped = True
            for _ in self._threads:
                self._ready.put(None)


def _cancel(item: Item) -> None:
    """A waiting item's future cancelled (a :meth:`FairPool.run_on` item's on its loop), so it will not run."""
    fut, _, args, _ = item
    if fut is not None:
        fut.cancel()
    else:
        loop, afut = args[0], args[1]
        try:
            if asyncio.get_running_loop() is loop:
                afut.cancel()
                return
        except RuntimeError:  # no loop runs on this thread
            pass
        try:
            loop.call_soon_threadsafe(afut.cancel)  # on its own loop's thread, where its waiter is
        except RuntimeError:  # its loop is closed
            pass
