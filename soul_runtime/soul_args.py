"""The arguments of a soul's API, checked and put in the form every transport sends: one place for the checks the
handles over Ray (:mod:`actors.runtime`) and over HTTP (:mod:`soul_runtime.http_client`) make before anything is
sent, so both refuse the same calls with the same :class:`~soul_runtime.errors.InvalidInput`."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from soul_runtime import limits
from soul_runtime.clock import to_timestamp
from soul_runtime.errors import InvalidInput
from soul_runtime.records import Store
from soul_runtime.text import check_text

MAX_K = limits.K_MAX
MAX_SESSIONS_AGO = limits.SESSIONS_AGO_MAX


def request_id(given: str | None) -> str:
    """The caller's request id, or a new one: a write always carries one, so sending it again is safe."""
    return given or uuid.uuid4().hex


def _time(at: Any) -> float | None:
    return None if at is None else to_timestamp(at)


def turn(text: str, user: str | None, at: Any, wait_writes: bool) -> dict[str, Any]:
    check_text(text, what="turn text", max_chars=limits.TEXT_MAX)
    if not isinstance(wait_writes, bool):
        raise InvalidInput(f"wait_writes must be True or False, got {wait_writes!r}")
    return {"text": text, "user": user, "at": _time(at), "wait_writes": wait_writes}


def observe(messages: Sequence[dict[str, Any]], at: Any, session: str | None) -> dict[str, Any]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidInput("messages must be a list of {speaker, text, id} dicts")
    return {"messages": list(messages), "at": _time(at), "session": session}


def stores(given: Iterable[str] | None) -> tuple[Store, ...] | None:
    """The layers named (None: all of them), or InvalidInput for an unknown one."""
    if given is None:
        return None
    from soul_runtime.memory.soul_memory import parse_stores
    return parse_stores(given)


def recall(query: str, k: int, at: Any, layers: Iterable[str] | None
           ) -> tuple[str, int, float | None, tuple[Store, ...] | None]:
    check_text(query, what="query")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise InvalidInput(f"k must be an int in 1..{MAX_K}, got {k!r}")
    return query, k, _time(at), stores(layers)


def now(at: float | None) -> float:
    return time.time() if at is None else at


def fact_history(entity: str, attribute: str) -> tuple[str, str]:
    check_text(entity, what="entity", max_chars=200)
    check_text(attribute, what="attribute", max_chars=200)
    return entity, attribute


def episodes(since: Any, until: Any, session: str | None, sessions_ago: int | None) -> dict[str, Any]:
    if sessions_ago is not None and (not isinstance(sessions_ago, int) or isinstance(sessions_ago, bool)
                                     or not 0 <= sessions_ago <= MAX_SESSIONS_AGO):
        raise InvalidInput(f"sessions_ago must be an int in 0..{MAX_SESSIONS_AGO}, got {sessions_ago!r}")
    return {"since": _time(since), "until": _time(until), "session": session, "sessions_ago": sessions_ago}


def traces(last: int) -> int:
    return limits.check_int(last, "last", 1, limits.LAST_MAX)


def forget_where(ids: Iterable[str] | None, query: str | None) -> tuple[list[str], str | None]:
    """The ids and the phrase of a targeted forget (bad arguments fail here, before anything is sent)."""
    from soul_runtime.memory.erasure import ForgetQuery
    q = ForgetQuery.make(ids, query)
    return list(q.ids), q.phrase or None


def import_blob(blob: bytes) -> bytes:
    if not isinstance(blob, (bytes, bytearray)):
        raise InvalidInput("import takes the bytes of an export")
    return bytes(blob)
