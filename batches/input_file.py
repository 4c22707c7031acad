"""A batch's input file as both sides read it: the byte-order mark that may open it,
and a chunk's requests read back by the inference worker that runs them. The lines
were checked once, when the batch was validated (batches/validation.py), so here they
are only parsed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from batches.chunking import read_order

BOM = b"\xef\xbb\xbf"


def iter_lines(path: Path, *, start: int = 0, end: int | None = None,
               max_line_bytes: int) -> Iterator[tuple[int, int, bytes | None]]:
    """(line_number_offset_from_start, byte_offset_after_line, raw_line or None if
    the line is longer than max_line_bytes). Blank lines are yielded too."""
    with path.open("rb") as fh:
        fh.seek(start)
        offset = start
        number = 0
        while end is None or offset < end:
            raw = fh.readline(max_line_bytes + 1)
            if not raw:
                break
            number += 1
            offset += len(raw)
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                # Too long: skip the rest of it without holding it in memory.
                while True:
                    rest = fh.readline(1024 * 1024)
                    offset += len(rest)
                    if not rest or rest.endswith(b"\n"):
                        break
                yield number, offset, None
                continue
            yield number, offset, raw


def read_chunk(path: Path, *, start: int, end: int, max_line_bytes: int,
               order_path: Path | None = None) -> list[dict[str, Any]]:
    """The requests of one chunk, already validated: [start, end) in bytes of the
    input, or of the order file when the batch's chunks are prefix-grouped."""
    if order_path is not None:
        requests = []
        with path.open("rb") as fh:
            for offset, length in read_order(order_path, start, end):
                fh.seek(offset)
                requests.append(orjson.loads(fh.read(length)))
        return requests
    requests = []
    for _, _, raw in iter_lines(path, start=start, end=end, max_line_bytes=max_line_bytes):
        if raw is None:
            continue
        if start == 0 and raw.startswith(BOM):
            raw = raw[len(BOM):]
        start = -1  # the BOM can only open the file
        if raw.strip():
            requests.append(orjson.loads(raw))
    return requests
