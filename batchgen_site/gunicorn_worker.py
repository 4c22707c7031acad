"""BatchGen's gunicorn worker: gunicorn's threaded worker (gthread), hardened for an
open port. Set by batchgen_site/gunicorn_conf.py.

A thread of gthread reads a request with blocking socket calls, head and body: a
client that sends the head of an upload and then nothing held a thread, and a
handful of them left no thread for `/health` or the polls (issue 13). A cap on the
threads reading bodies kept the polls free, but refused honest concurrent uploads
and batch creates with 503 (issue 26). Here a thread is taken only for a complete
request (figures in docs/benchmarks.md, "slow_clients.py"):

- The worker's event loop reads every request, head and body, as its bytes arrive,
  without blocking, into a spool (batchgen_site/request_spool.py: memory up to
  64 KiB, beyond an unnamed file on the storage volume), and hands it to a thread
  once it is whole. A slow, stalled or trickling client costs a few bytes of state,
  never a thread, however many there are.
- While it is read, a request must arrive with no pause longer than
  BATCHGEN_CLIENT_TIMEOUT_SECONDS and, after that long, at
  BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND on average; past that it is answered
  408 `request_timeout` and its connection closed, with one warning.
- What the loop does not read whole (a body over the limit of its path, which the
  application refuses by its length; a framing gunicorn refuses) goes to a thread
  as it is, whose reads from the client then have the same deadline (`ClientSocket`).
- A new connection waits for its first bytes in the worker's poller, and closing a
  connection does not wait for the client in the worker's main loop.

And gunicorn's own refusals (414 URI too long, 431 headers too large, 400 bad request
line...) are the OpenAI error envelope, like every other error of the API, not
gunicorn's HTML page.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import select
import selectors
import socket
import time
from functools import partial
from pathlib import Path

from gunicorn import util
from gunicorn.workers.gthread import _DEFER, ThreadWorker

from batchgen_site.request_spool import RequestSpool
from core.config import server_setting

logger = logging.getLogger("batchgen.web")

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# The most the loop reads from one connection at a time: a large upload is read
# in steps this big between the other connections' events.
READ_BYTES = 256 * 1024


class ClientTooSlow(ConnectionResetError):
    """Raised by a read from a client past its deadline. A connection reset to
    gunicorn, which then closes the connection without a traceback; an unreadable
    body to Django, which the API answers 400 (`parse_error`)."""

    def __init__(self):
        super().__init__(errno.ECONNRESET, "the client sent too little, too slowly "
                         "(BATCHGEN_CLIENT_TIMEOUT_SECONDS, BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND)")


class ClientSocket(socket.socket):
    """A client connection: its current request's spool, which a thread's reads are
    served from first, and reads from the client itself that give up on a client
    that stalls or trickles.

    Each time a worker thread takes the connection (gthread sets it blocking then)
    the clock starts again: the rest of the request must then arrive with no pause
    longer than `timeout` seconds and, after the first `timeout` seconds, at
    `min_rate` bytes a second on average. A read past either limit raises
    ClientTooSlow.
    """

    timeout_seconds: float = 30.0
    min_rate: float = 1024.0  # bytes a second; 0: no rate limit

    @classmethod
    def adopt(cls, sock: socket.socket) -> ClientSocket:
        timeout = sock.gettimeout()
        adopted = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        adopted.settimeout(timeout)
        adopted._restart_clock()
        adopted.spool = None  # the request being read, or served
        adopted.carried = b""  # bytes of the next request that came with the last one
        adopted.continue_sent = False
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
        if getattr(self, "spool", None) is not None:  # what is left is not to be drained
            self.spool.close()
            self.spool = None
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
        if self.spool is not None and self.spool.unread():
            return self.spool.read(size)
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

    def recv_available(self, size: int) -> bytes | None:
        """What has arrived, up to `size` bytes, without waiting (the event loop's
        read): None if nothing has, b"" once the client has closed."""
        try:
            return super().recv(size)
        except (BlockingIOError, InterruptedError):
            return None

    def send(self, data, flags: int = 0) -> int:
        # The loop answered the request's `Expect: 100-continue` to get its body;
        # gunicorn answers it again when it parses the head in the thread.
        if self.continue_sent and bytes(data) == CONTINUE:
            self.continue_sent = False
            return len(data)
        return super().send(data, flags)

    def close(self) -> None:
        if getattr(self, "spool", None) is not None:
            self.spool.close()
            self.spool = None
        super().close()

    def _readable_within(self, seconds: float) -> bool:
        poller = select.poll()  # not select.select: descriptors may be past 1024
        poller.register(self, select.POLLIN)
        return bool(poller.poll(seconds * 1000))

    def _give_up(self) -> None:
        self.gave_up = True
        log_given_up(self, self._received, time.monotonic() - self._started)


def log_given_up(sock: socket.socket, received: int, elapsed: float) -> None:
    try:
        peer = sock.getpeername()[0]
    except OSError:
        peer = "?"
    logger.warning("closing a connection from %s: %d bytes in %.0f s, under the limits "
                   "for a client (nothing for %.0f s, or under %.0f bytes/s; "
                   "BATCHGEN_CLIENT_TIMEOUT_SECONDS, BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND)",
                   peer, received, elapsed, ClientSocket.timeout_seconds, ClientSocket.min_rate)


# --- the error envelope for what gunicorn answers itself --------------------------------

_CODES = {400: "bad_request", 403: "forbidden", 408: "request_timeout",
          414: "uri_too_long", 417: "expectation_failed", 431: "headers_too_large",
          500: "internal_error", 501: "not_implemented", 503: "server_busy",
          507: "storage_full"}


def envelope_response(status: int, reason: str, message: str, *,
                      extra_headers: str = "") -> bytes:
    """A complete HTTP/1.1 answer carrying the OpenAI error envelope (the shape of
    core.errors.envelope; this module runs before Django is set up)."""
    # 501 is gunicorn's answer to a transfer coding it does not know: the request's fault.
    error_type = "server_error" if status in (500, 503, 507) else "invalid_request_error"
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


def body_limit(path: bytes) -> int:
    """The most body the loop reads for a request to `path`: an upload's limit for
    POST /v1/files, the JSON limit for the rest. A request announcing more goes to a
    thread at once, where the application refuses it by its length (413) unread."""
    from django.conf import settings

    from files.views import MULTIPART_ENVELOPE_BYTES

    if path.rstrip(b"/") == b"/v1/files":
        return settings.BATCHGEN_MAX_UPLOAD_BYTES + MULTIPART_ENVELOPE_BYTES
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def spool_directory() -> Path:
    # The uploads' own volume: a spooled upload becomes an upload there, and a full
    # volume is the same 507 either way.
    from django.conf import settings

    return settings.UPLOADS_DIR


class BatchGenWorker(ThreadWorker):
    def init_process(self):
        ClientSocket.timeout_seconds = float(server_setting("BATCHGEN_CLIENT_TIMEOUT_SECONDS"))
        ClientSocket.min_rate = float(server_setting("BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND"))
        # Connections whose request the loop is reading (a dict: an ordered set).
        self.reading: dict = {}
        super().init_process()

    def enqueue_req(self, conn):
        """gthread's way in for a connection with something to read (new, kept alive,
        or with a request already read ahead): a thread only for a whole request."""
        if not isinstance(conn.sock, ClientSocket):
            conn.sock = ClientSocket.adopt(conn.sock)
        if not conn.initialized and not conn.data_ready:
            # A new connection waits for its first bytes in the poller, not in a
            # thread (gthread would give it a thread for 5 s first): connections that
            # send nothing cost no thread.
            self._wait_in_poller(conn)
            return
        sock = conn.sock
        if sock.spool is None:
            carried = sock.carried
            if conn.parser is not None:
                carried = conn.parser.unreader.take_buffered() + carried
            sock.carried = b""
            sock.spool = RequestSpool(body_limit=body_limit, directory=spool_directory)
            if carried:
                sock.spool.receive(carried)
        if sock.spool.ready:
            self._serve(conn)
        else:
            self._read_in_loop(conn)

    def _wait_in_poller(self, conn) -> None:
        # As gthread does with a connection it defers (finish_request): closed by
        # murder_pending if nothing arrives within the keepalive timeout.
        conn.sock.setblocking(False)
        conn.timeout = time.monotonic() + self.cfg.keepalive
        self.pending_conns.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ,
                             partial(self.on_pending_socket_readable, conn))

    def _read_in_loop(self, conn) -> None:
        conn.sock.setblocking(False)
        self.reading[conn] = None
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))
        # The poller said it is readable (or it has just been accepted): read now
        # rather than a turn of the loop later; a poll is often whole at once.
        self._on_readable(conn, conn.sock)

    def _stop_reading(self, conn) -> None:
        self.reading.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)

    def _on_readable(self, conn, _sock) -> None:
        # Runs in the loop that accepts and dispatches every connection: nothing here
        # may wait, and nothing may escape (it would end the worker process).
        try:
            sock = conn.sock
            try:
                data = sock.recv_available(READ_BYTES)
            except OSError:
                data = b""  # reset
            if data is None:
                return
            if not data:  # the client is gone before its request was whole
                self._stop_reading(conn)
                self._close(conn)
                return
            spool = sock.spool
            spool.receive(data)
            if spool.ready:
                self._stop_reading(conn)
                self._serve(conn)
            elif spool.framing.expect_continue:
                # The client waits for this before it sends the body.
                spool.framing.expect_continue = False
                send_now(sock, CONTINUE)
                sock.continue_sent = True
        except Exception:
            self.log.exception("Error reading a request")
            self._stop_reading(conn)
            self._close(conn)

    def _serve(self, conn) -> None:
        spool = conn.sock.spool
        if spool.discarding is not None:
            if spool.storage_full:
                self.log.warning("507 for a request of %d bytes: the storage volume is "
                                 "full (%s)", spool.received, spool.discarding)
                self._answer(conn, 507, "Insufficient Storage",
                             "The server's storage volume is full; nothing was stored. "
                             "Retry later.")
            else:
                self.log.error("could not spool a request body: %s", spool.discarding)
                self._answer(conn, 500, "Internal Server Error",
                             "The server could not store the request body.")
            return
        if spool.framing.refusal is not None:
            self._answer(conn, *spool.framing.refusal)
            return
        conn.data_ready = True  # its bytes are in the spool, not on the socket
        super().enqueue_req(conn)

    def murder_pending(self):
        """Also, every turn of the loop (at least each second): close the connections
        whose request arrives too slowly, with a 408."""
        super().murder_pending()
        now = time.monotonic()
        expired = [conn for conn in self.reading
                   if conn.sock.spool.expired(now, timeout=ClientSocket.timeout_seconds,
                                              min_rate=ClientSocket.min_rate)]
        for conn in expired:
            self._stop_reading(conn)
            spool = conn.sock.spool
            log_given_up(conn.sock, spool.received, now - spool.first_byte_at)
            self._answer(conn, 408, "Request Timeout", (
                "The request did not arrive in time: nothing for "
                f"{ClientSocket.timeout_seconds:.0f} s, or under "
                f"{ClientSocket.min_rate:.0f} bytes a second "
                "(BATCHGEN_CLIENT_TIMEOUT_SECONDS, BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND)."))

    def _answer(self, conn, status: int, reason: str, message: str) -> None:
        """Answer from the loop and close: the request goes to no thread."""
        send_now(conn.sock, envelope_response(status, reason, message))
        self._close(conn, graceful=True)

    def _close(self, conn, *, graceful: bool = False) -> None:
        self.nr_conns -= 1
        try:
            conn.close(graceful=graceful)
        except OSError:
            pass

    def finish_request(self, conn, fs):
        sock = conn.sock
        if isinstance(sock, ClientSocket) and sock.spool is not None:
            sock.carried = sock.spool.leftover()
            sock.spool.close()
            sock.spool = None
            sock.continue_sent = False
            if sock.carried and not fs.cancelled() and fs.exception() is None \
                    and fs.result() not in (False, None, _DEFER):
                # A pipelined request came with this one: it will not make the
                # socket readable again.
                self.enqueue_req(conn)
                return
        super().finish_request(conn, fs)

    def handle_request(self, req, conn):
        keepalive = super().handle_request(req, conn)
        spool = conn.sock.spool
        # A request served before it was whole (one over its limit, refused unread)
        # or a client given up on mid-body leaves the stream at an unknown place.
        return (keepalive and not conn.sock.gave_up
                and spool is not None and spool.framing.complete)


def send_now(sock: socket.socket, data: bytes) -> None:
    """Send what fits without waiting (a short answer to a client that is not
    reading is dropped, not waited for)."""
    with contextlib.suppress(OSError):
        socket.socket.send(sock, data, socket.MSG_DONTWAIT)
