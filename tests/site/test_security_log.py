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
