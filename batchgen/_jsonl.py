"""JSONL read from a byte stream, line by line, never the whole file at once."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from batchgen.errors import BatchGenError


def split_lines(chunks: Iterable[bytes], *, keep_partial: bool = True) -> Iterator[bytes]:
    """Lines split on b"\\n" only, without it. (httpx's iter_lines splits like
    str.splitlines, which also breaks at U+2028 and friends, and those may appear raw
    inside JSON strings.) A trailing unterminated line is yielded only if
    `keep_partial`."""
    pending: list[bytes] = []
    for chunk in chunks:
        *lines, rest = chunk.split(b"\n")
        if lines:
            lines[0] = b"".join(pending) + lines[0]
            pending = []
            yield from lines
        if rest:
            pending.append(rest)
    if pending and keep_partial:
        yield b"".join(pending)


def parse_lines(lines: Iterable[bytes], source: str) -> Iterator[dict]:
    for number, line in enumerate(lines, 1):
        if line.strip():
            yield parse_line(line, f"{source}: line {number}")


def parse_line(line: bytes, where: str) -> dict:
    try:
        return json.loads(line)
    except ValueError as exc:
        raise BatchGenError(f"{where} is not valid JSON: {exc}") from exc
