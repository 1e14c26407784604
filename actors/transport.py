"""How a call reaches an actor: over its local channel when it has one on this machine, else through Ray.

One seam for the turn path's callers — the client's router (turns to hosts) and a host's shard calls (recalls
and writes to store shards). :meth:`Transport.send` starts a call and returns a :class:`Reply` to wait on;
:meth:`Transport.send_async` awaits one from a coroutine. A call on a channel that breaks (the actor died or
restarted) is sent again through Ray with the same arguments: every call on the turn path is idempotent (keyed
by its request id or turn). Only the methods an actor serves on its channel (``channel_methods``) take it.

A reply's :meth:`~Reply.result` raises the call's own error as the path it took reports it: through Ray as
Ray's exception (a caller tells a dead actor from a failed call by it), over a channel as the
:class:`~soul_runtime.errors.SoulError` it raised (anything else as ``TurnFailed``), and
:class:`~actors.channel.ChannelTimeout` when a channel call has no answer within its time-out.

:class:`DirectTransport` calls plain objects of this process instead, for tests of the callers.
"""

from __future__ import annotations

import inspect
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from . import raycalls
from .channel import ChannelBook, ChannelBroken, Pending


class Reply(Protocol):
    def result(self, timeout: float | None = None) -> Any: ...


class RayReply:
    """A call sent through Ray (an ObjectRef)."""

    __slots__ = ("ref",)

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def result(self, timeout: float | None = None) -> Any:
        return raycalls.get_raw(self.ref, timeout)


class ChannelReply:
    """A call sent on a local channel, with the way to send it again through Ray should the channel break."""

    __slots__ = ("pending", "again")

    def __init__(self, pending: Pending, again: Callable[[], Reply]) -> None:
        self.pending, self.again = pending, again

    def result(self, timeout: float | None = None) -> Any:
        try:
            return self.pending.result(timeout)
        except ChannelBroken:  # the actor died or restarted: Ray waits for it
            return self.again().result(timeout)


class Transport:
    """Calls to named actors: the channel of an actor on this machine first (``book``), Ray otherwise. Counts
    the calls that went on a channel, per method."""

    def __init__(self, book: ChannelBook, channel_methods: Iterable[str]) -> None:
        self.book = book
        self.channel_methods = frozenset(channel_methods)
        self.channel_calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _counted(self, method: str) -> None:
        with self._lock:
            self.channel_calls[method] += 1

    def send(self, name: str, handle: Any, method: str, *args: Any) -> Reply:
        def by_ray() -> Reply:
            return RayReply(raycalls.call(handle, method, *args))
        if method in self.channel_methods:
            ch = self.book.client(name, handle)
            if ch is not None:
                try:
                    sent = ChannelReply(ch.start(method, *args), by_ray)
                except ChannelBroken:  # none free, or it broke: through Ray
                    pass
                else:
                    self._counted(method)
                    return sent
        return by_ray()

    async def send_async(self, name: str, handle: Any, method: str, *args: Any) -> Any:
        if method in self.channel_methods and self.book.enabled:
            try:
                value = await self.book.call_async(name, handle, method, *args)
            except ChannelBroken:  # none here, or it broke (the actor died): through Ray, the same call
                pass
            else:
                self._counted(method)
                return value
        return await raycalls.call(handle, method, *args)

    async def send_parts_async(self, name: str, handle: Any, method: str, whole: str,
                               parts: Callable[[Any], None], *args: Any) -> Any:
        """``method`` (an async generator method) over the actor's local channel, each part of its answer to
        ``parts`` as it comes, and None; without a channel (or when it breaks), ``whole`` (the same answer in
        one) through Ray, and its answer."""
        if method in self.channel_methods and self.book.enabled:
            try:
                await self.book.call_async(name, handle, method, *args, parts=parts)
            except ChannelBroken:  # none here, or it broke: the whole answer through Ray
                pass
            else:
                self._counted(method)
                return None
        return await raycalls.call(handle, whole, *args)

    def forget(self, name: str) -> None:
        """An actor that has gone for good (a dedicated actor): its channel is forgotten."""
        self.book.forget(name)


class _Done:
    __slots__ = ("value", "error")

    def __init__(self, value: Any, error: BaseException | None) -> None:
        self.value, self.error = value, error

    def result(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class DirectTransport:
    """Calls plain objects of this process by name (``handle`` is ignored): the callers' logic without Ray,
    for tests. ``calls`` records (name, method) in order."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects = objects
        self.calls: list[tuple[str, str]] = []
        self.channel_calls: Counter[str] = Counter()

    def send(self, name: str, handle: Any, method: str, *args: Any) -> Reply:
        self.calls.append((name, method))
        try:
            return _Done(getattr(self.objects[name], method)(*args), None)
        except Exception as e:  # noqa: BLE001 — the call's own error, read from its reply
            return _Done(None, e)

    async def send_async(self, name: str, handle: Any, method: str, *args: Any) -> Any:
        self.calls.append((name, method))
        answer = getattr(self.objects[name], method)(*args)
        return await answer if inspect.isawaitable(answer) else answer

    async def send_parts_async(self, name: str, handle: Any, method: str, whole: str,
                               parts: Callable[[Any], None], *args: Any) -> Any:
        """As if there were no channel: ``whole``, answered in one."""
        return await self.send_async(name, handle, whole, *args)

    def forget(self, name: str) -> None:
        pass
