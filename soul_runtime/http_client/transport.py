"""Requests to the service over httpx: one pooled client per runtime (blocking, and one per event loop for the
coroutines), timeouts, and retries that are safe to make.

A write is sent with an ``Idempotency-Key`` (the call's request id), so sending it again after an answer was lost
is answered with the first result and never applied twice; a call without one (an import) is sent again only
when it never left (a read, whatever happened). While the service is not there — the connection refused or lost,
``503`` (:class:`~soul_runtime.errors.RuntimeUnavailable`: starting, stopping, restarting), or an answer of the
ingress itself rather than the service (a ``404``, ``500``, ``502`` or ``504`` that is not the service's JSON:
Serve's proxy while no app is deployed, HAProxy's plain ``500`` for a replica that died or none up) — a call is sent again for up to :attr:`Retries.within_s` seconds. ``429``
(:class:`~soul_runtime.errors.RuntimeBusy`) is sent again at most :attr:`Retries.attempts` times in all. Each wait is
the answer's ``Retry-After``, else a backoff; the error is raised when the retries are spent.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from soul_runtime import errors, steps
from soul_runtime.steps import Steps

from . import wire

BUSY = 429
INGRESS_STATUS = frozenset({404, 500, 502, 503, 504})
"""Statuses that, without the service's JSON error body, come from the ingress: the service is not there (yet)."""
NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout)
"""Transport failures before the request reached the server."""


@dataclass(frozen=True)
class Call:
    """One request: method, path under the service's URL, and what it carries."""

    method: str
    path: str
    params: list[tuple[str, str]] = field(default_factory=list)
    json: Any = None
    content: bytes | None = None
    key: str | None = None
    """The ``Idempotency-Key``: with one, the call may be sent again whatever happened to the first."""
    binary: bool = False
    """The answer is bytes (``application/octet-stream``), not JSON."""

    def request(self, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        headers = {"Idempotency-Key": self.key} if self.key is not None else None
        if self.content is not None:
            headers = {**(headers or {}), "Content-Type": "application/octet-stream"}
        return client.build_request(self.method, self.path, params=tuple(self.params), json=self.json,
                                    content=self.content, headers=headers)


@dataclass(frozen=True)
class Retries:
    """How often and after how long a call is sent again."""

    attempts: int = 4
    """Sends of one call in all when the service is busy (``429``; 1: never again)."""
    within_s: float = 60.0
    """How long a call is sent again while the service is not there (starting, stopping, restarting): the time
    since its first send, or the waits between sends if those add up to more (0: never again)."""
    backoff_s: float = 0.25
    """The first wait when the answer names none; doubled each time, up to ``max_backoff_s``."""
    max_backoff_s: float = 2.0
    max_wait_s: float = 30.0
    """The longest wait, whatever ``Retry-After`` says."""

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool) or not 1 <= self.attempts <= 100:
            raise errors.ConfigError(f"attempts must be an int in 1..100, got {self.attempts!r}")
        if not isinstance(self.within_s, (int, float)) or isinstance(self.within_s, bool) \
                or not 0 <= self.within_s <= 86_400:
            raise errors.ConfigError(f"retry_for_s must be seconds in 0..86400, got {self.within_s!r}")

    def _wait(self, attempt: int, named: float | None = None) -> float:
        return min(self.max_wait_s, named if named is not None else min(self.max_backoff_s,
                                                                        self.backoff_s * 2 ** attempt))

    def _in_time(self, spent: float, wait: float) -> float | None:
        return wait if spent + wait <= self.within_s else None

    def after_failure(self, call: Call, attempt: int, e: httpx.TransportError, spent: float = 0.0) -> float | None:
        """The wait before sending again after the request failed in transit, or None to give up. ``spent``:
        seconds since the first send (or of waits, if more)."""
        if isinstance(e, httpx.TimeoutException) and not isinstance(e, NEVER_SENT):
            return None  # no answer in the time given: the caller's timeout is the bound
        if call.key is None and call.method != "GET" and not isinstance(e, NEVER_SENT):
            return None  # it may have been applied, and nothing tells a second one from the first
        return self._in_time(spent, self._wait(attempt))

    def after_answer(self, call: Call, attempt: int, response: httpx.Response, spent: float = 0.0) -> float | None:
        """The wait before sending again after this answer, or None to take it."""
        named = retry_after(response.headers.get("Retry-After"))
        if response.status_code == BUSY:
            return None if attempt + 1 >= self.attempts else self._wait(attempt, named)
        if response.status_code == 503:
            return self._in_time(spent, self._wait(attempt, named))
        if from_ingress(response) and (response.status_code == 404 or call.key is not None or call.method == "GET"):
            return self._in_time(spent, self._wait(attempt, named))  # a 404 of the ingress never reached the app
        return None


