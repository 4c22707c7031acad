"""Where a request ends, found by the web worker's event loop as its bytes arrive
(batchgen_site/request_spool.py), however the bytes are cut; and what it keeps."""

from __future__ import annotations

import pytest

from batchgen_site import request_spool
from batchgen_site.request_spool import HEAD_BYTES, MEMORY_BYTES, RequestSpool

LIMIT = 1_000_000


def spool(tmp_path) -> RequestSpool:
    return RequestSpool(body_limit=lambda path: LIMIT, directory=lambda: tmp_path / "spool")


def fed(tmp_path, data: bytes, piece: int) -> RequestSpool:
    """`data` given to a spool in pieces of `piece` bytes, until it is ready."""
    request = spool(tmp_path)
    for at in range(0, len(data), piece):
        request.receive(data[at:at + piece])
        if request.ready:
            break
    return request


def chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


GET = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
BODY = b'{"input_file_id": "file-1"}' * 10
POST = b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY), BODY)
CHUNKED = (b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           + chunked(BODY, 7))


@pytest.mark.parametrize("piece", [1, 2, 3, 5, 64, 100_000])
@pytest.mark.parametrize("request_bytes", [GET, POST, CHUNKED], ids=["get", "length", "chunked"])
def test_a_request_is_whole_at_its_last_byte_however_it_is_cut(tmp_path, request_bytes, piece):
    # Given / when: a request, then the start of a pipelined one, in small pieces
    request = fed(tmp_path, request_bytes + GET, piece)

    # Then: whole at its end; it reads back byte for byte, the rest is the next one's
    assert request.ready and request.framing.complete
    assert request.read(10**9) == request_bytes
    assert request_bytes + request.leftover() == (request_bytes + GET)[:request.size]


def test_trailers_after_the_last_chunk_belong_to_the_request(tmp_path):
    data = CHUNKED[:-2] + b"X-Checksum: 1\r\n\r\n"

    request = fed(tmp_path, data + GET, 4)

    assert request.framing.complete
    assert request.read(10**9) == data


def test_a_body_larger_than_memory_is_spooled_to_an_unnamed_file(tmp_path):
    # Given: an upload of four times what a request keeps in memory
    body = bytes(range(256)) * (4 * MEMORY_BYTES // 256)
    data = b"POST /v1/files HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    # When: it arrives in pieces
    request = fed(tmp_path, data, 65_536)

    # Then: it went to a file no directory lists, and reads back whole
    assert request.file is not None
    assert list((tmp_path / "spool").iterdir()) == []
    read = b"".join(iter(lambda: request.read(8192), b""))
    assert read == data
    request.close()


@pytest.mark.parametrize("head", [
    b"POST /v1/batches HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n",  # over the limit
    b"POST /v1/batches HTTP/1.1\r\nContent-Length: ten\r\n\r\n",
    b"POST /v1/batches HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST /v1/batches HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"POST /v1/batches HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HELLO\r\n\r\n",
], ids=["over_limit", "length_not_a_number", "both_framings", "gzip", "bad_chunk_size",
        "garbage"])
def test_what_gunicorn_or_the_app_refuses_is_served_as_it_is(tmp_path, head):
    # The thread's parser refuses it from these bytes (400, 413, 501), as before.
    request = fed(tmp_path, head, 1)

    assert request.ready and not request.framing.complete
    assert request.framing.refusal is None


def test_a_head_over_the_limit_is_refused_in_the_loop(tmp_path):
    request = fed(tmp_path, b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * (HEAD_BYTES // 6), 4096)

    assert request.ready
    assert request.framing.refusal[0] == 431


def test_a_client_is_past_its_deadline_when_silent_or_too_slow(tmp_path):
    request = spool(tmp_path)
    start = request.first_byte_at
    request.receive(b"POST /v1/files HTTP/1.1\r\n")

    assert not request.expired(request.last_byte_at + 29, timeout=30, min_rate=1024)
    assert request.expired(request.last_byte_at + 31, timeout=30, min_rate=1024)
    # Trickling: bytes keep coming, but under 1 KiB/s after the first 30 s
    request.last_byte_at = start + 40
    assert request.expired(start + 40.5, timeout=30, min_rate=1024)
    assert not request.expired(start + 40.5, timeout=30, min_rate=0)


def test_a_full_volume_stops_storing_but_the_body_is_still_read_to_its_end(tmp_path,
                                                                          monkeypatch):
    # Given: the volume refuses every write
    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(request_spool.os, "write", full)
    body = b"x" * (2 * MEMORY_BYTES)
    data = b"POST /v1/files HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    # When: an upload arrives
    request = fed(tmp_path, data, 10_000)

    # Then: its end is still found (to answer 507 then), nothing is kept
    assert request.ready and request.storage_full
    assert request.file is None
