"""A scripted HTTP server, a fake clock and API objects for the client tests.

`stub` is a real ThreadingHTTPServer on 127.0.0.1 (port 0) in a background thread.
Script it with `stub.on(method, path, *replies)`: replies are served in order and the
last one repeats; a reply is a `Reply` or a callable taking the `Recorded` request.
Every request is recorded in `stub.requests`.

`FakeClock` stands in for `batchgen._clock` (see the autouse `clock` fixture).
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Reply:
    status: int = 200
    json: Any = None
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # Sent piece by piece (connection closed at the end) instead of with a length.
    chunks: Iterable[bytes] | None = None

    def payload(self) -> bytes:
        if self.body is not None:
            return self.body
        if self.json is not None:
            return json.dumps(self.json).encode()
        return b""


def error(status: int, message: str, *, type: str = "invalid_request_error",
          param: str | None = None, code: str | None = None, headers=None) -> Reply:
    """A reply in the OpenAI error envelope."""
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return Reply(status, json=body, headers=headers or {})


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def multipart(self) -> dict[str, tuple[str | None, bytes]]:
        """Form fields by name: (filename or None, content)."""
        head = f"Content-Type: {self.headers['content-type']}\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + self.body)
        fields = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            fields[name] = (part.get_filename(), part.get_payload(decode=True))
        return fields


class StubServer:
    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], list] = {}
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(
            # A short poll keeps shutdown() quick between tests.
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    def on(self, method: str, path: str, *replies: Reply | Callable[[Recorded], Reply]) -> None:
        self.routes[(method, path)] = list(replies)

    def requests_to(self, method: str, path: str) -> list[Recorded]:
        return [r for r in self.requests if (r.method, r.path) == (method, path)]

    def reply_for(self, request: Recorded) -> Reply:
        with self._lock:
            self.requests.append(request)
            queue = self.routes.get((request.method, request.path))
            if not queue:
                return error(404, f"Unknown path: {request.path}")
            reply = queue.pop(0) if len(queue) > 1 else queue[0]
        return reply(request) if callable(reply) else reply

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler_for(stub: StubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in separate writes

        def _serve(self) -> None:
            url = urlsplit(self.path)
            request = Recorded(
                method=self.command,
                path=url.path,
                query=parse_qs(url.query),
                headers={k.lower(): v for k, v in self.headers.items()},
                body=self._read_body(),
            )
            reply = stub.reply_for(request)
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            if reply.chunks is not None:
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in reply.chunks:
                    self.wfile.write(chunk)
                    self.wfile.flush()
                self.close_connection = True
                return
            payload = reply.payload()
            if "Content-Type" not in reply.headers:
                is_json = reply.json is not None
                self.send_header("Content-Type", "application/json" if is_json else "text/plain")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                body = b""
                while size := int(self.rfile.readline().strip(), 16):
                    body += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
                return body
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        do_GET = do_POST = do_DELETE = _serve

        def log_message(self, *args: Any) -> None:  # keep test output quiet
            pass

    return Handler


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def monotonic(self) -> float:
        return self.now


def make_batch(batch_id: str = "batch_1", status: str = "in_progress", *, total: int = 3,
               completed: int = 0, failed: int = 0, **fields: Any) -> dict:
    """A Batch object as the API answers it."""
    batch = {
        "id": batch_id, "object": "batch", "endpoint": "/v1/chat/completions",
        "model": "SmolLM2-135M-Instruct", "input_file_id": "file-in", "output_file_id": None,
        "error_file_id": None, "completion_window": "24h", "status": status,
        "created_at": 1_700_000_000, "in_progress_at": None, "expires_at": 1_700_086_400,
        "finalizing_at": None, "completed_at": None, "failed_at": None,
        "cancelling_at": None, "cancelled_at": None,
        "request_counts": {"total": total, "completed": completed, "failed": failed},
        "error": None, "errors": None, "metadata": {},
        "estimated_completion_at": None, "at_risk": False,
    }
    batch.update(fields)
    return batch


def make_file(file_id: str = "file-in", *, purpose: str = "batch", size: int = 10) -> dict:
    return {"id": file_id, "object": "file", "bytes": size, "created_at": 1_700_000_000,
            "filename": "input.jsonl", "purpose": purpose, "status": "processed",
            "checksum": "sha256:00", "expires_at": None}


def result_line(custom_id: str, content: str = "4") -> bytes:
    line = {
        "id": f"batch_req_{custom_id}", "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": f"req_{custom_id}", "body": {
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }},
        "error": None,
    }
    return json.dumps(line, ensure_ascii=False).encode() + b"\n"


def script_batch_run(stub: StubServer, *, statuses: Iterable[str], output: bytes,
                     batch_id: str = "batch_1", final: dict | None = None) -> None:
    """Script upload -> create -> polls through `statuses` -> output download."""
    statuses = list(statuses)
    stub.on("POST", "/v1/files", Reply(json=make_file()))
    stub.on("POST", "/v1/batches", Reply(json=make_batch(batch_id, "validating")))
    polls = []
    for status in statuses:
        done = 3 if status == "completed" else 1
        batch = make_batch(batch_id, status, completed=done)
        if status == "completed":
            batch["output_file_id"] = "file-out"
        polls.append(Reply(json=batch))
    if final is not None:
        polls[-1] = Reply(json=final)
    stub.on("GET", f"/v1/batches/{batch_id}", *polls)
    stub.on("GET", "/v1/files/file-out/content", Reply(body=output))
