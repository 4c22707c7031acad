"""Transient database errors, retried in one place.

PostgreSQL may abort a transaction that did nothing wrong: a deadlock victim
(40P01), a serialization failure (40001), a connection dropped by a restart or a
failover (57P01, 08xxx, or no SQLSTATE at all). SQLite answers "database is locked"
when its busy timeout runs out. The whole transaction is safe to run again, so the
services that open transactions are wrapped in `retry_transient`: bounded attempts
with jittered exponential backoff (so workers that collided do not collide again in
step), then the error is raised as `DatabaseBusy`, which the API answers 503 with
`Retry-After` (never a 500) and a Celery task simply raises for its caller's
recovery to cover.

Only the outermost transaction is retried: inside an atomic block the connection is
already in a failed transaction, so a nested call lets the error through to the
outermost `retry_transient`, which runs the whole unit again.
"""

from __future__ import annotations

import functools
import logging

import tenacity
from django.db import DatabaseError, InterfaceError, OperationalError, connection

logger = logging.getLogger("batchgen.db")

ATTEMPTS = 6  # about 3 s of waiting in all: longer than any deadlock cycle takes
WAIT_FIRST = 0.05
WAIT_MAX = 1.0
# SQLSTATE classes and codes that say "run it again": serialization failure,
# deadlock, lock not available, connection exceptions, operator intervention
# (admin shutdown, cannot connect now), insufficient resources (too many connections).
TRANSIENT_SQLSTATES = ("40001", "40P01", "55P03", "57P01", "57P02", "57P03", "53300")
TRANSIENT_CLASSES = ("08",)


class DatabaseBusy(Exception):
    """A transient database error outlived its retries."""


def is_transient(error: BaseException) -> bool:
    if not isinstance(error, OperationalError | InterfaceError):
        return False
    cause = error.__cause__
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    if sqlstate:
        return sqlstate in TRANSIENT_SQLSTATES or sqlstate.startswith(TRANSIENT_CLASSES)
    if isinstance(error, InterfaceError):
        return True  # the connection is closed or unusable: a new one may work
    # SQLite's busy timeout, or a PostgreSQL connection that failed without a SQLSTATE.
    text = str(error).lower()
    return "database is locked" in text or "connection" in text or "server closed" in text


def _before_retry(state: tenacity.RetryCallState) -> None:
    error = state.outcome.exception()
    # A broken connection is closed here, so the next attempt opens a new one.
    connection.close_if_unusable_or_obsolete()
    logger.warning("transient database error in %s (attempt %s of %s), retrying: %s",
                   getattr(state.fn, "__qualname__", state.fn), state.attempt_number,
                   ATTEMPTS, str(error).splitlines()[0] if str(error) else type(error).__name__)


_retrying = tenacity.Retrying(
    retry=tenacity.retry_if_exception(is_transient),
    stop=tenacity.stop_after_attempt(ATTEMPTS),
    wait=tenacity.wait_random_exponential(multiplier=WAIT_FIRST, max=WAIT_MAX),
    before_sleep=_before_retry,
    reraise=True,
)


def retry_transient(fn):
    """Run `fn` again on a transient database error (see the module's docstring)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if connection.in_atomic_block:
            return fn(*args, **kwargs)  # the outermost retry_transient runs it again
        try:
            return _retrying.copy()(fn, *args, **kwargs)
        except DatabaseError as exc:
            if is_transient(exc):
                raise DatabaseBusy(f"the database stayed busy after {ATTEMPTS} attempts: "
                                   f"{exc}") from exc
            raise

    return wrapper
