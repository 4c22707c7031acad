"""The console log's filters (batchgen_site.log_filters): requests Django finds
suspicious are refused with a 400 and logged as one warning line, so a client cannot
fill the error log at will; the beat's routine ticks are DEBUG lines."""

from __future__ import annotations

import io
import logging

import pytest
from celery.app.trace import LOG_FAILURE, LOG_RECEIVED, LOG_SUCCESS

from tests.conftest import error_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def console():
    """What the configured console handler (LOGGING) writes."""
    [handler] = [h for h in logging.getLogger().handlers
                 if isinstance(h, logging.StreamHandler) and h.get_name() == "console"]
    stream = io.StringIO()
    previous = handler.setStream(stream)
    yield stream
    handler.setStream(previous)


@pytest.mark.parametrize("path", ["/static/%2e%2e/settings.py",
                                  "/static/..%2f..%2f..%2fetc%2fpasswd",
                                  "/static/admin/..%2f..%2fsettings.py"])
def test_static_path_traversal_is_400_and_one_warning_without_traceback(api, console, path):
    error_of(api.get(path), 400)

    lines = console.getvalue().splitlines()
    security = [line for line in lines if " django.security." in line]
    assert len(security) == 1, lines
    assert " WARNING django.security.SuspiciousFileOperation " in security[0]
    assert "Traceback" not in console.getvalue()
    assert " ERROR " not in console.getvalue()


def test_errors_of_the_server_keep_their_level_and_traceback(console):
    try:
        raise RuntimeError("a bug")
    except RuntimeError:
        logging.getLogger("batchgen.test").exception("something broke")

    assert " ERROR batchgen.test something broke" in console.getvalue()
    assert "Traceback" in console.getvalue()


def test_an_unhealthy_health_check_is_a_warning_not_an_error(api, console):
    """No inference worker is alive here, so /health answers 503: BatchGen's answer,
    not a crash, and logged below ERROR (the fleet tests fail on any ERROR line)."""
    response = api.get("/health")

    assert response.status_code == 503
    assert " WARNING django.request Service Unavailable: /health" in console.getvalue()
    assert " ERROR " not in console.getvalue()


def test_a_server_error_response_is_still_logged_as_an_error(console):
    from django.http import HttpRequest
    from django.utils.log import log_response

    request = HttpRequest()
    request.path = "/v1/batches"
    log_response("Internal Server Error: %s", request.path, response=type(
        "Response", (), {"status_code": 500, "_has_been_logged": False})(), request=request)

    assert " ERROR django.request Internal Server Error: /v1/batches" in console.getvalue()


def _celery_lines(task: str) -> None:
    """What beat, the worker and the task's tracer log about one run of `task`."""
    context = {"name": task, "id": "0e1648df", "runtime": 0.007, "return_value": 0,
               "args": "()", "kwargs": "{}"}
    logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", "tick", task)
    logging.getLogger("celery.worker.strategy").info(LOG_RECEIVED, context)
    logging.getLogger("celery.app.trace").info(LOG_SUCCESS, context)


def test_every_task_the_beat_sends_within_ten_seconds_is_a_routine_tick(settings):
    """Recovery (every 15 s) keeps its INFO line: it says what was recovered."""
    from core.celery import app

    frequent = {entry["task"] for entry in app.conf.beat_schedule.values()
                if float(entry["schedule"]) < 10}

    assert "batches.dispatch_chunks" in frequent
    assert frequent <= set(settings.ROUTINE_TICK_TASKS)


def test_the_dispatch_tick_every_second_leaves_no_line_in_the_log(console):
    _celery_lines("batches.dispatch_chunks")
    _celery_lines("webhooks.sweep_deliveries")

    assert console.getvalue() == ""


def test_other_tasks_are_still_logged_at_info(console):
    _celery_lines("batches.validate_batch")

    lines = console.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert all(" INFO celery." in line and "batches.validate_batch" in line for line in lines)


def test_a_tick_that_fails_is_still_an_error(console):
    logging.getLogger("celery.app.trace").error(
        LOG_FAILURE, {"name": "batches.dispatch_chunks", "id": "0e1648df",
                      "exc": "OperationalError('database is locked')", "description": "raised"})

    assert " ERROR celery.app.trace Task batches.dispatch_chunks[0e1648df] raised" in (
        console.getvalue())


def test_the_ticks_show_as_debug_lines_when_debugging():
    """BATCHGEN_LOG_LEVEL=DEBUG (settings) shows them, as DEBUG lines."""
    from batchgen_site.log_filters import RoutineTicksAtDebug

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    handler.addFilter(RoutineTicksAtDebug(["batches.dispatch_chunks"], show=True))
    loggers = [logging.getLogger(name) for name in ("celery.beat", "celery.worker.strategy",
                                                    "celery.app.trace")]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
    try:
        _celery_lines("batches.dispatch_chunks")
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
            logger.propagate = True

    lines = stream.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert all(line.startswith("DEBUG celery.") for line in lines)


def _traced(exc: Exception) -> None:
    """Celery's tracer logging `exc` as the run of a chunk task ended by it."""
    from billiard.einfo import ExceptionInfo
    from celery import states
    from celery.app.task import Context
    from celery.app.trace import TraceInfo

    from inference.tasks import run_chunk

    request = Context(id="0e1648df", hostname="inference1@h", args=(7,), kwargs={})
    try:
        raise exc
    except Exception:
        TraceInfo(states.FAILURE, exc)._log_error(run_chunk, request, ExceptionInfo())


def test_a_message_handed_back_to_the_broker_is_one_warning_without_traceback(console):
    """A worker that no longer holds the model (or is stopping) rejects the message
    with requeue: routine, so one WARNING line, no traceback for the fleet logs to
    take for a crash. A task that fails keeps its traceback."""
    from celery.exceptions import Reject

    _traced(Reject("model not resident on this worker", requeue=True))
    handed_back = console.getvalue()
    _traced(RuntimeError("the engine failed to start"))
    failed = console.getvalue()[len(handed_back):]

    assert len(handed_back.splitlines()) == 1, handed_back
    assert " WARNING celery.app.trace Task inference.run_chunk[0e1648df] " in handed_back
    assert "model not resident on this worker" in handed_back
    assert " ERROR celery.app.trace " in failed and "Traceback (most recent call last)" in failed
