"""Requests Django finds suspicious are refused with a 400 and logged as one warning
line (batchgen_site.log_filters): a client cannot fill the error log at will."""

from __future__ import annotations

import io
import logging

import pytest

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
