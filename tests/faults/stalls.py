"""Clients that stall: connections that send the head of an upload and then nothing,
and the timing of the requests other clients make meanwhile. Shared by
`test_stalled_clients.py` and `benchmarks/slow_clients.py`."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from dataclasses import dataclass

import httpx

STALLED_HEAD = (
    "POST /v1/files HTTP/1.1\r\n"
    "Host: 127.0.0.1\r\n"
    "Content-Type: multipart/form-data; boundary=stall\r\n"
    "Content-Length: 100000\r\n"
    "{auth}"
    "\r\n"
    "--stall\r\n"
    'Content-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
    "\r\n"
)


def open_stalled_uploads(port: int, count: int, *, api_key: str | None = None
                         ) -> list[socket.socket]:
    """`count` connections that each send an upload's head and the start of its body
    (announcing 100,000 bytes), then nothing."""
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    head = STALLED_HEAD.format(auth=auth).encode()
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(head)
        sockets.append(sock)
    return sockets


def closed_by_server(sock: socket.socket, answers: dict | None = None) -> bool:
    """Whether the server has closed this connection; what it answered first is
    added to `answers[sock]`."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        while True:
            sock.setblocking(False)
            data = sock.recv(65536)
            if answers is not None:
                answers[sock] = answers.get(sock, b"") + data
            if not data:
                return True
    except BlockingIOError:
        return False  # an answer arrived, the connection is still open
    except OSError:
        return True  # reset


def wait_all_closed(sockets: list[socket.socket], *, timeout: float,
                    answers: dict | None = None) -> float | None:
    """Seconds until the server closed every socket, or None if some were still open
    after `timeout`. What each got is added to `answers`."""
    start = time.monotonic()
    open_ = list(sockets)
    while open_ and time.monotonic() - start < timeout:
        open_ = [sock for sock in open_ if not closed_by_server(sock, answers)]
        if open_:
            select.select(open_, [], [], 0.5)
    return None if open_ else time.monotonic() - start


def close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.close()


@dataclass
class Timed:
    path: str
    status: int | None  # None: no answer within the timeout
    seconds: float


def time_requests(base_url: str, paths: list[str], *, timeout: float,
                  api_key: str | None = None) -> list[Timed]:
    """Each path requested once, one after the other, on a new connection each, as a
    poller would; how long each took and what it got."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    results = []
    for path in paths:
        start = time.monotonic()
        try:
            with httpx.Client(base_url=base_url, timeout=timeout, headers=headers) as http:
                status = http.get(path).status_code
        except httpx.TimeoutException:
            status = None
        results.append(Timed(path, status, time.monotonic() - start))
    return results
