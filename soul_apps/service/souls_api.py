"""One tenant's souls, as the HTTP routes and the MCP tools use them: the runtime's async handles behind the
tenant's :class:`~soul_apps.service.tenants.Scope`, answers as JSON-ready data with the tenant prefix taken off,
and errors from the project's tree mapped to HTTP statuses with messages that name only the tenant's ids."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgpack

from actors.quotas import Quotas
from soul_apps.service.idempotency import Ledger
from soul_apps.service.tenants import Scope, Whole
from soul_runtime.errors import IdempotencyConflict as IdempotencyConflict  # the service raises and reports it
from soul_runtime.errors import InvalidInput, NotFound, SoulError
from soul_runtime.errors import Unauthorized as Unauthorized  # the service raises and reports it
from soul_runtime.records import to_plain

log = logging.getLogger("soul_runtime.service")

STATUS: tuple[tuple[str, int], ...] = (
    ("Unauthorized", 401),
    ("IdempotencyConflict", 422),
    ("InvalidInput", 400),
    ("NotFound", 404),
    ("QuotaExceeded", 429),
    ("RuntimeBusy", 429),
    ("ModelError", 502),
    ("RuntimeUnavailable", 503),
    ("StaleOwner", 503),
)
"""Error class (or a base of it) -> HTTP status; the first match in the class's MRO order wins."""
SHOWN = frozenset({"Unauthorized", "IdempotencyConflict", "InvalidInput", "ConfigError", "NotFound", "QuotaExceeded"})
"""Errors whose message is the caller's own business (about its input); others get a fixed message."""


def status_of(e: BaseException) -> int:
    names = [c.__name__ for c in type(e).__mro__]
    for n in names:
        for cls, code in STATUS:
            if n == cls:
                return code
    return 500


def error_body(e: BaseException, scope: Scope | None, data_dir: str) -> dict[str, Any]:
    """``{"error": {"type", "message"}}``: the message of an input error with the tenant's prefix and the data
    dir taken off; a fixed message otherwise (the cause is logged here, not sent)."""
    kind = type(e).__name__ if isinstance(e, SoulError) else "InternalError"
    if kind in SHOWN or isinstance(e, (InvalidInput, NotFound)):
        msg = str(e).strip().splitlines()[0] if str(e).strip() else kind
        if data_dir:
            msg = msg.replace(data_dir.rstrip("/") + "/souls/", "").replace(data_dir, "<data dir>")
        if scope is not None:
            msg = scope.text(msg)
    else:
        log.warning("request failed: %s: %s", type(e).__name__, e)
        msg = {"ModelError": "the language model failed", "ModelTimeout": "the language model did not answer in time",
               "RuntimeUnavailable": "the runtime is unavailable; retry", "AuthError": "the runtime is unavailable",
               "StaleOwner": "the soul moved; retry with the same Idempotency-Key",
               "RuntimeBusy": "the runtime is busy; retry later"}.get(kind, "internal error")
    return {"error": {"type": kind, "message": msg}}


def _turn_out(res: Any) -> dict[str, Any]:
    return {"reply": res.reply, "turn_id": res.turn_id, "seq": res.seq,
            "recalled": [r.to_dict() for r in res.recalled], "writes": [w.to_dict() for w in res.writes],
            "writes_pending": res.writes_pending, "model": res.model, "offline": res.offline}


