"""A real local webhook receiver: an HTTP server on a thread, for the webhook tests.
It answers from a script of status codes (then 200), records every request, and
can be taken down (connection refused) and brought back on the same port."""

from __future__ import annotations

import threading
from collections import Counter
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
    def __init__(self, *, answers: list[int] | None = None) -> None:
        self.port = free_port()
        self.answers = list(answers or [])  # status codes to answer first, in order
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

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
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self._server = _Server(("127.0.0.1", self.port), Handler)
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
