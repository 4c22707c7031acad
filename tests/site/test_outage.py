"""A dependency's outage is said once per process (core.outage): one WARNING
when it starts, one INFO when it ends, and the control tasks it interrupts return
quietly instead of logging `raised unexpected` tracebacks at every tick (issue 26).
A bug is still an error. The whole path under a real PostgreSQL cut is
tests/faults/test_database_outage.py."""

from __future__ import annotations

import logging

import psycopg.errors
import pytest
from celery.exceptions import Retry
from django.db import IntegrityError, OperationalError, connection, transaction
from kombu.exceptions import OperationalError as BrokerError

from core import outage, transient
from core.outage import BROKER, DATABASE, dependency_down
from core.transient import DatabaseBusy, retry_transient
from tests.site.test_transient import DEADLOCK, django_error

REFUSED = OperationalError('connection failed: connection to server at "127.0.0.1", port '
                           "5432 failed: Connection refused")


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(outage, "_down", {})
    monkeypatch.setattr(transient._retrying, "sleep", lambda seconds: None)


def busy_from(error: Exception) -> DatabaseBusy:
    busy = DatabaseBusy("the database stayed busy")
    busy.__cause__ = error
    return busy


@pytest.mark.parametrize(("error", "dependency"), [
    (REFUSED, DATABASE),
    (django_error(psycopg.errors.AdminShutdown("terminating connection")), DATABASE),
    (busy_from(REFUSED), DATABASE),
    (BrokerError("[Errno 111] Connection refused"), BROKER),
    (busy_from(django_error(DEADLOCK)), None),  # contention, not an outage
    (django_error(psycopg.errors.UniqueViolation("dup"), IntegrityError), None),
    (OperationalError("database is locked"), None),  # SQLite's busy timeout
    (ValueError("connection"), None),  # a bug
])
def test_an_unreachable_dependency_is_told_from_other_errors(error, dependency):
    assert dependency_down(error) == dependency


def outage_lines(caplog) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records
            if r.name == "batchgen.outage"]


def test_an_outage_is_one_warning_at_its_start_and_one_info_at_its_end(caplog):
    caplog.set_level(logging.INFO, logger="batchgen.outage")

    for _ in range(15):  # every tick of a 12 s outage
        outage.outage_began(DATABASE, REFUSED)
    outage.outage_ended(DATABASE)
    outage.outage_ended(DATABASE)

    assert outage_lines(caplog) == [("WARNING", "database outage"),
                                    ("INFO", "database recovered")]
    assert not outage.is_down(DATABASE)


@pytest.mark.django_db(transaction=True)
def test_a_new_database_connection_ends_the_database_outage(caplog):
    caplog.set_level(logging.INFO, logger="batchgen.outage")
    outage.outage_began(DATABASE, REFUSED)

    connection.close()
    connection.ensure_connection()  # Django sends connection_created

    assert outage_lines(caplog)[-1] == ("INFO", "database recovered")


@pytest.mark.django_db(transaction=True)
def test_retries_of_a_lost_connection_say_the_outage_once_not_at_every_attempt(caplog):
    @retry_transient
    def service():
        raise REFUSED

    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            with pytest.raises(DatabaseBusy):
                service()

    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.name, r.levelname) for r in warnings] == [("batchgen.outage", "WARNING")]


@pytest.mark.django_db(transaction=True)
def test_a_deadlock_retry_still_warns(caplog):
    calls = []

    @retry_transient
    def service():
        calls.append(1)
        if len(calls) < 2:
            raise django_error(DEADLOCK)

    with caplog.at_level(logging.WARNING):
        service()

    assert [r.name for r in caplog.records] == ["batchgen.db"]


@pytest.mark.django_db(transaction=True)
def test_an_on_commit_callback_cut_off_by_an_outage_is_said_once_not_as_an_error(caplog):
    # Django logs a robust on_commit callback that raised at ERROR, with a traceback.
    def publish():
        raise busy_from(REFUSED)

    with caplog.at_level(logging.INFO):
        for _ in range(3):
            with transaction.atomic():
                transaction.on_commit(publish, robust=True)

    assert [(r.name, r.levelname) for r in caplog.records if r.levelno >= logging.WARNING] \
        == [("batchgen.outage", "WARNING")]


def test_a_periodic_task_skips_an_outage_quietly(monkeypatch, caplog):
    from batches import dispatch
    from batches.tasks import dispatch_chunks

    def unreachable(**kwargs):
        raise busy_from(REFUSED)

    monkeypatch.setattr(dispatch, "dispatch", unreachable)
    with caplog.at_level(logging.INFO):
        result = dispatch_chunks.apply()

    assert result.successful(), result.traceback
    assert result.result == "skipped: the database is unreachable"
    assert [r.levelname for r in caplog.records if r.levelno >= logging.WARNING] == ["WARNING"]


def test_every_task_of_the_app_is_outage_tolerant():
    import importlib

    from core.celery import app
    from core.outage import OutageTolerantTask

    for module in ("batches.tasks", "files.tasks", "inference.tasks", "webhooks.tasks"):
        importlib.import_module(module)  # every task registered
    ours = {name: task for name, task in app.tasks.items() if not name.startswith("celery.")}
    assert "batches.dispatch_chunks" in ours and "webhooks.sweep_deliveries" in ours
    assert [n for n, task in ours.items() if not isinstance(task, OutageTolerantTask)] == []


def test_a_periodic_task_that_hits_a_bug_still_fails(monkeypatch):
    from batches import dispatch
    from batches.tasks import dispatch_chunks

    def bug(**kwargs):
        raise ValueError("a bug")

    monkeypatch.setattr(dispatch, "dispatch", bug)
    result = dispatch_chunks.apply()

    assert result.failed()
    assert not outage.is_down(DATABASE)


def test_a_validation_interrupted_by_an_outage_is_retried_soon(monkeypatch):
    from batches import services
    from batches.tasks import validate_batch

    def unreachable(**kwargs):
        raise busy_from(REFUSED)

    def retry_later(*, exc, countdown, max_retries):  # Task.retry, as a worker runs it
        retries.append(countdown)
        return Retry(exc=exc, when=countdown)

    retries: list[float] = []
    monkeypatch.setattr(services, "batch_validate", unreachable)
    monkeypatch.setattr(validate_batch._get_current_object(), "retry", retry_later)
    result = validate_batch.apply(args=("batch_x",))

    assert result.state == "RETRY"
    assert retries == [outage.OUTAGE_RETRY_SECONDS]
