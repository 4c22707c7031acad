"""BatchGen's gunicorn worker: gunicorn's threaded worker (gthread), hardened for an
open port. Set by batchgen_site/gunicorn_conf.py.

A thread of gthread reads a request with blocking socket calls, head and body, with
no time limit: a client that sends the head of an upload and then nothing held a
thread for good, and a handful of them left no thread for `/health` or the polls
(issue 13; figures in docs/benchmarks.md, "slow_clients.py"). What keeps slow and
stalled clients from doing that here:

- A deadline for every read from a client while a thread serves it: nothing for
  BATCHGEN_CLIENT_TIMEOUT_SECONDS, or under BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND on
  average after that long, and the client is given up (`ClientSocket`): its request
  ends, its connection is closed, one warning is logged.
- Requests that carry a body (uploads, batch creates) are read by at most
  BATCHGEN_WEB_UPLOAD_THREADS threads of a process, added for them; one more is
  answered 503 at once, so uploads never take the threads polls are served by.
- A new connection waits for its first bytes in the worker's poller, not in a thread,
  and closing a connection does not wait for the client in the worker's main loop.

And gunicorn's own refusals (414 URI too long, 431 headers too large, 400 bad request
line...) are the OpenAI error envelope, like every other error of the API, not
gunicorn's HTML page.
"""

from __future__ import annotations

import errno
import json
import logging
import select
import selectors
import socket
import threading
import time
from concurrent import futures
from functools import partial

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

from batchgen_site.config import server_setting

logger = logging.getLogger("batchgen.web")


class ClientTooSlow(ConnectionResetError):
    """Raised by a read from a client past its deadline. A connection reset to
    gunicorn, which then closes the connection without a traceback; an unreadable
    body to Django, which the API answers 400 (`parse_error`)."""

    def __init__(self):
        super().__init__(errno.ECONNRESET, "the client sent too little, too slowly "
                         "(BATCHGEN_CLIENT_TIMEOUT_SECONDS, BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND)")


class ClientSocket(socket.socket):
    """A client connection whose reads give up on a client that stalls or trickles.

    Each time a worker thread takes the connection (gthread sets it blocking then)
    the clock starts again: the request must then arrive with no pause longer than
    `timeout` seconds and, after the first `timeout` seconds, at `min_rate` bytes a
    second on average. A read past either limit raises ClientTooSlow.
    """

    timeout_seconds: float = 30.0
    min_rate: float = 1024.0  # bytes a second; 0: no rate limit

    @classmethod
    def adopt(cls, sock: socket.socket) -> ClientSocket:
        timeout = sock.gettimeout()
        adopted = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        adopted.settimeout(timeout)
        adopted._restart_clock()
        return adopted

    def _restart_clock(self) -> None:
        self._started = time.monotonic()
        self._received = 0
        self.gave_up = False
        self.closing = False

    def setblocking(self, flag: bool) -> None:
        super().setblocking(flag)
        if flag:
            self._restart_clock()

    def shutdown(self, how: int) -> None:
        # gunicorn closes a connection by shutting down its sending side, then reads
        # until the client closes too, for up to 2 s, in the worker's main loop (the
        # one that accepts and dispatches every request). It reads only what has
        # already arrived here: a client that never closes cannot freeze that loop.
        self.closing = True
        super().shutdown(how)

    def _wait_limit(self) -> float:
        limit = self.timeout_seconds
        if self.min_rate:
            deadline = self._started + self.timeout_seconds + self._received / self.min_rate
            limit = min(limit, deadline - time.monotonic())
        return limit

    def recv(self, size: int, flags: int = 0) -> bytes:
        timeout = self.gettimeout()
        if self.gave_up:
            raise ClientTooSlow()
        if timeout != 0.0:  # a blocking read: bounded by the deadline
            limit = 0.0 if self.closing else self._wait_limit()
            # gunicorn sets a shorter timeout of its own to drain a body the
            # application left unread: that one raises as gunicorn expects.
            if timeout is None or limit <= timeout:
                if not self._readable_within(max(limit, 0.0)):
                    if self.closing:
                        return b""
                    self._give_up()
                    raise ClientTooSlow()
        data = super().recv(size, flags)
        self._received += len(data)
        return data

    def _readable_within(self, seconds: float) -> bool:
        poller = select.poll()  # not select.select: descriptors may be past 1024
        poller.register(self, select.POLLIN)
        return bool(poller.poll(seconds * 1000))

    def _give_up(self) -> None:
        self.gave_up = True
        elapsed = time.monotonic() - self._started
        try:
            peer = self.getpeername()[0]
        except OSError:
            peer = "?"
        logger.warning("closing a connection from %s: %d bytes in %.0f s, under the limits "
                       "for a client (nothing for %.0f s, or under %.0f bytes/s; "
                       "BATCHGEN_CLIENT_TIMEOUT_SECONDS, BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND)",
                       peer, self._received, elapsed, self.timeout_seconds, self.min_rate)


