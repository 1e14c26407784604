"""A soul's API, written once for every transport: :class:`SoulApi` (blocking) and :class:`AsyncSoulApi`
(coroutines), as httpx writes ``Client`` and ``AsyncClient``.

Each method checks its arguments and builds a :class:`Plan` through the transport's :class:`Plans` (what to send,
and what to make of the answer); the handle class of a transport only runs plans (``_run``). The handles over Ray
(:mod:`actors.runtime`) and over HTTP (:mod:`soul_runtime.http_client`) are subclasses of these two, so every
transport has the same methods, arguments, return types and errors. The argument checks both transports share
are in :mod:`soul_runtime.soul_args`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from soul_runtime.records import Digest, Episode, Fact, FactVersion, Procedure, RecalledItem, TurnResult, TurnTrace

T = TypeVar("T")
R = TypeVar("R", bound="RuntimeApi")


@dataclass(frozen=True)
class Plan(Generic[T]):
    """A call to send (a transport's own description of it) and what to do with its answer."""

    call: Any
    then: Callable[[Any], T]


class Plans(Protocol):
    """A transport's plans: the same operations as the handles, every argument positional and checked."""

    def turn(self, text: str, user: str | None, at: Any, request_id: str | None, wait_writes: bool
             ) -> Plan[TurnResult]: ...

    def observe(self, messages: Sequence[dict[str, Any]], at: Any, session: str | None,
                request_id: str | None) -> Plan[TurnResult]: ...

    def recall(self, query: str, k: int, at: Any, stores: Iterable[str] | None) -> Plan[list[RecalledItem]]: ...

    def facts(self, entity: str | None) -> Plan[list[Fact]]: ...

    def fact_history(self, entity: str, attribute: str) -> Plan[list[FactVersion]]: ...

    def procedures(self, task_class: str | None) -> Plan[list[Procedure]]: ...

    def episodes(self, since: Any, until: Any, session: str | None, sessions_ago: int | None
                 ) -> Plan[list[Episode]]: ...

    def digests(self) -> Plan[list[Digest]]: ...

    def trace(self, turn_id: str) -> Plan[TurnTrace]: ...

    def traces(self, last: int) -> Plan[list[TurnTrace]]: ...

    def forget(self, stores: Iterable[str] | None) -> Plan[dict[str, int]]: ...

    def forget_where(self, ids: Iterable[str] | None, query: str | None, request_id: str | None
                     ) -> Plan[TurnResult]: ...

    def stats(self) -> Plan[dict[str, Any]]: ...

    def export(self) -> Plan[bytes]: ...

    def import_(self, blob: bytes) -> Plan[None]: ...


class SoulApi:
    """A soul. Every method blocks until its answer is there.

    ``turn`` and ``observe`` are strictly ordered per soul; reads see every acknowledged turn's writes.
    """

    id: str
    _p: Plans

    def _run(self, plan: Plan[T]) -> T:
        raise NotImplementedError

    def turn(self, text: str, user: str | None = None, at: Any = None, *, request_id: str | None = None,
             wait_writes: bool = True) -> TurnResult:
        """One turn. ``wait_writes=False``: the reply comes back after one model call, before the memory
        work (``result.writes_pending``); ``trace(result.turn_id)`` shows the writes when done, and the
        soul's next turn reads them. ``request_id``: a turn sent again with the same id is answered with the
        first one's result, never applied twice."""
        return self._run(self._p.turn(text, user, at, request_id, wait_writes))

    def observe(self, messages: Sequence[dict[str, Any]], at: Any = None, session: str | None = None, *,
                request_id: str | None = None) -> TurnResult:
        """Ingest a conversation the soul was not part of (messages of ``{speaker, text, id, at?}``)."""
        return self._run(self._p.observe(messages, at, session, request_id))

    def recall(self, query: str, k: int = 10, at: Any = None, stores: Iterable[str] | None = None
               ) -> list[RecalledItem]:
        """What memory returns for a query (``stores``: episodic, semantic, procedural; all by default)."""
        return self._run(self._p.recall(query, k, at, stores))

    def facts(self, entity: str | None = None) -> list[Fact]:
        return self._run(self._p.facts(entity))

    def fact_history(self, entity: str, attribute: str) -> list[FactVersion]:
        return self._run(self._p.fact_history(entity, attribute))

    def procedures(self, task_class: str | None = None) -> list[Procedure]:
        return self._run(self._p.procedures(task_class))

    def episodes(self, since: Any = None, until: Any = None, session: str | None = None,
                 sessions_ago: int | None = None) -> list[Episode]:
        return self._run(self._p.episodes(since, until, session, sessions_ago))

    def digests(self) -> list[Digest]:
        """The consolidated memory, brought up to date with the episodes first: each digest of a session or a span
        of sessions with its provenance (the episodes it was written from and the sources of what it quotes)."""
        return self._run(self._p.digests())

    def trace(self, turn_id: str) -> TurnTrace:
        """One turn's trace by its id."""
        return self._run(self._p.trace(turn_id))

    def traces(self, last: int = 10) -> list[TurnTrace]:
        """The last ``last`` traces, oldest first."""
        return self._run(self._p.traces(last))

    def forget(self, stores: Iterable[str] | None = None) -> dict[str, int]:
        """Erase the soul's memory for good (these layers, all by default), with its traces and buffer: the
        files are unlinked, so nothing of it stays on disk. The soul is new afterwards (import works)."""
        return self._run(self._p.forget(stores))

    def forget_where(self, ids: Iterable[str] | None = None, query: str | None = None, *,
                     request_id: str | None = None) -> TurnResult:
        """Delete single memories: these ids (``ep-3``, ``tendril:database``, ``deploy@v2``) and every memory
        whose text contains the phrase ``query``; traces and buffer turns that held them are redacted and
        nothing of them stays on disk. Recorded as a turn of kind ``forget``; its writes are the DELETEs."""
        return self._run(self._p.forget_where(ids, query, request_id))

    def stats(self) -> dict[str, Any]:
        return self._run(self._p.stats())

    def export(self) -> bytes:
        """The soul's whole memory as bytes (msgpack); :meth:`import_` loads them into a new soul."""
        return self._run(self._p.export())

    def import_(self, blob: bytes) -> None:
        """Load an export into a soul that has no memories yet."""
        self._run(self._p.import_(blob))


class AsyncSoulApi:
    """The same API as :class:`SoulApi`, as coroutines (for asyncio servers)."""

    id: str
    _p: Plans

    async def _run(self, plan: Plan[T]) -> T:
        raise NotImplementedError

    async def turn(self, text: str, user: str | None = None, at: Any = None, *, request_id: str | None = None,
                   wait_writes: bool = True) -> TurnResult:
        """See :meth:`SoulApi.turn`."""
        return await self._run(self._p.turn(text, user, at, request_id, wait_writes))

    async def observe(self, messages: Sequence[dict[str, Any]], at: Any = None, session: str | None = None, *,
                      request_id: str | None = None) -> TurnResult:
        """See :meth:`SoulApi.observe`."""
        return await self._run(self._p.observe(messages, at, session, request_id))

    async def recall(self, query: str, k: int = 10, at: Any = None, stores: Iterable[str] | None = None
                     ) -> list[RecalledItem]:
        """See :meth:`SoulApi.recall`."""
        return await self._run(self._p.recall(query, k, at, stores))

    async def facts(self, entity: str | None = None) -> list[Fact]:
        return await self._run(self._p.facts(entity))

    async def fact_history(self, entity: str, attribute: str) -> list[FactVersion]:
        return await self._run(self._p.fact_history(entity, attribute))

    async def procedures(self, task_class: str | None = None) -> list[Procedure]:
        return await self._run(self._p.procedures(task_class))

    async def episodes(self, since: Any = None, until: Any = None, session: str | None = None,
                       sessions_ago: int | None = None) -> list[Episode]:
        return await self._run(self._p.episodes(since, until, session, sessions_ago))

    async def digests(self) -> list[Digest]:
        """See :meth:`SoulApi.digests`."""
        return await self._run(self._p.digests())

    async def trace(self, turn_id: str) -> TurnTrace:
        """See :meth:`SoulApi.trace`."""
        return await self._run(self._p.trace(turn_id))

    async def traces(self, last: int = 10) -> list[TurnTrace]:
        """See :meth:`SoulApi.traces`."""
        return await self._run(self._p.traces(last))

    async def forget(self, stores: Iterable[str] | None = None) -> dict[str, int]:
        """See :meth:`SoulApi.forget`."""
        return await self._run(self._p.forget(stores))

    async def forget_where(self, ids: Iterable[str] | None = None, query: str | None = None, *,
                           request_id: str | None = None) -> TurnResult:
        """See :meth:`SoulApi.forget_where`."""
        return await self._run(self._p.forget_where(ids, query, request_id))

    async def stats(self) -> dict[str, Any]:
        return await self._run(self._p.stats())

    async def export(self) -> bytes:
        """See :meth:`SoulApi.export`."""
        return await self._run(self._p.export())

    async def import_(self, blob: bytes) -> None:
        """See :meth:`SoulApi.import_`."""
        await self._run(self._p.import_(blob))


class RuntimeApi(Protocol):
    """A connected runtime as :func:`soul_runtime.connect` hands it back, whatever its transport: the Ray runtime
    (``actors.runtime.Runtime``, which adds the cluster's own operations) or the HTTP client
    (:class:`soul_runtime.http_client.HttpRuntime`)."""

    def soul(self, soul_id: str) -> SoulApi: ...

    def async_soul(self, soul_id: str) -> AsyncSoulApi: ...

    def souls(self) -> list[str]: ...

    def close(self) -> None: ...

    def __enter__(self: R) -> R: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


class RayRuntimeApi(RuntimeApi, Protocol):
    """The Ray runtime as :func:`soul_runtime.connect` hands it back for a Ray address (``actors.runtime.Runtime``):
    a runtime with the cluster's own operations (docs/python-api.md)."""

    def dedicate(self, soul_id: str) -> str: ...

    def undedicate(self, soul_id: str) -> bool: ...

    def placement(self, soul_id: str) -> dict[str, Any]: ...

    def stats(self) -> dict[str, Any]: ...

    def shutdown_actors(self) -> None: ...

    def close(self, *, flush: bool = True) -> None: ...

