"""Why a request cannot be served, as types: no HTTP codes here (``api.py`` maps each to one, in one table).

The daemon and its parts raise these; routes let them through. ``extra`` carries fields a client acts on
(for example ``next_epoch``), sent next to ``detail`` in the reply.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """A request the daemon cannot serve; ``message`` says why and what to do instead."""

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message, self.extra = message, extra


class Invalid(ServiceError):
    """The request's values are well-formed but cannot be used (a budget below what fits, ...)."""


class NotFound(ServiceError):
    """What the request names does not exist (an epoch not sealed, a lease, a job)."""


class Conflict(ServiceError):
    """The request contradicts the current state (a replaced run, an epoch mapped otherwise)."""


class Gone(ServiceError):
    """It existed and can no longer be served (an expired lease, an epoch whose shards were evicted)."""


class TooMany(ServiceError):
    """A limit that protects the daemon was reached (leases); asking after ``retry_after`` seconds may succeed."""

    def __init__(self, message: str, retry_after: float = 2.0, **extra: Any) -> None:
        super().__init__(message, **extra)
        self.retry_after = retry_after


class NotReady(ServiceError):
    """Not possible yet; asking again after ``retry_after`` seconds may succeed."""

    def __init__(self, message: str, retry_after: float = 2.0, **extra: Any) -> None:
        super().__init__(message, **extra)
        self.retry_after = retry_after
