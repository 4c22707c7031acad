"""A request read whole before a thread serves it (batchgen_site/gunicorn_worker.py).

The web worker's event loop reads each request as its bytes arrive, without blocking,
into a `RequestSpool`, and gives it to a thread only once it is complete: a thread is
never held by a client that is slow to send. `Framing` finds where a request ends
(its head, then a `Content-Length` or `Transfer-Encoding: chunked` body) without
judging it: gunicorn's parser, in the thread, still parses and refuses what it
refuses today, from the spooled bytes.

A body is kept in memory up to `MEMORY_BYTES`, beyond in an unnamed temporary file on
the storage volume (an upload may be 10 GiB; /tmp may be a small tmpfs), as Django's
ASGI handler spools one. The thread reads the file back once; the space it has read
is freed as it goes (`punch_hole`), so an upload takes its size of the volume once,
not twice, and memory stays flat.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# What a request may keep in memory while it is read (its head and a small body:
# a batch create is about 100 bytes). 1,000 connections a process (gunicorn's
# worker_connections) then hold at most 64 MiB, whatever they send.
MEMORY_BYTES = 64 * 1024
# The longest head read in the loop. gunicorn allows more in theory (100 fields of
# 8 KiB); clients send a few KiB, and a longer head would be read in a thread.
HEAD_BYTES = 64 * 1024
# The longest chunk-size line or trailer section (gunicorn's own bounds).
CHUNK_LINE_BYTES = 8190
TRAILER_BYTES = 8190 * 32
# Read space of a spool file is given back to the volume in steps of this much.
PUNCH_STEP = 8 * 1024 * 1024

STORAGE_FULL = (errno.ENOSPC, errno.EDQUOT)


class Framing:
    """Where an HTTP/1.x request ends, found from its bytes as they arrive.

    `feed(data)` returns None while the request goes on past `data`, or how many
    bytes of `data` belong to it once its end is found (the rest are the next
    request's). Then `complete` says whether the request is all there; it is not
    when its framing is one gunicorn refuses or one not read in the loop (a body
    over `body_limit`): gunicorn then answers it as before, from the bytes so far.
    `refusal` is an answer the loop gives itself: (431, ...) for a head over
    HEAD_BYTES.
    """

    def __init__(self, body_limit: Callable[[bytes], int]):
        self.body_limit = body_limit
        self.state = "head"
        self.head = bytearray()
        self.complete = False
        self.refusal: tuple[int, str, str] | None = None
        self.expect_continue = False
        self.remaining = 0  # body bytes (or chunk bytes) still to come
        self.decoded = 0  # a chunked body's bytes so far
        self.limit = 0
        self.line = bytearray()  # a chunk-size line, a chunk's CRLF, the trailers

    @property
    def done(self) -> bool:
        return self.state == "done"

    def feed(self, data: bytes) -> int | None:
        at = 0
        while at < len(data) and self.state != "done":
            at = getattr(self, f"_{self.state}")(data, at)
        if self.state == "done":
            return at
        return None

    def _finish(self, at: int, *, complete: bool) -> int:
        self.state, self.complete = "done", complete
        return at

    def _head(self, data: bytes, at: int) -> int:
        searched = max(0, len(self.head) - 3)
        self.head += data[at:]
        end = self.head.find(b"\r\n\r\n", searched)
        if end < 0:
            if len(self.head) > HEAD_BYTES:
                self.refusal = (431, "Request Header Fields Too Large",
                                f"The request's head is over {HEAD_BYTES} bytes.")
                return self._finish(len(data), complete=False)
            return len(data)
        taken = end + 4 - (len(self.head) - (len(data) - at))
        del self.head[end + 4:]
        return self._body_kind(at + taken)

    def _body_kind(self, at: int) -> int:
        lines = bytes(self.head[:-4]).split(b"\r\n")
        request_line = lines[0].split(b" ")
        if len(request_line) != 3:
            return self._finish(at, complete=False)  # gunicorn's 400
        target, version = request_line[1], request_line[2]
        lengths, codings, expect = [], [], b""
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                return self._finish(at, complete=False)
            name = name.strip().lower()
            if name == b"content-length":
                lengths.append(value.strip())
            elif name == b"transfer-encoding":
                codings += [c.strip().lower() for c in value.split(b",")]
            elif name == b"expect":
                expect = value.strip().lower()
        self.limit = self.body_limit(target.split(b"?", 1)[0])
        if codings:
            if lengths or codings[-1] != b"chunked" or any(c != b"chunked" for c in codings):
                # Both framings, or a coding gunicorn or the app refuses (400, 501).
                return self._finish(at, complete=False)
            self.state = "chunk_size"
        elif lengths:
            if len(set(lengths)) != 1 or not lengths[0].isdigit():
                return self._finish(at, complete=False)
            self.remaining = int(lengths[0])
            if self.remaining > self.limit:
                # Refused by its length (413) without the body being read.
                return self._finish(at, complete=False)
            if not self.remaining:
                return self._finish(at, complete=True)
            self.state = "body"
        else:
            return self._finish(at, complete=True)  # no body (RFC 9112 6.3)
        self.expect_continue = expect == b"100-continue" and version == b"HTTP/1.1"
        return at

    def _body(self, data: bytes, at: int) -> int:
        taken = min(self.remaining, len(data) - at)
        self.remaining -= taken
        if not self.remaining:
            return self._finish(at + taken, complete=True)
        return at + taken

    def _chunk_size(self, data: bytes, at: int) -> int:
        searched = max(0, len(self.line) - 1)
        self.line += data[at:]
        end = self.line.find(b"\r\n", searched)
        if end < 0:
            if len(self.line) > CHUNK_LINE_BYTES:
                return self._finish(len(data), complete=False)
            return len(data)
        taken = end + 2 - (len(self.line) - (len(data) - at))
        size = bytes(self.line[:end]).split(b";", 1)[0].rstrip(b" \t")
        self.line.clear()
        at += taken
        if not size or any(c not in b"0123456789abcdefABCDEF" for c in size):
            return self._finish(at, complete=False)  # gunicorn's 400
        self.remaining = int(size, 16)
        if not self.remaining:
            self.state = "trailers"
            return at
        self.state = "chunk_data"
        return at

    def _chunk_data(self, data: bytes, at: int) -> int:
        taken = min(self.remaining, len(data) - at)
        self.remaining -= taken
        self.decoded += taken
        if self.decoded > self.limit:
            # Over the limit: the application refuses it (413) from what has arrived.
            return self._finish(at + taken, complete=False)
        if not self.remaining:
            self.state = "chunk_end"
        return at + taken

    def _chunk_end(self, data: bytes, at: int) -> int:
        needed = 2 - len(self.line)
        self.line += data[at:at + needed]
        at += min(needed, len(data) - at)
        if len(self.line) < 2:
            return at
        ok = self.line == b"\r\n"
        self.line.clear()
        if not ok:
            return self._finish(at, complete=False)  # gunicorn's 400
        self.state = "chunk_size"
        return at

    def _trailers(self, data: bytes, at: int) -> int:
        searched = max(0, len(self.line) - 3)
        self.line += data[at:]
        if self.line[:2] == b"\r\n":
            end = 2
        else:
            end = self.line.find(b"\r\n\r\n", searched)
            if end < 0:
                if len(self.line) > TRAILER_BYTES:
                    return self._finish(len(data), complete=False)
                return len(data)
            end += 4
        taken = end - (len(self.line) - (len(data) - at))
        self.line.clear()
        return self._finish(at + taken, complete=True)


class RequestSpool:
    """One request's bytes: written by the event loop as they arrive, then read by
    the thread that serves it (never both at once). Also the clocks of its reading."""

    def __init__(self, *, body_limit: Callable[[bytes], int],
                 directory: Callable[[], Path]):
        self.framing = Framing(body_limit)
        self.directory = directory
        self.memory = bytearray()
        self.file = None
        self.size = 0  # bytes stored
        self.end: int | None = None  # where the request ends in them, once found
        self.read_at = 0
        self.punched = 0
        self.discarding: OSError | None = None  # the write error that stopped storing
        # The clocks start when the loop starts reading (the connection had
        # something to read then).
        self.first_byte_at = self.last_byte_at = time.monotonic()
        self.received = 0

    @property
    def ready(self) -> bool:
        """Whether the loop is done with it: whole, or to be answered as it is."""
        return self.framing.done

    def receive(self, data: bytes) -> None:
        """Bytes that arrived from the client, in order."""
        self.last_byte_at = time.monotonic()
        self.received += len(data)
        taken = self.framing.feed(data)
        if taken is not None and self.framing.complete:
            # What follows is the next request's. A request served before it is
            # whole (complete False) is served all that has arrived of it.
            self.end = self.size + taken
        self._store(data)

    def leftover(self) -> bytes:
        """What arrived after the end of the request: the start of the next one."""
        if self.end is None or self.end >= self.size or self.discarding:
            return b""
        return self._read_at(self.end, self.size - self.end)

    def _store(self, data: bytes) -> None:
        if self.discarding is not None:
            self.size += len(data)
            return
        try:
            if self.file is None and self.size + len(data) > MEMORY_BYTES:
                self.file = tempfile.TemporaryFile(dir=self._directory())
                self._write(bytes(self.memory))
                self.memory = bytearray()
            if self.file is None:
                self.memory += data
            else:
                self._write(data)
        except OSError as exc:
            # The body is still read to its end (so the client gets the answer),
            # not kept; the loop answers it.
            self.discarding = exc
            self.close()
        self.size += len(data)

    def _directory(self) -> Path:
        path = self.directory()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self.file.fileno(), view)
            view = view[written:]

    @property
    def storage_full(self) -> bool:
        return self.discarding is not None and self.discarding.errno in STORAGE_FULL

    # --- the thread's side --------------------------------------------------------------

    def unread(self) -> int:
        end = self.size if self.end is None else self.end
        return max(end - self.read_at, 0)

    def read(self, size: int) -> bytes:
        size = min(size, self.unread())
        if size <= 0:
            return b""
        data = self._read_at(self.read_at, size)
        self.read_at += len(data)
        if self.file is not None and self.read_at - self.punched >= PUNCH_STEP:
            punch_hole(self.file.fileno(), self.punched, self.read_at - self.punched)
            self.punched = self.read_at
        return data

    def _read_at(self, offset: int, size: int) -> bytes:
        if self.file is None:
            return bytes(self.memory[offset:offset + size])
        return os.pread(self.file.fileno(), size, offset)

    def close(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None

    # --- the loop's deadlines -------------------------------------------------------------

    def expired(self, now: float, *, timeout: float, min_rate: float) -> bool:
        """Whether the client is past its deadline: nothing for `timeout` seconds, or,
        after the first `timeout` seconds, under `min_rate` bytes a second on average
        (BATCHGEN_CLIENT_TIMEOUT_SECONDS, BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND)."""
        if now - self.last_byte_at > timeout:
            return True
        return bool(min_rate) and now > self.first_byte_at + timeout + self.received / min_rate


_libc = None


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Give the space of [offset, offset + length) of a file back to the volume
    (fallocate PUNCH_HOLE); nothing where the call or the filesystem lacks it."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                        ctypes.c_int64]
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return
    FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02  # noqa: N806 - linux/falloc.h
    _libc.fallocate(fd, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, offset, length)
