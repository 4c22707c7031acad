"""The raw HTTP cases of the corpus (tests/corpus/cases.py, RAW_HTTP) against a real
server: what gunicorn parses before Django can only be tested over a socket."""

from __future__ import annotations

import http.client
import json
import socket

import pytest

from tests.corpus.cases import RAW_HTTP, RAW_HTTP_MAX_UPLOAD_BYTES, Answered, RawHttp
from tests.corpus.test_corpus import check_refused
from tests.e2e.harness import Api, Server, chat_lines, server_env

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    storage = tmp_path_factory.mktemp("corpus-http") / "storage"
    server = Server(storage=storage, env=server_env(
        storage=storage, BATCHGEN_MAX_UPLOAD_BYTES=str(RAW_HTTP_MAX_UPLOAD_BYTES)))
    server.start()
    yield server
    server.stop()


class Answer:
    """A raw HTTP answer, read as the in-process corpus reads a response."""

    def __init__(self, status: int, headers: dict[str, str], content: bytes):
        self.status_code, self.headers, self.content = status, headers, content

    def __getitem__(self, name: str) -> str:
        return self.headers[name.lower()]

    def json(self):
        return json.loads(self.content)


def send(port: int, request: bytes) -> Answer:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        response = http.client.HTTPResponse(sock)
        response.begin()
        content = response.read()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()},
                      content)


@pytest.mark.parametrize("case", RAW_HTTP, ids=lambda case: case.name)
def test_raw_http_case_gets_its_expected_outcome(case: RawHttp, server):
    needs_file = b"@FILE@" in case.body()
    file_id = Api(server.base_url).upload(chat_lines(1))["id"] if needs_file else ""

    answer = send(server.port, case.request(file_id))

    if isinstance(case.expected, Answered):
        assert answer.status_code == case.expected.status, answer.content[:500]
        assert answer.json()["object"] == case.expected.object
    else:
        check_refused(answer, case.expected)
