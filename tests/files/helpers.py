"""Hand-built multipart bodies and WSGI input streams for upload tests.

The test client's own multipart encoder strips the filename to its basename and
always sends an honest body; these let a test send what a hostile or broken client
would: path filenames, bodies larger than they claim, connections that drop.
"""

from __future__ import annotations

import io

BOUNDARY = "batchgen-test-boundary"
MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"


def multipart(*, fields: dict[str, str] | None = None,
              files: list[tuple[str, str, bytes]] | None = None) -> bytes:
    """A multipart/form-data body: `fields` as text parts, `files` as
    (field name, filename, content) parts."""
    parts: list[bytes] = []
    for name, value in (fields or {}).items():
        parts.append(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
            f"{value}\r\n".encode()
        )
    for name, filename, content in files or []:
        parts.append(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"; '
            f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode()
            + content + b"\r\n"
        )
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


class DroppingInput:
    """A wsgi.input whose client goes away after `fail_after` bytes: reads up to that
    point succeed, the next one raises `error`."""

    def __init__(self, data: bytes, *, fail_after: int, error: BaseException):
        self._buffer = io.BytesIO(data)
        self._fail_after = fail_after
        self._error = error
        self.raised = False

    def _allowed(self, size: int | None) -> int:
        position = self._buffer.tell()
        if position >= self._fail_after:
            self.raised = True
            raise self._error
        remaining = self._fail_after - position
        return remaining if size is None or size < 0 else min(size, remaining)

    def read(self, size: int | None = -1) -> bytes:
        return self._buffer.read(self._allowed(size))

    def readline(self, size: int | None = -1) -> bytes:
        return self._buffer.readline(self._allowed(size))
