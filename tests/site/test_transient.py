"""Transient database errors are retried in one place (core.transient) and,
when they outlast the retries, reach a client as 503 database_busy, never a 500."""

from __future__ import annotations

import psycopg.errors
import pytest
from django.db import IntegrityError, OperationalError, transaction

from core import transient
from core.transient import DatabaseBusy, is_transient, retry_transient
from tests.conftest import error_of


def django_error(cause: Exception, kind=OperationalError) -> Exception:
    """A database error as Django raises it: the driver's error as its cause."""
    error = kind(str(cause))
    error.__cause__ = cause
    return error


DEADLOCK = psycopg.errors.DeadlockDetected("deadlock detected")
SERIALIZATION = psycopg.errors.SerializationFailure("could not serialize access")
ADMIN_SHUTDOWN = psycopg.errors.AdminShutdown("terminating connection")


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    monkeypatch.setattr(transient._retrying, "sleep", lambda seconds: None)


@pytest.mark.parametrize("cause", [DEADLOCK, SERIALIZATION, ADMIN_SHUTDOWN])
def test_deadlocks_serialization_failures_and_dropped_connections_are_transient(cause):
    assert is_transient(django_error(cause))


def test_sqlite_busy_is_transient_and_other_errors_are_not():
    assert is_transient(OperationalError("database is locked"))
    assert not is_transient(django_error(psycopg.errors.UniqueViolation("dup"), IntegrityError))
    assert not is_transient(OperationalError("no such table: batches_batch"))
    assert not is_transient(ValueError("deadlock"))


# Outside the test's own transaction, as services run in a server process.
@pytest.mark.django_db(transaction=True)
def test_a_transaction_that_hit_a_deadlock_runs_again_and_succeeds():
    calls = []

    @retry_transient
    def service():
        calls.append(1)
        if len(calls) < 3:
            raise django_error(DEADLOCK)
        return "done"

    assert service() == "done"
    assert len(calls) == 3


@pytest.mark.django_db(transaction=True)
def test_retries_are_bounded_then_the_error_is_database_busy():
    calls = []

    @retry_transient
    def service():
        calls.append(1)
        raise django_error(SERIALIZATION)

    with pytest.raises(DatabaseBusy):
        service()
    assert len(calls) == transient.ATTEMPTS


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_only_the_outermost_call_retries():
    inner_calls, outer_calls = [], []

    @retry_transient
    def inner():
        inner_calls.append(1)
        raise django_error(DEADLOCK)

    @retry_transient
    def outer():
        outer_calls.append(1)
        with transaction.atomic():
            inner()

    with pytest.raises(DatabaseBusy):
        outer()
    assert len(inner_calls) == len(outer_calls) == transient.ATTEMPTS


@pytest.mark.django_db(transaction=True)
def test_an_error_that_is_not_transient_is_not_retried():
    calls = []

    @retry_transient
    def service():
        calls.append(1)
        raise django_error(psycopg.errors.UniqueViolation("dup"), IntegrityError)

    with pytest.raises(IntegrityError):
        service()
    assert len(calls) == 1


@pytest.mark.django_db
def test_a_create_the_database_keeps_refusing_is_503_with_retry_after(api, upload,
                                                                      monkeypatch):
    from batches import services

    file = upload(b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
                  b'"body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}\n')

    def deadlocked(**kwargs):
        raise django_error(DEADLOCK)

    monkeypatch.setattr(services, "file_lock", deadlocked)

    response = api.post("/v1/batches", {"input_file_id": file["id"], "endpoint":
                                        "/v1/chat/completions", "completion_window": "24h"},
                        format="json")

    error = error_of(response, 503)
    assert error["code"] == "database_busy"
    assert response["Retry-After"] == "1"


@pytest.mark.django_db(transaction=True)
def test_a_validation_that_meets_a_deadlock_runs_again_instead_of_failing_its_task(
        upload, published, monkeypatch):
    from batches import services

    file = upload(b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
                  b'"body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}\n')
    batch = services.batch_create(input_file_id=file["id"], endpoint="/v1/chat/completions",
                                  model="m")
    real, calls = services.file_bytes_path, []

    def deadlocked_once(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise django_error(DEADLOCK)
        return real(**kwargs)

    monkeypatch.setattr(services, "file_bytes_path", deadlocked_once)

    assert services.batch_validate(batch_id=batch.id).status == "in_progress"
    assert len(calls) == 2
