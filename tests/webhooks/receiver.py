"""A real local webhook receiver: an HTTP server on a thread, for the webhook tests.
It answers from a script of status codes (then 200), records every request, and
can be taken down (connection refused) and brought back on the same port. With a
TLS context it is an https receiver; with `redirect_to` its 3xx answers send there.

FakeDns answers the tests' host names in place of a DNS server."""

from __future__ import annotations

import socket
import ssl
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.e2e.harness import free_port


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 128  # the default 5 resets a burst of concurrent senders


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]


class Receiver:
    def __init__(self, *, answers: list[int] | None = None,
                 tls: ssl.SSLContext | None = None, redirect_to: str | None = None) -> None:
        self.port = free_port()
        self.answers = list(answers or [])  # status codes to answer first, in order
        self.tls = tls
        self.redirect_to = redirect_to  # the Location of its 3xx answers
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return self.url_for("127.0.0.1")

    def url_for(self, host: str) -> str:
        """Its URL under a host name (that FakeDns resolves to 127.0.0.1)."""
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver._lock:
                    status = receiver.answers.pop(0) if receiver.answers else 200
                    receiver.received.append(Received(
                        {k.lower(): v for k, v in self.headers.items()}, body, status))
                self.send_response(status)
                if 300 <= status < 400 and receiver.redirect_to:
                    self.send_header("location", receiver.redirect_to)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self._server = _Server(("127.0.0.1", self.port), Handler)
        if self.tls is not None:
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Down: the port refuses connections until start() again."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def delivered(self) -> list[Received]:
        """The requests it answered 2xx."""
        with self._lock:
            return [r for r in self.received if 200 <= r.answered < 300]

    def delivered_twice(self) -> list[str]:
        counts = Counter(r.webhook_id for r in self.delivered())
        return sorted(i for i, n in counts.items() if n > 1)


Answer = list[str] | Callable[[], list[str]]


class FakeDns:
    """socket.getaddrinfo for the tests' names: `names` maps a host to its addresses
    (or to a function giving them at each lookup: DNS rebinding), *.example.com
    is a public address by default, and anything else (address literals,
    localhost, the services' hosts) is resolved as the system does. `lookups`
    lists the names asked, in order."""

    PUBLIC = "93.184.215.14"  # example.com's

    def __init__(self) -> None:
        self.names: dict[str, Answer] = {}
        self.lookups: list[str] = []
        self._real = socket.getaddrinfo

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(socket, "getaddrinfo", self.getaddrinfo)

    def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002
        name = host.decode() if isinstance(host, bytes) else host
        answer = self.names.get(name)
        if answer is None and name and (name == "example.com" or
                                        name.endswith(".example.com")):
            answer = [self.PUBLIC]
        if answer is None:
            return self._real(host, port, family, type, proto, flags)
        self.lookups.append(name)
        addresses = answer() if callable(answer) else answer
        return [(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM,
                 socket.IPPROTO_TCP, "", (address, int(port or 0), 0, 0) if ":" in address
                 else (address, int(port or 0)))
                for address in addresses]