class TenantSouls:
    """The souls of one tenant on a runtime. Every method takes the tenant's soul id."""

    def __init__(self, rt: Any, tenant: str | None, ledger: Ledger | None = None,
                 souls: Callable[[], list[str]] | None = None, quotas: Quotas | None = None) -> None:
        self.rt = rt
        self.scope = Scope(tenant) if tenant else Whole()
        self.ledger = ledger
        self._souls = souls or rt.souls
        self.quotas = quotas

    def _h(self, soul_id: str) -> Any:
        return self.rt.async_soul(self.scope.soul(soul_id))

    def out(self, obj: Any) -> Any:
        return self.scope.tree(to_plain(obj) if not isinstance(obj, dict) else obj)

    async def _idempotent(self, soul_id: str, key: str | None, body: str, run: Callable[[str | None], Any]) -> Any:
        """Run a write with the Idempotency-Key as its request id; the same key with another body: 422."""
        if key is None:
            return await self._admitted(soul_id, run, None)
        if not isinstance(key, str) or not key or len(key) > 200 or not key.isprintable():
            raise InvalidInput("Idempotency-Key must be 1-200 printable characters")
        internal = self.scope.soul(soul_id)
        if self.ledger is not None:  # SQLite commits: off the event loop
            first = await asyncio.to_thread(self.ledger.body_for, internal, key)
            if first is not None and first != body:
                raise IdempotencyConflict("this Idempotency-Key was used with another request body")
        result = await self._admitted(soul_id, run, key)
        if self.ledger is not None and await asyncio.to_thread(self.ledger.record, internal, key, body) != body:
            raise IdempotencyConflict("this Idempotency-Key was used with another request body")
        return result

    async def _admitted(self, soul_id: str, run: Callable[[str | None], Any], key: str | None) -> Any:
        """``run(key)`` within the tenant's limits (:mod:`.quotas`): over one, QuotaExceeded before it begins."""
        if self.quotas is None or not self.scope.tenant:
            return await run(key)
        async with self.quotas.turn(self.scope.tenant, self.scope.soul(soul_id)):
            return await run(key)

    # ---- writes -------------------------------------------------------------------------
    async def turn(self, soul_id: str, text: str, user: str | None = None, at: Any = None, wait_writes: bool = True,
                   key: str | None = None, body: str = "") -> dict[str, Any]:
        h = self._h(soul_id)

        async def run(rid: str | None) -> Any:
            return await h.turn(text, user=user, at=at, request_id=rid, wait_writes=wait_writes)
        return self.scope.tree(_turn_out(await self._idempotent(soul_id, key, body, run)))

    async def observe(self, soul_id: str, messages: list[dict[str, Any]], at: Any = None, session: str | None = None,
                      key: str | None = None, body: str = "") -> dict[str, Any]:
        h = self._h(soul_id)

        async def run(rid: str | None) -> Any:
            return await h.observe(messages, at=at, session=session, request_id=rid)
        return self.scope.tree(_turn_out(await self._idempotent(soul_id, key, body, run)))

    async def forget_where(self, soul_id: str, ids: list[str] | None, query: str | None, key: str | None = None,
                           body: str = "") -> dict[str, Any]:
        h = self._h(soul_id)

        async def run(rid: str | None) -> Any:
            return await h.forget_where(ids=ids, query=query, request_id=rid)
        res = await self._idempotent(soul_id, key, body, run)
        return self.scope.tree({**_turn_out(res), "deleted": [w.key for w in res.writes]})

    async def forget_all(self, soul_id: str, stores: list[str] | None = None) -> dict[str, int]:
        internal = self.scope.soul(soul_id)
        erased = await self._h(soul_id).forget(stores)
        if self.ledger is not None and stores is None:
            await asyncio.to_thread(self.ledger.forget_soul, internal)
        return {str(k): int(v) for k, v in erased.items()}

    async def import_(self, soul_id: str, blob: bytes) -> dict[str, Any]:
        await self._h(soul_id).import_(blob)
        return {"soul_id": soul_id, "bytes": len(blob)}

    # ---- reads --------------------------------------------------------------------------
    async def recall(self, soul_id: str, query: str, k: int = 10, at: Any = None,
                     stores: list[str] | None = None) -> list[Any]:
        items = await self._h(soul_id).recall(query, k=k, at=at, stores=stores or None)
        return list(self.scope.tree([i.to_dict() for i in items]))

    async def facts(self, soul_id: str, entity: str | None = None) -> list[Any]:
        return list(self.out(list(await self._h(soul_id).facts(entity))))

    async def fact_history(self, soul_id: str, entity: str, attribute: str) -> list[Any]:
        return list(self.out(list(await self._h(soul_id).fact_history(entity, attribute))))

    async def episodes(self, soul_id: str, since: Any = None, until: Any = None, session: str | None = None,
                       sessions_ago: int | None = None) -> list[Any]:
        got = await self._h(soul_id).episodes(since=since, until=until, session=session, sessions_ago=sessions_ago)
        return list(self.out(list(got)))

    async def digests(self, soul_id: str) -> list[Any]:
        return list(self.out(list(await self._h(soul_id).digests())))

    async def procedures(self, soul_id: str, task_class: str | None = None) -> list[Any]:
        return list(self.out(list(await self._h(soul_id).procedures(task_class))))

    async def traces(self, soul_id: str, last: int = 10) -> list[Any]:
        got = await self._h(soul_id).traces(last)
        return list(self.scope.tree([t.to_dict() for t in got]))

    async def trace(self, soul_id: str, seq: int) -> dict[str, Any]:
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            raise InvalidInput(f"seq must be an int >= 1, got {seq!r}")
        t = await self._h(soul_id).trace(f"{self.scope.soul(soul_id)}/{seq}")
        return dict(self.scope.tree(t.to_dict()))

    async def stats(self, soul_id: str) -> dict[str, Any]:
        return dict(self.out(await self._h(soul_id).stats()))

    async def export(self, soul_id: str) -> bytes:
        """The soul's export, with the tenant prefix taken off the ids in it (nested msgpack included)."""
        blob = bytes(await self._h(soul_id).export())
        if not self.scope.prefix:
            return blob
        return await asyncio.to_thread(self._unscoped, blob)  # a large export: off the event loop

    def _unscoped(self, blob: bytes) -> bytes:
        return bytes(msgpack.packb(self._unscope_packed(msgpack.unpackb(blob, raw=False, strict_map_key=False)),
                                   use_bin_type=True))

    def _unscope_packed(self, obj: Any) -> Any:
        if isinstance(obj, bytes) and self.scope.prefix.encode() in obj:
            try:
                inner = msgpack.unpackb(obj, raw=False, strict_map_key=False)
            except Exception:
                return obj
            if msgpack.packb(inner, use_bin_type=True) != obj:  # not a msgpack value of its own (a vector ...)
                return obj
            return bytes(msgpack.packb(self._unscope_packed(inner), use_bin_type=True))
        if isinstance(obj, str):
            return self.scope.text(obj)
        if isinstance(obj, dict):
            return {self._unscope_packed(k): self._unscope_packed(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self._unscope_packed(v) for v in obj]
        return obj

    def souls(self) -> list[str]:
        return self.scope.souls(self._souls())
