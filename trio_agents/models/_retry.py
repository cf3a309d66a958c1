"""Retries: which failures are worth another attempt, and how long to wait first.

A model stream retries connection failures, 408, 429 and 5xx answers, and a body that
breaks off before any model event was delivered (:mod:`._model_stream`). The wait is
exponential backoff with jitter (:func:`backoff_delay`), unless the server said how
long with ``Retry-After`` (:func:`parse_retry_after`); a wait longer than
:data:`MAX_RETRY_AFTER` is not waited for. :class:`RetryPolicy` holds a model's
settings and decides, for each failure, between waiting and raising.
"""

from __future__ import annotations

import email.utils
import random
import time
from typing import Final

import attrs

from .._exceptions import ModelError

__all__ = [
    "MAX_RETRY_AFTER",
    "RETRYABLE_STATUS",
    "Failure",
    "RetryPolicy",
    "backoff_delay",
    "parse_retry_after",
]

MAX_RETRY_AFTER: Final = 60.0
"""A ``Retry-After`` longer than this (seconds) is not waited for: the call fails."""

RETRYABLE_STATUS: Final = frozenset({408, 429})
"""Statuses below 500 that are retried (all 5xx are retried too)."""


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Return the delay a ``Retry-After`` header asks for, in seconds (``None`` if absent).

    Accepts the delta-seconds form (also fractional, as some servers send) and the
    HTTP-date form. A malformed value counts as absent; a date in the past is 0.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds else None  # NaN -> None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def backoff_delay(
    retry: int, *, base: float, maximum: float, retry_after: float | None = None
) -> float:
    """Seconds to wait before retry number ``retry`` (0 for the first retry).

    Exponential backoff with jitter: a random delay between half and all of
    ``min(maximum, base * 2**retry)``. A server's ``Retry-After`` wins when given.
    """
    if retry_after is not None:
        return retry_after
    ceiling = min(maximum, base * (2.0**retry))
    return ceiling / 2 + random.uniform(0.0, ceiling / 2)


@attrs.frozen
class Failure:
    """Why one attempt failed, and how long the server asked us to wait (if it did)."""

    error: ModelError
    retry_after: float | None = None


@attrs.frozen
class RetryPolicy:
    """A model's retry settings: how many retries, and the backoff's base and ceiling."""

    max_retries: int
    base_delay: float
    max_delay: float

    def delay(self, failure: Failure, attempts: int) -> float:
        """Seconds to wait before the next attempt, after ``attempts`` attempts so far.

        Raises:
            ModelError: the failure may not be retried (it is not retryable, the
                retries are used up, or the server asked for too long a wait).
        """
        error = failure.error
        if not error.retryable:
            raise error
        if attempts > self.max_retries:
            if attempts > 1:
                raise ModelError(
                    f"{error} (gave up after {attempts} attempts)",
                    status_code=error.status_code,
                    retryable=True,
                ) from error.__cause__
            raise error
        if failure.retry_after is not None and failure.retry_after > MAX_RETRY_AFTER:
            raise ModelError(
                f"{error} (the server asked to retry after {failure.retry_after:g} s;"
                f" not waiting longer than {MAX_RETRY_AFTER:g} s)",
                status_code=error.status_code,
                retryable=True,
            ) from error.__cause__
        return backoff_delay(
            attempts - 1,
            base=self.base_delay,
            maximum=self.max_delay,
            retry_after=failure.retry_after,
        )
