"""An asyncio gate of ``slots`` places served in weighted fair order per tenant (:mod:`actors.fair_queue`).

``async with gate.place(tenant):`` waits for a place; the tenants' weights come from ``weights`` (asked on each
arrival). A waiter that is cancelled leaves the queue; a place given to a waiter that was cancelled meanwhile
is handed on. Counts per tenant (items admitted, items that waited, seconds waited) are kept for the host's
metrics.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from soul_runtime.loop.decide import own_window
from soul_runtime.models.base import AsyncLanguageModel

from .fair_pool import TENANT
from .fair_queue import FairQueue, Waiting, arrive, leave, release


class FairGate:
    def __init__(self, slots: int, weights: Callable[[str], float] = lambda tenant: 1.0,
                 clock: Callable[[], float] = time.monotonic, window: float = 0.0) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots!r}")
        self.q = FairQueue(slots, window=window)
        self.weights = weights
        self.clock = clock
        self._tickets = itertools.count()
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self.admitted: Counter[str] = Counter()
        self.waited: Counter[str] = Counter()
        self.waited_s: defaultdict[str, float] = defaultdict(float)

    @property
    def waiting(self) -> int:
        return self.q.waiting

    @asynccontextmanager
    async def place(self, tenant: str) -> AsyncIterator[None]:
        await self._take(tenant)
        try:
            yield
        finally:
            self._give(tenant)

    async def _take(self, tenant: str) -> None:
        ticket = next(self._tickets)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = fut
        self.q, started = arrive(self.q, ticket, tenant, self.weights(tenant), self.clock())
        self.admitted[tenant] += 1
        self._wake(started)
        if fut.done():
            return
        t0 = self.clock()
        try:
            await fut
        except BaseException:
            self._waiters.pop(ticket, None)
            if fut.done() and not fut.cancelled():  # the place was ours already: hand it on
                self._give(tenant)
            else:
                self.q = leave(self.q, ticket)
            raise
        self.waited[tenant] += 1
        self.waited_s[tenant] += self.clock() - t0

    def _wake(self, started: tuple[Waiting, ...]) -> None:
        for w in started:
            fut = self._waiters.pop(w.ticket, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
            else:  # its waiter went away meanwhile: the place goes on
                self._give(w.tenant)

    def _give(self, tenant: str) -> None:
        self.q, started = release(self.q, tenant, self.clock())
        self._wake(started)


class FairModel(AsyncLanguageModel):
    """An asynchronous model behind a :class:`FairGate`: at most ``gate``'s slots of its calls out at once on this
    loop, the waiting ones served in weighted fair order of their tenants (:data:`actors.fair_pool.TENANT`), so a
    tenant's flood waits on its share of the model's concurrency. Anything else is the inner model's."""

    def __init__(self, inner: Any, gate: FairGate) -> None:
        self.inner = inner
        self.gate = gate
        self.model_id, self.offline = inner.model_id, inner.offline

    @property
    def memory_model_id(self) -> str:
        return str(self.inner.memory_model_id)

    @property
    def label(self) -> str:
        return str(self.inner.label)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _call(self, method: str, *args: Any) -> Any:
        async with self.gate.place(TENANT.get()):
            return await getattr(self.inner, method)(*args)

    async def reply(self, request: Any) -> Any:
        return await self._call("reply", request)

    async def decide(self, exchange: Any) -> Any:
        return await self._call("decide", exchange)

    async def decide_window(self, window: Any) -> Any:
        return await self._call("decide_window", window)

    async def classify_task(self, text: str, known: tuple[str, ...]) -> Any:
        return await self._call("classify_task", text, known)


MODEL_WINDOW_S = 5.0
"""How long the model's slots a tenant held lately stay kept for it (:mod:`actors.fair_queue`)."""


def fair_model(model: Any, slots: int, weights: Callable[[str], float]) -> Any:
    """``model`` behind a fair gate of ``slots`` (0: of the model's own ``max_concurrency``), when it is an
    asynchronous model whose calls are awaited on the host's loop (and judges an observed window in one call);
    any other model (the offline one, run on the host's fair threads) as it is."""
    if not isinstance(model, AsyncLanguageModel) or getattr(model, "offline", False) or not own_window(model):
        return model
    cap = slots or int(getattr(model, "max_concurrency", 0) or 0)
    return FairModel(model, FairGate(cap, weights, window=MODEL_WINDOW_S)) if cap > 0 else model
