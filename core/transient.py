"""Transient database errors, retried in one place.

PostgreSQL may abort a transaction that did nothing wrong: a deadlock victim
(40P01), a serialization failure (40001), a connection dropped by a restart or a
failover (57P01, 08xxx, or no SQLSTATE at all). SQLite answers "database is locked"
when its busy timeout runs out. The whole transaction is safe to run again, so the
services that open transactions are wrapped in `retry_transient`: bounded attempts
with jittered exponential backoff (so workers that collided do not collide again in
step), then the error is raised as `DatabaseBusy`, which the API answers 503 with
`Retry-After` (never a 500) and a Celery task simply raises for its caller's
recovery to cover. A lost connection is an outage, not contention: its retries are
logged at DEBUG and the outage once (core.outage).

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
# Of those, the ones that say the server is gone (not busy): an outage, said once
# per process by core.outage rather than at every retry.
CONNECTION_LOST_SQLSTATES = ("57P01", "57P02", "57P03")


class DatabaseBusy(Exception):
    """A transient database error outlived its retries."""


def _sqlstate(error: BaseException) -> str | None:
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)


def is_transient(error: BaseException) -> bool:
    if not isinstance(error, OperationalError | InterfaceError):
        return False
    sqlstate = _sqlstate(error)
    if sqlstate:
        return sqlstate in TRANSIENT_SQLSTATES or sqlstate.startswith(TRANSIENT_CLASSES)
    if isinstance(error, InterfaceError):
        return True  # the connection is closed or unusable: a new one may work
    # SQLite's busy timeout, or a PostgreSQL connection that failed without a SQLSTATE.
    text = str(error).lower()
    return "database is locked" in text or is_connection_lost(error)


def is_connection_lost(error: BaseException) -> bool:
    """Whether `error` says the database cannot be reached (refused, dropped, shut
    down), as opposed to busy (a deadlock, a lock, SQLite's busy timeout)."""
    if not isinstance(error, OperationalError | InterfaceError):
        return False
    sqlstate = _sqlstate(error)
    if sqlstate:
        return sqlstate in CONNECTION_LOST_SQLSTATES or sqlstate.startswith(TRANSIENT_CLASSES)
    if isinstance(error, InterfaceError):
        return True
    text = str(error).lower()
    return "connection" in text or "server closed" in text


def _before_retry(state: tenacity.RetryCallState) -> None:
    error = state.outcome.exception()
    # A broken connection is closed here, so the next attempt opens a new one.
    connection.close_if_unusable_or_obsolete()
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    if is_connection_lost(error):
        # An outage: said once per process, not at every attempt of every call.
        from core.outage import DATABASE, outage_began

        outage_began(DATABASE, error)
        level = logging.DEBUG
    else:
        level = logging.WARNING
    logger.log(level, "transient database error in %s (attempt %s of %s), retrying: %s",
               getattr(state.fn, "__qualname__", state.fn), state.attempt_number,
               ATTEMPTS, message)


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
