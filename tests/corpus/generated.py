"""Corpus inputs a checked-in file cannot sensibly hold: lines of 10 MB and more,
nesting a hundred thousand levels deep, megabyte-long values. Each function
returns the exact bytes of one input (built only when its case runs)."""

from __future__ import annotations

import json

CHAT = "/v1/chat/completions"
MiB = 1024 * 1024


def chat_line(custom_id: str, content: str = "Hello", **fields) -> bytes:
    line = {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": "m", "messages": [{"role": "user", "content": content}]}}
    line.update(fields)
    return json.dumps(line).encode()


def sandwich(middle: bytes) -> bytes:
    """A good line, the case's line (line 2), another good line."""
    return chat_line("ok-1") + b"\n" + middle + b"\n" + chat_line("ok-2") + b"\n"


def long_valid_line(size: int) -> bytes:
    """A valid request of about `size` bytes (a very long user message)."""
    return chat_line("long", "x" * size)


def line_of_10_mb() -> bytes:
    return sandwich(long_valid_line(10 * MiB))


def line_of_17_mb() -> bytes:
    # Over the default BATCHGEN_MAX_LINE_BYTES (16 MiB).
    return sandwich(long_valid_line(17 * MiB))


def unterminated_10_mb_of_garbage() -> bytes:
    """A last line of 10 MB with no newline and no JSON in it."""
    return chat_line("ok-1") + b"\n" + b"\x00\xff garbage " * (MiB + 1)


def deeply_nested_body() -> bytes:
    depth = 100_000
    return sandwich(b'{"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", '
                    b'"body": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}")


def deeply_nested_list_in_messages() -> bytes:
    depth = 50_000
    return sandwich(b'{"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", '
                    b'"body": {"model": "m", "messages": ' + b"[" * depth + b"]" * depth + b"}}")


def url_of_a_megabyte() -> bytes:
    return sandwich(chat_line("x", url="/v1/" + "u" * MiB))


def custom_id_of_a_megabyte() -> bytes:
    return sandwich(chat_line("c" * MiB))


def ten_thousand_bad_lines() -> bytes:
    """More bad lines than errors.data lists: 10,001 lines of broken JSON."""
    return b"{\n" * 10_001


def json_body_nested(depth: int) -> bytes:
    """A batch-create body nested `depth` levels deep."""
    return b'{"input_file_id": "file-x", "metadata": ' + b"[" * depth + b"]" * depth + b"}"


# --- compressed uploads: a good JSON Lines file packed by each common tool --------------


def gzip_of(content: bytes) -> bytes:
    import gzip
    return gzip.compress(content)


def zip_of(content: bytes) -> bytes:
    import io
    import zipfile
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("input.jsonl", content)
    return buffer.getvalue()


def bzip2_of(content: bytes) -> bytes:
    import bz2
    return bz2.compress(content)


def xz_of(content: bytes) -> bytes:
    import lzma
    return lzma.compress(content)


def zstd_of(content: bytes) -> bytes:
    """A zstd frame holding `content` in one raw (stored) block: the standard library
    has no zstd compressor before Python 3.14, and the magic number is what counts."""
    assert len(content) < 1024  # within the 1 KiB window the descriptor below declares
    block_header = (1 | len(content) << 3).to_bytes(3, "little")  # last block, raw
    return b"\x28\xb5\x2f\xfd" + b"\x00\x00" + block_header + content
