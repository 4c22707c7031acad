"""The client's retry policy for a busy server, built on tenacity.

Retried: HTTP 429 (the intake pool is full), and HTTP 503 when the server sent
`Retry-After` (`server_busy`: the web server could not take the request then; `database_busy`: the
database stayed busy through the server's own retries; both changed nothing, so a
create is safe to send again). The client waits the `Retry-After` the server sent
(delta seconds or an HTTP date), else 1, 2, 4, 8, 16 s; every wait is capped at
60 s, including a longer `Retry-After` (a server asking for more gets asked again
after a minute rather than the client hanging on one hint). After 5 retries (6
attempts) the error is raised: RateLimitError (a RuntimeError) or
ServiceUnavailableError.

A 429 `quota_exceeded` whose `Retry-After` is longer than that cap is raised at
once as QuotaExceededError: the key's daily token quota frees at midnight UTC, and
asking again every minute until then would only add load. A shorter one (the key's
intake quota, freed as its batches progress) is retried like any 429. Nothing else
is retried: other errors are not transient in a way the client can know.
"""

from __future__ import annotations

import logging
import math
import time
from email.utils import parsedate_to_datetime

import tenacity

from batchgen import _clock
from batchgen.errors import QuotaExceededError, RateLimitError, ServiceUnavailableError

logger = logging.getLogger("batchgen")

MAX_RETRIES = 5
MAX_WAIT_S = 60.0


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` value, or None if absent or unreadable.

    Accepts delta seconds ("30", also "1.5") and HTTP dates; a date in the past is 0.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None or when.tzinfo is None:  # not a valid RFC 9110 date (no GMT)
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


class wait_retry_after(tenacity.wait.wait_base):
    """Wait what the 429 or 503 asked for (`Retry-After`), else fall back; never past
    `cap`."""

    def __init__(self, fallback: tenacity.wait.wait_base, cap: float = MAX_WAIT_S):
        self.fallback = fallback
        self.cap = cap

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        error = retry_state.outcome.exception() if retry_state.outcome else None
        hint = getattr(error, "retry_after", None)
        wait = hint if hint is not None else self.fallback(retry_state)
        return min(wait, self.cap)


def is_retryable(error: BaseException) -> bool:
    """Whether a busy answer is worth asking again within the client's waits."""
    if isinstance(error, QuotaExceededError):
        return error.retry_after is None or error.retry_after <= MAX_WAIT_S
    if isinstance(error, ServiceUnavailableError):
        return error.retry_after is not None
    return isinstance(error, RateLimitError)


def _log_retry(retry_state: tenacity.RetryCallState) -> None:
    error = retry_state.outcome.exception() if retry_state.outcome else None
    logger.warning(
        "server busy (HTTP %s%s); retry %d/%d in %.1f s",
        getattr(error, "status_code", "?"),
        f" {error.code}" if getattr(error, "code", None) else "",
        retry_state.attempt_number, MAX_RETRIES, retry_state.upcoming_sleep,
    )


def rate_limit_retrying() -> tenacity.Retrying:
    """A fresh Retrying for one client call. Attempts must raise RateLimitError on 429
    and ServiceUnavailableError on 503 (with their `retry_after`)."""
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_retryable),
        wait=wait_retry_after(tenacity.wait_exponential(multiplier=1, max=MAX_WAIT_S)),
        stop=tenacity.stop_after_attempt(MAX_RETRIES + 1),
        # Looked up at call time so a patched `_clock.sleep` takes effect.
        sleep=lambda seconds: _clock.sleep(seconds),
        before_sleep=_log_retry,
        reraise=True,
    )