def from_ingress(response: httpx.Response) -> bool:
    """An answer of the ingress in front of the service (Serve's proxy, HAProxy), not of the service: one of
    :data:`INGRESS_STATUS` without a JSON body (every answer of the service's own is JSON)."""
    ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
    return response.status_code in INGRESS_STATUS and ctype != "application/json"


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta seconds or an HTTP date), None if absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def failed(e: httpx.TransportError) -> errors.SoulError:
    """A request that got no answer, as the project's error (as a call to an actor that does not answer)."""
    if isinstance(e, httpx.TimeoutException) and not isinstance(e, NEVER_SENT):
        return errors.TurnFailed(f"no answer in time ({type(e).__name__})")
    return errors.RuntimeUnavailable(f"the service cannot be reached: {type(e).__name__}: {e}")


def answer(call: Call, response: httpx.Response) -> Any:
    """The answer's body (JSON, or bytes for a binary call), or the error it holds, raised."""
    if response.is_success:
        return response.content if call.binary else response.json()
    if from_ingress(response):
        raise errors.RuntimeUnavailable(f"the service is not there: its ingress answered {response.status_code} "
                                        f"({response.text[:120]!r})")
    try:
        body = response.json()
    except ValueError:
        body = None
    err = wire.error(response.status_code, body)
    if isinstance(err, errors.RuntimeBusy):
        err.retry_after = retry_after(response.headers.get("Retry-After"))  # type: ignore[attr-defined]
    raise err


def send_steps(call: Call, retries: Retries) -> Steps[Any]:
    """One call as steps, sent again as :class:`Retries` allows: ``Call("http", "send", (call,))`` answers the
    response (or raises the transport error), ``Call("http", "close", (response,))`` lets go of one that is
    not taken, :class:`Pause` waits. Every send carries the same ``Idempotency-Key`` (``call.key``)."""
    attempt, waited, started = 0, 0.0, time.monotonic()
    while True:
        try:
            response = yield steps.Call("http", "send", (call,))
        except httpx.TransportError as e:
            wait = retries.after_failure(call, attempt, e, max(waited, time.monotonic() - started))
            if wait is None:
                raise failed(e) from None
        else:
            wait = retries.after_answer(call, attempt, response, max(waited, time.monotonic() - started))
            if wait is None:
                return answer(call, response)
            yield steps.Call("http", "close", (response,))
        attempt += 1
        waited += wait
        yield steps.Pause(wait)


class Sender:
    """Sends calls with a blocking client (:func:`send_steps` on :func:`~soul_runtime.steps.run_steps`)."""

    def __init__(self, client: httpx.Client, retries: Retries) -> None:
        self.client = client
        self.retries = retries

    def send(self, call: Call) -> Any:
        return steps.run_steps(send_steps(call, self.retries), self._perform)

    def _perform(self, step: steps.Call | steps.Pause) -> Any:
        if isinstance(step, steps.Pause):
            return time.sleep(step.seconds)
        if step.method == "send":
            return self.client.send(step.args[0].request(self.client))
        return step.args[0].close()


class AsyncSender:
    """Sends calls with an async client (the same steps as :class:`Sender`, on
    :func:`~soul_runtime.steps.run_steps_async`)."""

    def __init__(self, client: httpx.AsyncClient, retries: Retries) -> None:
        self.client = client
        self.retries = retries

    async def send(self, call: Call) -> Any:
        return await steps.run_steps_async(send_steps(call, self.retries), self._perform)

    async def _perform(self, step: steps.Call | steps.Pause) -> Any:
        if isinstance(step, steps.Pause):
            return await asyncio.sleep(step.seconds)
        if step.method == "send":
            return await self.client.send(step.args[0].request(self.client))
        return await step.args[0].aclose()
