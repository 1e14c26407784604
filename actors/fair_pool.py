"""The soul host's threads, handed out in weighted fair order per tenant.

A host runs the code of its souls' turns on a thread pool (between the waits for the model and the stores). A
plain pool serves its queue first come, first served, so a tenant with 200 turns in flight keeps the queue full
and another tenant's step waits behind all of them. :class:`FairPool` is an ``Executor`` of ``threads`` threads
that keeps the waiting work itself, per tenant, and hands a free thread to the next item in weighted fair order
(:mod:`actors.fair_queue`): a tenant's flood waits on its own share. The tenant of a submission is
:data:`TENANT` of the submitting context (``loop.run_in_executor`` submits in the caller's context; the host sets
it for each call it runs).
"""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

from .fair_queue import FairQueue, Waiting, arrive, release

TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("soul_tenant", default="")
"""The tenant whose work the current context does ("" for work of no tenant)."""


def tenant_of(soul_id: str) -> str:
    """The tenant of a soul: the prefix of ``TENANT:soul`` as the service names souls ("" without one)."""
    head, sep, _ = soul_id.partition(":")
    return head if sep else ""


Item = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class FairPool(Executor):
    def __init__(self, threads: int, weights: Callable[[str], float] = lambda tenant: 1.0,
                 thread_name_prefix: str = "", clock: Callable[[], float] = time.monotonic, slots: int = 0) -> None:
        """``slots``: items run at once (0: ``threads``; fewer leaves each running item more of the process's
        interpreter lock, so a tenant's step that goes first also runs at the speed it would alone)."""
        self.inner = ThreadPoolExecutor(threads, thread_name_prefix=thread_name_prefix)
        self.weights = weights
        self.clock = clock
        self._lock = threading.Lock()
        self._q = FairQueue(min(threads, slots) if slots > 0 else threads)
        self._items: dict[int, Item] = {}
        self._tickets = itertools.count()
        self.waited_s: defaultdict[str, float] = defaultdict(float)
        """Seconds each tenant's work waited for a thread, in all."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        tenant = TENANT.get()
        fut: Future[Any] = Future()
        weight = self.weights(tenant)
        with self._lock:
            ticket = next(self._tickets)
            self._items[ticket] = (fut, fn, args, kwargs)
            self._q, started = arrive(self._q, ticket, tenant, weight, self.clock())
            items = self._started(started)
        self._run(items)
        return fut

    def _started(self, started: tuple[Waiting, ...]) -> list[tuple[str, Item]]:
        """(Under the lock.) The items that take a thread now, their waits counted; those cancelled meanwhile
        give their place back at once."""
        now = self.clock()
        out = []
        for w in started:
            self.waited_s[w.tenant] += now - w.since
            item = self._items.pop(w.ticket, None)
            if item is not None:
                out.append((w.tenant, item))
            else:
                self._q, more = release(self._q, w.tenant, now)
                out += self._started(more)
        return out

    def _run(self, items: list[tuple[str, Item]]) -> None:
        for tenant, (fut, fn, args, kwargs) in items:
            def work(fut: Future[Any] = fut, fn: Callable[..., Any] = fn, args: tuple[Any, ...] = args,
                     kwargs: dict[str, Any] = kwargs, tenant: str = tenant) -> None:
                try:
                    if fut.set_running_or_notify_cancel():
                        try:
                            result = fn(*args, **kwargs)
                        except BaseException as e:  # noqa: BLE001 — the submitter's to see
                            fut.set_exception(e)
                        else:
                            fut.set_result(result)
                finally:
                    self._done(tenant)
            try:
                self.inner.submit(work)
            except RuntimeError:  # the pool was shut down meanwhile
                fut.cancel()
                self._done(tenant)

    def _done(self, tenant: str) -> None:
        """A thread is free: the next waiting items in fair order run."""
        with self._lock:
            self._q, started = release(self._q, tenant, self.clock())
            items = self._started(started)
        self._run(items)

    def take_waits(self) -> defaultdict[str, float]:
        """The seconds each tenant's work waited since the last take (and the count starts again)."""
        with self._lock:
            waits, self.waited_s = self.waited_s, defaultdict(float)
        return waits

    @property
    def waiting(self) -> int:
        return len(self._q.waiting)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            with self._lock:
                items, self._items = list(self._items.values()), {}
            for fut, *_ in items:
                fut.cancel()
        self.inner.shutdown(wait=wait, cancel_futures=cancel_futures)
