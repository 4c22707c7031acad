"""The web's access log leaves successful polls out and keeps everything else."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from gunicorn.config import Config

from batchgen_site.gunicorn_logging import ExceptPollsLogger


@pytest.fixture
def logged():
    config = Config()
    config.set("accesslog", "-")
    logger = ExceptPollsLogger(config)
    lines: list[str] = []
    logger.access_log.handlers = []
    logger.access_log.addHandler(_Collect(lines))
    logger._access_log_enabled = True

    def request(method: str, path: str, status: int, *, from_gunicorn: bool = False) -> bool:
        before = len(lines)
        req = SimpleNamespace(method=method, path=path, query="", version=(1, 1),
                              headers=[])
        resp = SimpleNamespace(status=f"{status} X", headers=[], response_length=10, sent=10)
        if not from_gunicorn:  # gunicorn's own error answers have no status_code
            resp.status_code = status
        environ = {"REQUEST_METHOD": method, "RAW_URI": path, "PATH_INFO": path,
                   "QUERY_STRING": "", "SERVER_PROTOCOL": "HTTP/1.1",
                   "REMOTE_ADDR": "127.0.0.1"}
        logger.access(resp, req, environ, _Elapsed())
        return len(lines) > before

    return request


class _Collect:
    level = 0

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def handle(self, record) -> None:
        self.lines.append(record.getMessage())


class _Elapsed:
    seconds, microseconds = 0, 1500

    def total_seconds(self) -> float:
        return 0.0015


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v1/batches/batch_abc", 200),
    ("GET", "/v1/pool/status", 200),
    ("GET", "/health", 200),
    ("HEAD", "/health", 200),
    ("GET", "/metrics", 200),
])
def test_successful_polls_are_not_logged(logged, method, path, status):
    assert not logged(method, path, status)


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v1/batches/batch_abc", 404),  # a failing poll
    ("GET", "/health", 503),
    ("POST", "/v1/batches", 200),
    ("POST", "/v1/batches/batch_abc/cancel", 200),
    ("POST", "/v1/files", 200),
    ("GET", "/v1/batches", 200),  # a listing
    ("GET", "/v1/files/file-abc/content", 200),  # a download
    ("GET", "/v1/batches/batch_abc/output", 200),
    ("DELETE", "/v1/files/file-abc", 200),
])
def test_everything_else_is_logged(logged, method, path, status):
    assert logged(method, path, status)


def test_gunicorn_refusal_of_a_malformed_request_is_logged(logged):
    # An invalid Content-Length: gunicorn answers 400 itself, and logs it first (the
    # logger raised on it, so the client got no answer).
    assert logged("POST", "/v1/batches", 400, from_gunicorn=True)
