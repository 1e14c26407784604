"""The service's JSON as the records the Python API returns, and its error bodies as the project's exceptions."""

from __future__ import annotations

from typing import Any

from soul_runtime import errors, records
from soul_runtime.records import Episode, Fact, FactVersion, MemoryWrite, Procedure, RecalledItem, TurnResult, TurnTrace


def turn_result(d: dict[str, Any]) -> TurnResult:
    return TurnResult(reply=d["reply"], recalled=tuple(RecalledItem.from_dict(r) for r in d["recalled"]),
                      writes=tuple(MemoryWrite.from_dict(w) for w in d["writes"]), turn_id=d["turn_id"],
                      seq=int(d["seq"]), model=d["model"], offline=bool(d["offline"]),
                      writes_pending=bool(d["writes_pending"]))


def trace(d: dict[str, Any]) -> TurnTrace:
    return TurnTrace.from_dict(d)


def recalled(items: list[dict[str, Any]]) -> list[RecalledItem]:
    return [RecalledItem.from_dict(d) for d in items]


def fact_version(d: dict[str, Any]) -> FactVersion:
    return FactVersion(**{**d, "sources": tuple(d["sources"])})


def fact(d: dict[str, Any]) -> Fact:
    return Fact(**{**d, "sources": tuple(d["sources"]), "history": tuple(fact_version(h) for h in d["history"])})


def episode(d: dict[str, Any]) -> Episode:
    return Episode(**{**d, "sources": tuple(d["sources"]), "entities": tuple(d["entities"]), "tags": tuple(d["tags"])})


def digest(d: dict[str, Any]) -> records.Digest:
    return records.Digest(**{**d, "sessions": tuple(d["sessions"]), "episodes": tuple(d["episodes"]),
                     "sources": tuple(d["sources"])})


def procedure(d: dict[str, Any]) -> Procedure:
    return Procedure(**{**d, "steps": tuple(d["steps"]), "sources": tuple(d["sources"])})


ALIASES: dict[str, type[errors.SoulError]] = {
    "InternalError": errors.TurnFailed,  # as a call that failed in an actor arrives over Ray
}
BY_STATUS: dict[int, type[errors.SoulError]] = {
    400: errors.InvalidInput, 401: errors.Unauthorized, 403: errors.AuthError, 404: errors.NotFound,
    422: errors.InvalidInput, 429: errors.RuntimeBusy, 500: errors.TurnFailed, 502: errors.ModelError,
    503: errors.RuntimeUnavailable, 504: errors.TurnFailed,
}


def _tree() -> dict[str, type[errors.SoulError]]:
    """Every class of the project's exception tree, by name."""
    out: dict[str, type[errors.SoulError]] = {}
    todo: list[type[errors.SoulError]] = [errors.SoulError]
    while todo:
        cls = todo.pop()
        if cls.__module__ == errors.__name__:
            out[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return out


def error(status: int, body: Any) -> errors.SoulError:
    """The exception of an error answer: the class the service names (``{"error": {"type", "message"}}``) when
    the tree has it, else the one its status means."""
    err = body.get("error") if isinstance(body, dict) else None
    kind = str(err.get("type", "")) if isinstance(err, dict) else ""
    message = str(err.get("message", "")) if isinstance(err, dict) else ""
    cls = _tree().get(kind) or ALIASES.get(kind) or BY_STATUS.get(status, errors.SoulError)
    text = message or f"the service answered {status}"
    if cls is errors.OutOfOrder:
        return errors.OutOfOrder(text, 0)
    return cls(text)
