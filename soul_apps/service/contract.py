"""The HTTP API's contract: the request types, built from :mod:`soul_runtime.limits` (the document states those
limits and the request models enforce the same schemas), the error answers every operation declares, and how a
refused request is answered: ``400`` for a value outside its limits, ``422`` for a request of the wrong shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, StrictFloat, StrictInt, StrictStr, StringConstraints

from soul_runtime import limits


def _iso(text: str) -> str:
    limits.iso_seconds(text)  # a date that does not exist (Feb 30): InvalidInput, a ValueError
    return text


def _text(max_chars: int) -> Any:
    return Annotated[str, StringConstraints(min_length=1, max_length=max_chars, pattern=limits.TEXT_PATTERN)]


Text = _text(limits.TEXT_MAX)
QueryText = _text(limits.QUERY_MAX)
Name = _text(limits.NAME_MAX)
ForgetId = _text(limits.FORGET_ID_MAX)
Id = Annotated[str, StringConstraints(min_length=1, max_length=limits.ID_MAX, pattern=limits.ID_PATTERN)]
IsoTime = Annotated[StrictStr, StringConstraints(pattern=limits.ISO_PATTERN), AfterValidator(_iso),
                    Field(json_schema_extra={"format": "date-time"})]
_EPOCH = {"ge": limits.TIME_MIN, "le": limits.TIME_MAX}
Time = Annotated[Annotated[StrictFloat, Field(allow_inf_nan=False, **_EPOCH)] | Annotated[StrictInt, Field(**_EPOCH)]
                 | IsoTime, Field(description="epoch seconds, or an RFC 3339 date-time")]
"""A time in a JSON body: a number of epoch seconds, or a date-time text."""
QueryTime = Annotated[Annotated[float, Field(allow_inf_nan=False, **_EPOCH)] | IsoTime,
                      Field(description="epoch seconds, or an RFC 3339 date-time")]
"""A time in a query string (the same two forms)."""


def seconds(value: float | int | str | None) -> float | None:
    """A time of the request (checked already) as epoch seconds."""
    return limits.iso_seconds(value) if isinstance(value, str) else None if value is None else float(value)


class ErrorDetail(BaseModel):
    type: str = Field(description="the error's class: InvalidInput, Unauthorized, NotFound, RuntimeBusy, ...")
    message: str


class ErrorOut(BaseModel):
    error: ErrorDetail


ERROR_STATUSES: dict[int, str] = {
    400: "InvalidInput: a value outside the limits this document states, or one the runtime refuses (an export "
         "that is not one, an import into a soul that has memories, message ids that repeat); or a body that is "
         "not JSON",
    401: "Unauthorized: no API key, an unknown or a revoked one",
    404: "NotFound: an unknown turn or fact, or no such route",
    405: "MethodNotAllowed: the path does not take this method (`Allow` lists those it takes)",
    413: "InvalidInput: a request body over the service's limit (named in the message)",
    422: "a request of the wrong shape (a field of the wrong type, a missing or an unknown one), or "
         "IdempotencyConflict: the Idempotency-Key was used with another body",
    429: "RuntimeBusy: the soul's host admits no more turns now, or QuotaExceeded: the tenant is over one of its "
         "limits; retry after `Retry-After`",
    500: "an internal error (a fixed message; the cause is in the service's log)",
    502: "ModelError / ModelTimeout: the language model failed after its retries",
    503: "RuntimeUnavailable (the service is starting and not ready yet, or the runtime cannot be reached) or "
         "StaleOwner (the soul moved): retry after `Retry-After` with the same Idempotency-Key",
}
HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer", "required": True, "schema": {"type": "string"}}},
    405: {"Allow": {"description": "the methods the path takes", "required": True, "schema": {"type": "string"}}},
    429: {"Retry-After": {"description": "seconds to wait", "schema": {"type": "string"}}},
    503: {"Retry-After": {"description": "seconds to wait", "schema": {"type": "string"}}},
}
VALUE_ERRORS = frozenset({
    "string_pattern_mismatch", "string_too_short", "string_too_long", "too_short", "too_long", "greater_than",
    "greater_than_equal", "less_than", "less_than_equal", "enum", "literal_error", "value_error", "finite_number"})
"""Pydantic's errors for a value of the right type outside its limits: answered 400, like the runtime's own."""


def refusal(errors: Sequence[Any]) -> tuple[int, str]:
    """The status and message for a request the schema refuses: 400 when a value broke a limit, else 422."""
    values = [e for e in errors if e.get("type") in VALUE_ERRORS]
    first = (values or list(errors) or [{}])[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")
                     and (isinstance(p, int) or not any(c in str(p) for c in "[]-") and str(p) not in
                          ("float", "int", "str", "bool")))
    pattern = (first.get("ctx") or {}).get("pattern")
    msg = f"must be {limits.DESCRIBED[pattern]}" if pattern in limits.DESCRIBED else \
        str(first.get("msg", "invalid")).removeprefix("Value error, ")
    return (400 if values else 422), (f"{where}: {msg}" if where else msg)


def _error_response(code: int) -> dict[str, Any]:
    out: dict[str, Any] = {"description": ERROR_STATUSES[code],
                           "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}}
    if code in HEADERS:
        out["headers"] = HEADERS[code]
    return out


def document(spec: dict[str, Any], model_paths: Sequence[str] = ("/turns", "/observe")) -> dict[str, Any]:
    """The generated document with what the routes cannot say themselves: the bearer key, and every error answer
    of every operation with its body (``{"error": {"type", "message"}}``) and headers."""
    comps = spec.setdefault("components", {})
    schemas = comps.setdefault("schemas", {})
    for gone in ("HTTPValidationError", "ValidationError"):
        schemas.pop(gone, None)
    schemas["ErrorOut"] = ErrorOut.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas["ErrorDetail"] = schemas["ErrorOut"].pop("$defs")["ErrorDetail"]
    comps["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "the tenant's API key (`soul tenants add NAME`)"}}
    for path, ops in spec.get("paths", {}).items():
        for op in ops.values():
            codes = [405, 500]
            if path.startswith("/v1/"):
                op["security"] = [{"bearer": []}]
                codes += [400, 401, 404, 422, 429, 503]
                if path.endswith(tuple(model_paths)):
                    codes.append(502)
                if "requestBody" in op:
                    codes.append(413)
            else:
                codes.append(503)
            op["responses"] = {**{k: v for k, v in op.get("responses", {}).items() if not k.startswith(("4", "5"))},
                               **{str(c): _error_response(c) for c in sorted(codes)}}
    return spec

