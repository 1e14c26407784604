"""The one exception hierarchy of soul-runtime.

::

    SoulError                      every error this project raises on purpose
    ├── InvalidInput               bad text, vector, id, file or message (ValueError too)
    │   ├── ConfigError            an invalid configuration value
    │   └── IdempotencyConflict    an Idempotency-Key sent again with another body (HTTP service)
    ├── NotFound                   an unknown soul, turn, fact or procedure (KeyError too)
    ├── StorageError               the record of truth could not be read or written
    ├── ModelError                 the language model failed (after retries)
    │   └── ModelTimeout           ... by taking too long
    ├── EmbedderError              the embedder is missing or does not match an index
    ├── TurnFailed                 a turn was not applied; nothing of it is stored
    │   └── OutOfOrder             a turn arrived with a sequence number that is not next
    ├── StaleOwner                 a newer activation took the soul over (fencing); retry with the same request id
    │   └── Moved                  ... another actor serves the soul now (the router follows it)
    └── RuntimeUnavailable         the Ray runtime cannot be reached or refused us
        ├── RuntimeBusy            ... the soul's host stayed full for busy_wait_s; try again later
        │   └── QuotaExceeded      ... the tenant is over one of its limits (HTTP 429 with Retry-After)
        └── AuthError              ... because a credential was refused: the cluster's auth token
            └── Unauthorized       ... a missing, unknown or revoked API key (HTTP service, 401)

Every class of the tree is defined here (``actors.routing`` and ``soul_apps.service.souls_api`` import the ones
they raise). A test compares this drawing with the subclasses of ``SoulError`` found in ``soul_runtime`` and
``actors``, and with the TypeScript client's (``clients/typescript/src/errors.ts``); private helpers (a leading
underscore) that never leave their module are not drawn.

Nothing already stored is changed when one of these is raised by a write.
"""

from __future__ import annotations


class SoulError(Exception):
    """Base class of every error raised on purpose by soul-runtime."""


class InvalidInput(SoulError, ValueError):
    """Input that can never be accepted: fix the call, do not retry it."""


class IdempotencyConflict(InvalidInput):
    """An idempotency key sent again with another body."""


class ConfigError(InvalidInput):
    """An invalid configuration value."""


class NotFound(SoulError, KeyError):
    """An unknown soul, turn, fact or procedure."""

    def __str__(self) -> str:  # KeyError quotes its message; we do not
        return str(self.args[0]) if self.args else "not found"


class StorageError(SoulError):
    """The durable record could not be read or written."""


class ModelError(SoulError):
    """The language model failed after its retries."""


class ModelTimeout(ModelError):
    """The language model did not answer in time."""


class EmbedderError(SoulError):
    """The embedder is unavailable or does not match the stored index."""


class TurnFailed(SoulError):
    """A turn was not applied; none of its writes are stored."""


class OutOfOrder(TurnFailed):
    """A turn's sequence number is not the soul's next one."""

    def __init__(self, message: str, expected: int) -> None:
        super().__init__(message)
        self.expected = expected

    def __reduce__(self) -> tuple[type, tuple[str, int]]:
        return (self.__class__, (str(self), self.expected))


class StaleOwner(SoulError):
    """This activation of the soul was superseded by a newer one (its fencing epoch is lower) and wrote
    nothing more. The turn it was running is not acknowledged: the new owner may already have completed it
    from its write intent, so retry with the same request id (the result is returned, never applied twice)."""


class Moved(StaleOwner):
    """This actor no longer holds the soul: ``to`` does (a dedicated actor, or back on its host)."""

    def __init__(self, soul_id: str, to: str) -> None:
        super().__init__(f"soul {soul_id} is served by {to}")
        self.soul_id, self.to = soul_id, to

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (Moved, (self.soul_id, self.to))


class RuntimeUnavailable(SoulError):
    """The Ray runtime could not be reached."""


class RuntimeBusy(RuntimeUnavailable):
    """The soul's host has as many turns in progress as it admits (``host_admission``), and did not make room
    within ``busy_wait_s``: nothing of this call was applied; try again later (the same request id is safe)."""


class QuotaExceeded(RuntimeBusy):
    """The tenant is over one of its limits (turns per second, in flight, souls, stored bytes, tokens per day):
    the turn was refused before it began; try again after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[type, tuple[str, float]]:
        return (self.__class__, (str(self), self.retry_after))


class AuthError(RuntimeUnavailable):
    """The cluster refused the connection for lack of its auth token."""


class Unauthorized(AuthError):
    """A missing, unknown or revoked API key (the HTTP service's 401); an :class:`AuthError`, as a refused
    credential is."""
