"""`make run` (manage.py serve) starts gunicorn with BatchGen's hardened worker and
safe limits for slow clients; the behaviour itself is proved against real servers in
tests/faults/test_stalled_clients.py and tests/corpus/test_corpus_http.py."""

from __future__ import annotations

import sys

import pytest
from gunicorn.app.wsgiapp import WSGIApplication

from batchgen_site.gunicorn_worker import BatchGenWorker
from batchgen_site.management.commands.serve import Command
from core.config import SERVER_SETTINGS, server_setting


def gunicorn_config(argv: list[str], monkeypatch):
    """gunicorn's configuration as gunicorn builds it from this command line."""
    monkeypatch.setattr(sys, "argv", ["gunicorn", *argv])
    return WSGIApplication("%(prog)s [OPTIONS] [APP_MODULE]").cfg


@pytest.fixture
def web_argv(settings) -> list[str]:
    settings.BATCHGEN_EMBEDDED_BROKER = False
    settings.BATCHGEN_INFERENCE_WORKERS = 0
    programs = Command()._programs({"web_workers": 2, "web_threads": 4,
                                    "access_log": "except-polls", "inference_only": False})
    [web] = [program for program in programs if program.name == "web"]
    return web.argv[web.argv.index("gunicorn") + 1:]


def test_serve_runs_gunicorn_with_batchgens_worker(web_argv, monkeypatch):
    config = gunicorn_config(web_argv, monkeypatch)

    assert config.worker_class is BatchGenWorker
    assert config.keepalive == 5


def test_slow_client_limits_are_on_by_default(monkeypatch):
    for name in ("BATCHGEN_CLIENT_TIMEOUT_SECONDS", "BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND"):
        monkeypatch.delenv(name, raising=False)

    assert float(server_setting("BATCHGEN_CLIENT_TIMEOUT_SECONDS")) == 30
    assert float(server_setting("BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND")) == 1024


def test_no_cap_on_the_threads_reading_bodies_is_left():
    # Requests are read whole in the worker's event loop (issue 26): the cap that
    # answered honest concurrent uploads 503 is gone, setting and all.
    names = {setting.env for setting in SERVER_SETTINGS}

    assert "BATCHGEN_WEB_UPLOAD_THREADS" not in names
