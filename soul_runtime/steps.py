"""Effects as steps: one vocabulary and one pair of drivers for every piece of code that waits.

A piece of code that waits — a soul's turn, the router's retry policy, a remote model's retry loop — is written
once as a generator that yields what it waits for and does its own CPU work in between:

- :class:`Call` — ``target.method(*args, **kwargs)``: the turn loop's targets are the model and the memory
  (``"model"`` and ``"memory"``, the driver is given the objects; the loop writes its calls through typed
  :class:`Target` stand-ins, ``MODEL.reply(request)`` and ``MEMORY.recall(...)``, so mypy checks them against
  :class:`~soul_runtime.models.base.LanguageModel` and :class:`~soul_runtime.loop.soul.MemoryPort`), the
  router's an actor (:class:`actors.routing.Actor`), a remote model's its SDK client (``"client"``);
- :class:`Pause` — wait a number of seconds (a retry's back-off);
- :class:`Spawn` — run other steps beside the caller; :class:`Join` — wait for them.

A driver performs each step and sends the answer back (or throws the step's error in). One pair of drivers runs
every such generator: :func:`run_steps` (blocking, on the caller's thread) and :func:`run_steps_async` (from a
coroutine); each user gives them its ``perform``, what a step means where it runs (the turn loop, the router, the
store shard's reads, a remote model's retries, the HTTP client's and the Ray Client's retries). The turn loop's
``perform`` pair:

- :func:`drive` performs every step where it stands (the caller's thread): the in-process ``Soul``'s blocking
  API. A coroutine method (an async model) runs on the process's step loop (:func:`run`, one event loop on a
  daemon thread, shared by every caller, so an async client stays on the loop it was opened on);
  :class:`Spawn` starts a thread.
- :func:`drive_async` runs the code between steps, and the steps whose method is a plain function (the offline
  model, an in-process store), on a bounded thread pool, and awaits on the event loop the steps whose method is
  a coroutine function (a remote model's HTTP call, a store shard's answer): a turn that waits holds no thread.
  :class:`Spawn` starts a task.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from soul_runtime.errors import ModelError

T = TypeVar("T")
Steps = Generator[Any, Any, T]
"""Code as steps: yields :class:`Call`, :class:`Pause`, :class:`Spawn` and :class:`Join`; returns its result."""


@dataclass(frozen=True)
class Call:
    """``target.method(*args, **kwargs)``, the target as its driver knows it (see the module's doc)."""

    target: Any
    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


class Target:
    """A driver's target as the code that yields its steps sees it: ``target.method(*args, **kwargs)`` makes the
    step ``Call(name, method, args, kwargs)``. Typed as the target's protocol (``MODEL: LanguageModel =
    cast(LanguageModel, Target("model"))``), each call is checked against the protocol's signature and a reader
    follows it to the method the driver will call."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, method: str) -> Callable[..., Call]:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: Call(self._name, method, args, kwargs)


@dataclass(frozen=True)
class Pause:
    """Wait ``seconds`` (a retry's back-off); the answer is None."""

    seconds: float


class Work:
    """Steps started beside the caller (:class:`Spawn`): a thread (blocking driver) or a task (event loop)."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.task: asyncio.Task[Any] | None = None

    @property
    def running(self) -> bool:
        if self.thread is not None:
            return self.thread.is_alive()
        return self.task is not None and not self.task.done()

    def join(self) -> None:
        """Wait for it from a thread (a task's loop must be another thread's)."""
        if self.thread is not None:
            self.thread.join()
        elif self.task is not None and not self.task.done():
            loop = self.task.get_loop()
            asyncio.run_coroutine_threadsafe(_wait(self.task), loop).result()


async def _wait(task: asyncio.Task[Any]) -> None:
    await asyncio.wait([task])


@dataclass(frozen=True)
class Spawn:
    """Run ``steps`` beside the caller; the answer is its :class:`Work` (its error is kept there). Under
    :func:`drive_async` the caller's code right after it, up to its next step, runs on the event loop: it should
    only record the work."""

    steps: Steps[Any]
    name: str = "memory-work"


@dataclass(frozen=True)
class Join:
    """Wait until ``work`` is done (its error stays in ``work.error``)."""

    work: Work


def _blocking(step: Any, targets: Mapping[str, Any]) -> Any:
    if isinstance(step, Pause):
        time.sleep(step.seconds)
        return None
    if isinstance(step, Call):
        fn = getattr(targets[step.target], step.method)
        if inspect.iscoroutinefunction(fn):
            return run(fn(*step.args, **step.kwargs))
        return fn(*step.args, **step.kwargs)
    if isinstance(step, Spawn):
        work = Work()

        def body() -> None:
            try:
                drive(step.steps, targets)
            except BaseException as e:  # noqa: BLE001 — kept for whoever joins it
                work.error = e
        work.thread = threading.Thread(target=body, name=step.name, daemon=True)
        work.thread.start()
        return work
    if isinstance(step, Join):
        step.work.join()
        return None
    raise TypeError(f"not a step: {step!r}")


@dataclass(frozen=True)
class Done:
    """What :func:`resume` gives when the generator has returned: its return value."""
    value: Any


def resume(gen: Generator[Any, Any, Any], value: Any, error: BaseException | None) -> Any:
    """The generator's next step after the answer to its last one (``value``, or ``error`` thrown into it), or
    :class:`Done` with its return value."""
    try:
        return gen.send(value) if error is None else gen.throw(error)
    except StopIteration as stop:
        return Done(stop.value)


def run_steps(steps: Steps[T], perform: Callable[[Any], Any], *,
              catch: type[BaseException] = Exception) -> T:
    """The blocking driver: run ``steps`` to the end on this thread, each step performed by ``perform``; its
    answer is sent back, its error (one of ``catch``) thrown in."""
    value: Any = None
    error: BaseException | None = None
    while not isinstance(step := resume(steps, value, error), Done):
        try:
            value, error = perform(step), None
        except catch as e:  # the step's error goes into the steps
            value, error = None, e
    return cast(T, step.value)


async def run_steps_async(steps: Steps[T], perform: Callable[[Any], Awaitable[Any]], *,
                          catch: type[BaseException] = Exception,
                          advance: Callable[[Steps[Any], Any, BaseException | None], Awaitable[Any]] | None = None
                          ) -> T:
    """The coroutine driver: :func:`run_steps` with each step awaited. The code between steps runs on the loop,
    or where ``advance(steps, value, error)`` runs it (:func:`resume` elsewhere, say on a thread pool: what it
    gives is the next step to perform, or :class:`Done`)."""
    value: Any = None
    error: BaseException | None = None
    while not isinstance(step := resume(steps, value, error) if advance is None
                         else await advance(steps, value, error), Done):
        try:
            value, error = await perform(step), None
        except catch as e:  # the step's error goes into the steps
            value, error = None, e
    return cast(T, step.value)


def drive(steps: Steps[T], targets: Mapping[str, Any]) -> T:
    """Run a soul's ``steps`` to the end on this thread, every step performed here."""
    return run_steps(steps, lambda step: _blocking(step, targets), catch=BaseException)


def _awaited(step: Any, targets: Mapping[str, Any]) -> bool:
    """Is this a step for the event loop (a coroutine method, or a task to start or wait for)?"""
    if isinstance(step, Call):
        return inspect.iscoroutinefunction(getattr(targets[step.target], step.method))
    return True


def _advance(steps: Steps[Any], targets: Mapping[str, Any], value: Any, error: BaseException | None,
             step: Any = None) -> Any:
    """On a pool thread: run the steps' code, and the plain-function steps, up to a step for the loop (``step``:
    a plain step the steps have yielded already, to perform first)."""
    while True:
        if step is None:
            step = resume(steps, value, error)
        if isinstance(step, Done) or _awaited(step, targets):
            return step
        try:
            value, error = _blocking(step, targets), None
        except BaseException as e:  # noqa: BLE001 — the step's error goes into the steps
            value, error = None, e
        step = None


async def drive_async(steps: Steps[T], targets: Mapping[str, Any], pool: Executor,
                      spawned: Callable[[asyncio.Task[Any]], None] | None = None, *,
                      aside: asyncio.Semaphore | None = None, _places: asyncio.Semaphore | None = None) -> T:
    """Run ``steps`` to the end from a coroutine (:func:`run_steps_async`): code and plain steps on ``pool``,
    coroutine steps awaited. ``spawned(task)`` is told of every task a :class:`Spawn` starts (its owner may wait
    for them at stop). ``aside``: the places the code of the work a :class:`Spawn` starts (work beside its
    caller: a turn's memory work after its reply) may hold on ``pool`` at once, running or queued, so a burst of
    it leaves the pool's other places to the steps a caller waits for.

    The code right after a :class:`Spawn`, up to the next step, runs on the loop (it records the work it was
    given; one trip to the pool less on the caller's path); from a plain step on, the pool again.

    Cancelling the caller while a step is awaited cancels that step (its error goes into the steps, which then
    end as they would on that failure); while code runs on the pool the code finishes its part first."""
    loop = asyncio.get_running_loop()
    spawned_last = False

    def advance(gen: Steps[Any], value: Any, error: BaseException | None) -> Awaitable[Any]:
        nonlocal spawned_last
        step = None
        if spawned_last:
            spawned_last = False
            step = resume(gen, value, error)
            if isinstance(step, Done) or _awaited(step, targets):
                ready: asyncio.Future[Any] = loop.create_future()
                ready.set_result(step)
                return ready
        if _places is None:
            return on_pool(loop, pool, _advance, gen, targets, value, error, step)
        return _placed(_places, on_pool, loop, pool, _advance, gen, targets, value, error, step)

    async def perform(step: Any) -> Any:
        nonlocal spawned_last
        if isinstance(step, Call):
            return await getattr(targets[step.target], step.method)(*step.args, **step.kwargs)
        if isinstance(step, Spawn):
            work = Work()

            async def body(s: Steps[Any] = step.steps, w: Work = work) -> None:
                try:
                    await drive_async(s, targets, pool, spawned, aside=aside, _places=aside)
                except BaseException as e:  # noqa: BLE001 — kept for whoever joins it
                    w.error = e
            work.task = asyncio.ensure_future(body())
            if spawned is not None:
                spawned(work.task)
            spawned_last = True
            return work
        if isinstance(step, Pause):
            await asyncio.sleep(step.seconds)
            return None
        if isinstance(step, Join):
            if step.work.task is not None:
                await asyncio.wait([step.work.task])  # a waiter that gives up leaves the work running
            elif step.work.thread is not None:
                await on_pool(loop, pool, step.work.thread.join)
            return None
        raise TypeError(f"not a step: {step!r}")

    return await run_steps_async(steps, perform, catch=BaseException, advance=advance)


def on_pool(loop: asyncio.AbstractEventLoop, pool: Executor, fn: Callable[..., Any], *args: Any
            ) -> asyncio.Future[Any]:
    """``fn(*args)`` on ``pool``, awaited on ``loop`` (called on its thread): ``loop.run_in_executor``, or the
    pool's own ``run_on(loop, fn, *args)`` when it has one (a pool that answers a loop directly, without a
    ``concurrent.futures.Future`` in between)."""
    run_on = getattr(pool, "run_on", None)
    if run_on is not None:
        return cast("asyncio.Future[Any]", run_on(loop, fn, *args))
    return loop.run_in_executor(pool, fn, *args)


async def _placed(places: asyncio.Semaphore, run: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    async with places:
        return await run(*args)


_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def step_loop() -> asyncio.AbstractEventLoop:
    """The process's step loop, started on first use on a daemon thread."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="soul-step-loop", daemon=True).start()
            _loop = loop
        return _loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the step loop and wait for its result (its exception is raised here)."""
    loop = step_loop()
    try:
        if asyncio.get_running_loop() is loop:
            coro.close()
            raise ModelError("a coroutine waited for another one on the step loop itself: await it")
    except RuntimeError:  # no loop runs in this thread: the usual case
        pass
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
