"""A dependency outage, said once per process: one WARNING when the database stops
answering, one INFO when it answers again (the broker's are said by
log_filters.BrokerOutageOnce; here a broker outage is only noted, at DEBUG).

While PostgreSQL is cut off every periodic task of the control worker fails each
tick, and every inference worker's flush and heartbeat each interval: logged one by
one, a 12 s outage was 15 ERROR tracebacks (issue 26). Nothing is broken in
BatchGen then, and nothing is lost (the ticks run again, the ledger keeps its
figures), so those failures are not errors: `outage_began` says the first one and
drops the rest; `outage_ended` says when the dependency answered again and how long
it was gone. An error that is not a dependency's outage (a bug) still raises and is
logged at ERROR where it happens.

The database is back when this process opens a connection to it again (Django's
`connection_created` signal, connected in BatchgenSiteConfig.ready): every process
must reconnect after an outage, and a connection that opens proves it answers.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from celery import Task

logger = logging.getLogger("batchgen.outage")

DATABASE = "database"
BROKER = "broker"
OBJECT_STORE = "object store"


class ObjectStoreUnavailable(Exception):
    """The object store (BATCHGEN_STORAGE_URL) did not answer or refused a request:
    an outage like the database's, said once and waited out (files.backends)."""

_lock = threading.Lock()
_down: dict[str, float] = {}  # dependency -> time.monotonic() of its first failure


def dependency_down(error: BaseException) -> str | None:
    """Which dependency `error` says is unreachable, or None if it says something
    else (a bug, a constraint, a deadlock: those are not outages)."""
    from django.db import DatabaseError
    from kombu.exceptions import OperationalError as BrokerError

    from core.transient import DatabaseBusy, is_connection_lost

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, DatabaseError):
            return DATABASE if is_connection_lost(error) else None
        if isinstance(error, BrokerError):
            return BROKER
        if isinstance(error, ObjectStoreUnavailable):
            return OBJECT_STORE
        if not isinstance(error, DatabaseBusy):
            return None
        error = error.__cause__  # DatabaseBusy: what outlived the retries
    return None


def _level(dependency: str, level: int) -> int:
    # The broker's outage is said once per process already, from Celery's own
    # connection lines (log_filters.BrokerOutageOnce) and by core.publishing:
    # what is noted here about it is DEBUG, so it is not said twice.
    return logging.DEBUG if dependency == BROKER else level


def outage_began(dependency: str, error: BaseException | None = None) -> bool:
    """Note that `dependency` failed; the first failure of an outage is logged as
    one WARNING. Returns whether this was that first failure."""
    with _lock:
        if dependency in _down:
            return False
        _down[dependency] = time.monotonic()
    reason = str(error).strip().splitlines()[0] if error is not None and str(error).strip() \
        else type(error).__name__
    logger.log(_level(dependency, logging.WARNING),
               "%s outage: the %s is unreachable (%s); periodic work pauses and resumes on "
               "its own when it answers (pid %s)", dependency, dependency, reason, os.getpid())
    return True


def outage_ended(dependency: str) -> bool:
    """`dependency` answered: if it was down, log one INFO line. Returns whether it was."""
    with _lock:
        began = _down.pop(dependency, None)
    if began is None:
        return False
    logger.log(_level(dependency, logging.INFO), "%s recovered: reachable again after %.1f s "
               "(pid %s)", dependency, time.monotonic() - began, os.getpid())
    return True


def noted_outage(error: BaseException) -> bool:
    """Whether `error` is a dependency's outage; if so it is noted (said once, by
    outage_began), so the caller waits for it instead of logging it."""
    dependency = dependency_down(error)
    if dependency is not None:
        outage_began(dependency, error)
    return dependency is not None


def is_down(dependency: str) -> bool:
    return dependency in _down


def database_connected(sender=None, connection=None, **kwargs) -> None:
    """Django's connection_created: a new connection opened, so the database answers."""
    if _down:
        outage_ended(DATABASE)


OUTAGE_RETRY_SECONDS = 5


class OutageTolerantTask(Task):
    """A control task that a dependency's outage pauses quietly: the failure is said
    once (outage_began) and the task returns instead of raising, so Celery does not
    log `raised unexpected` with a traceback at every tick. A periodic task runs
    again at its next tick. A task with `retry_in_outage` (one-off work: validate,
    finalize) is published again to run in OUTAGE_RETRY_SECONDS, so a batch does not
    wait for recovery's sweep; if even that publish fails, recovery (batches.recovery)
    still finds the work unfinished."""

    retry_in_outage = False

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:
            if not noted_outage(exc):
                raise
            if self.retry_in_outage:
                self._retry_later(exc)
            return f"skipped: the {dependency_down(exc)} is unreachable"

    def _retry_later(self, exc: Exception) -> None:
        from celery.exceptions import Retry

        try:
            raise self.retry(exc=exc, countdown=OUTAGE_RETRY_SECONDS, max_retries=None)
        except Retry:
            raise
        except Exception as publish_error:  # the broker is down too
            outage_began(BROKER, publish_error)
