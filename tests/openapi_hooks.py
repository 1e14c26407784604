"""Schemathesis hooks for the run against ``soul serve`` (tests/test_openapi.py loads them by path).

``positive_data_accepted``: schemathesis' own ``positive_data_acceptance`` (a request the document calls valid
is not refused), except for the refusals the document states that no JSON Schema can, because they depend on
what came before or on a whole body: an ``Idempotency-Key`` sent again with another body
(``IdempotencyConflict``), an import whose bytes are not an export or whose soul has memories already, and
message ids that repeat within one observe call. Each is recognised by its error type and route, nothing
wider; tests/test_service.py and tests/test_bad_input.py check those refusals themselves.

One case is not checked: a body that is not a JSON object. Every request body this document declares is an
object, so such a body is not schema-valid, yet schemathesis 4.32's coverage phase labels ``0`` as a positive
body of an operation whose text may be 2,000,000 characters long (it fails to build a string that long under the
text's pattern and falls back to ``0``). The server answers it 422, as it should.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from schemathesis.core.failures import Failure
from schemathesis.specs.openapi.checks import positive_data_acceptance


def _error(response: Any) -> dict[str, str]:
    try:
        body = response.json()
    except ValueError:
        return {}
    err = body.get("error") if isinstance(body, dict) else None
    return err if isinstance(err, dict) else {}


def stated_refusal(method: str, path: str, status: int, error: dict[str, str]) -> bool:
    """A refusal the document states in words for data its schema cannot tell apart from valid data."""
    kind, message = error.get("type"), error.get("message", "")
    if status == 422 and kind == "IdempotencyConflict" and method == "POST":
        return True
    if status == 400 and kind == "InvalidInput" and method == "POST" and path.endswith("/import"):
        return True
    return (status == 400 and kind == "InvalidInput" and method == "POST" and path.endswith("/observe")
            and message == "messages: each message id must appear once")


@schemathesis.check
def positive_data_accepted(ctx: Any, response: Any, case: Any) -> bool | None:
    body = getattr(case, "body", None)
    if isinstance(body, (bool, int, float, str, list)):  # not an object: never valid here (see above)
        return None
    try:
        return positive_data_acceptance(ctx, response, case)
    except Failure:
        if stated_refusal(case.method.upper(), case.operation.path, response.status_code, _error(response)):
            return None
        raise