def has_body(req) -> bool:
    for name, value in req.headers:
        if name == "TRANSFER-ENCODING":
            return True
        if name == "CONTENT-LENGTH" and value.strip() not in ("", "0"):
            return True
    return False


# --- the error envelope for what gunicorn answers itself --------------------------------

_CODES = {400: "bad_request", 403: "forbidden", 414: "uri_too_long", 417: "expectation_failed",
          431: "headers_too_large", 500: "internal_error", 501: "not_implemented",
          503: "server_busy"}


def envelope_response(status: int, reason: str, message: str, *,
                      extra_headers: str = "") -> bytes:
    """A complete HTTP/1.1 answer carrying the OpenAI error envelope (the shape of
    batchgen_site.errors.envelope; this module runs before Django is set up)."""
    # 501 is gunicorn's answer to a transfer coding it does not know: the request's fault.
    error_type = "server_error" if status in (500, 503) else "invalid_request_error"
    body = json.dumps({"error": {"message": message or reason, "type": error_type,
                                 "param": None, "code": _CODES.get(status)}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra_headers}\r\n")
    return head.encode("latin-1") + body


def write_envelope_error(sock, status_int: int, reason: str, mesg: str) -> None:
    util.write_nonblock(sock, envelope_response(status_int, reason, mesg))


# gunicorn's handle_error (workers/base.py) classifies the error, logs it and writes
# the answer with util.write_error, an HTML page: the classification stays gunicorn's,
# the page becomes the envelope. Only web worker processes import this module.
util.write_error = write_envelope_error


class BatchGenWorker(ThreadWorker):
    def init_process(self):
        ClientSocket.timeout_seconds = float(server_setting("BATCHGEN_CLIENT_TIMEOUT_SECONDS"))
        ClientSocket.min_rate = float(server_setting("BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND"))
        self.upload_threads = int(server_setting("BATCHGEN_WEB_UPLOAD_THREADS"))
        self.body_slots = threading.BoundedSemaphore(self.upload_threads)
        super().init_process()

    def get_thread_pool(self):
        return futures.ThreadPoolExecutor(max_workers=self.cfg.threads + self.upload_threads)

    def enqueue_req(self, conn):
        if not isinstance(conn.sock, ClientSocket):
            conn.sock = ClientSocket.adopt(conn.sock)
        if not conn.initialized and not conn.data_ready:
            # A new connection waits for its first bytes in the poller, not in a
            # thread (gthread would give it a thread for 5 s first): connections that
            # send nothing cost no thread.
            self._wait_in_poller(conn)
            return
        super().enqueue_req(conn)

    def _wait_in_poller(self, conn) -> None:
        # As gthread does with a connection it defers (finish_request): closed by
        # murder_pending if nothing arrives within the keepalive timeout.
        conn.sock.setblocking(False)
        conn.timeout = time.monotonic() + self.cfg.keepalive
        self.pending_conns.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ,
                             partial(self.on_pending_socket_readable, conn))

    def handle_request(self, req, conn):
        if not has_body(req):
            return super().handle_request(req, conn)
        if not self.body_slots.acquire(blocking=False):
            self._refuse_busy(req, conn)
            return False
        try:
            keepalive = super().handle_request(req, conn)
        finally:
            self.body_slots.release()
        # A client given up on mid-body leaves the stream at an unknown place.
        return keepalive and not conn.sock.gave_up

    def _refuse_busy(self, req, conn) -> None:
        self.log.warning("503 for %s %s: all %d upload threads are reading request bodies",
                         req.method, req.path, self.upload_threads)
        message = ("The server is reading as many request bodies as it allows at once "
                   "(BATCHGEN_WEB_UPLOAD_THREADS per web process); retry shortly.")
        try:
            util.write(conn.sock, envelope_response(503, "Service Unavailable", message,
                                                    extra_headers="Retry-After: 1\r\n"))
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                raise
