"""Clients that stall or trickle against the real web server (issue 13, item 2): they
hold no thread the polls need (their requests are read in the worker's event loop),
and their connections are closed after the deadline with a 408."""

from __future__ import annotations

import collections
import json
import socket
import subprocess
import sys
import time

from tests.e2e.harness import ROOT
from tests.faults.stalls import (
    close_all,
    closed_by_server,
    open_stalled_uploads,
    time_requests,
    wait_all_closed,
)

STALLS = 64
DEADLINE = 3  # BATCHGEN_CLIENT_TIMEOUT_SECONDS in these tests (default 30)
PROMPT = 2.0  # seconds a poll may take on this loaded two-core machine


def status_and_code(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]["code"]


def create_api_key(server) -> str:
    created = subprocess.run([sys.executable, "manage.py", "createapikey", "poller"],
                             cwd=ROOT, env=server.env, capture_output=True, text=True,
                             check=True)
    return created.stdout.strip()


def test_polls_answer_promptly_while_64_uploads_stall_and_the_stalls_are_closed(start_server):
    # Given: API keys on, and 64 connections, with a valid key, that sent the head of
    # an upload of 100,000 bytes and then nothing
    server, _ = start_server(BATCHGEN_CLIENT_TIMEOUT_SECONDS=str(DEADLINE))
    key = create_api_key(server)
    stalled = open_stalled_uploads(server.port, STALLS, api_key=key)
    try:
        # When: a client polls meanwhile
        polls = time_requests(server.base_url, ["/health", "/v1/pool/status"] * 5,
                              timeout=10, api_key=key)

        # Then: every poll is answered at once, and the server closes every stalled
        # connection soon after the deadline, each with a 408 in the error envelope
        assert [p.status for p in polls] == [200] * 10
        assert max(p.seconds for p in polls) < PROMPT, polls
        answers: dict = {}
        closed_after = wait_all_closed(stalled, timeout=DEADLINE + 20, answers=answers)
        assert closed_after is not None, "stalled connections still open"
    finally:
        close_all(stalled)
    statuses = collections.Counter(status_and_code(answer) for answer in answers.values())
    assert statuses == {(408, "request_timeout"): STALLS}, statuses
    log = server.log(tail=100_000)
    assert "closing a connection from 127.0.0.1" in log
    assert "Traceback" not in log


def test_a_client_trickling_under_the_minimum_rate_is_closed(start_server):
    # Given: a minimum rate of 1,000 bytes a second after the first 3 s
    server, _ = start_server(BATCHGEN_CLIENT_TIMEOUT_SECONDS=str(DEADLINE),
                             BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND="1000")
    [sock] = open_stalled_uploads(server.port, 1)
    try:
        # When: the client sends 10 bytes a second, never pausing as long as the deadline
        start = time.monotonic()
        while not closed_by_server(sock) and time.monotonic() - start < 30:
            try:
                sock.sendall(b"x" * 10)
            except OSError:
                break
            time.sleep(1)  # the pace of the trickle, not a wait for a condition

        # Then: it is closed once it is behind the rate (3 s + received / 1000)
        assert wait_all_closed([sock], timeout=5) is not None
        assert time.monotonic() - start < 10
    finally:
        close_all([sock])


def test_connections_that_send_nothing_hold_no_thread(start_server):
    # Given: 64 connections that send nothing at all
    server, _ = start_server()
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(STALLS)]
    try:
        # When / then: polls are answered at once (gthread alone gave each silent
        # connection a thread for 5 s first)
        polls = time_requests(server.base_url, ["/health"] * 5, timeout=10)
        assert [p.status for p in polls] == [200] * 5
        assert max(p.seconds for p in polls) < PROMPT, polls
    finally:
        close_all(silent)
