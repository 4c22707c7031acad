"""How validated requests are cut into chunks.

Contiguous (prefix grouping off): a chunk is a byte range of the input file.

Prefix-grouped (the default): requests that share a prompt prefix — the same system
prompt and few-shot turns — are put in the same chunks, so they reach the engine
together and vLLM's prefix cache computes the shared part once. Validation sorts each
window of lines by prefix key (stable, so input order holds within a group) and
writes the sorted (offset, length) pairs to an order file beside the upload; a chunk
is then a range of that file. Windows bound the memory: a window holds a few tens of
thousands of small tuples, never request bodies. Per-request results do not change:
order in the output was never guaranteed, and each line still carries its custom_id.
"""

from __future__ import annotations

import hashlib
from array import array
from pathlib import Path
from typing import Any

import orjson

CHAT = "/v1/chat/completions"
ORDER_ENTRY = array("q").itemsize * 2  # (offset, length) as two int64
# Lines sorted together. Shuffled inputs with up to a few thousand distinct prefixes
# group well within this; memory stays under ~10 MB.
GROUPING_WINDOW = 65_536
# Without earlier turns, the first characters of the only message or of the prompt
# stand for its prefix.
PREFIX_CHARS = 512


def prefix_key(body: dict[str, Any], endpoint: str) -> bytes:
    if endpoint == CHAT:
        messages = body.get("messages") or []
        shared = messages[:-1] if len(messages) > 1 else [
            {"role": m.get("role"), "content": str(m.get("content"))[:PREFIX_CHARS]}
            for m in messages]
        data = orjson.dumps(shared, option=orjson.OPT_SORT_KEYS)
    else:
        prompt = body.get("prompt")
        data = (prompt if isinstance(prompt, str) else orjson.dumps(prompt))[:PREFIX_CHARS]
        data = data.encode() if isinstance(data, str) else data
    return hashlib.blake2b(data, digest_size=8).digest()


class ContiguousChunker:
    """Chunks as byte ranges of the input, in input order."""

    grouped = False

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self.chunks: list[tuple[int, int, int, int]] = []  # start, end, first line, count
        self._open: list[int] | None = None

    def add(self, *, start: int, end: int, line: int, item: dict, endpoint: str) -> None:
        if self._open is None:
            self._open = [start, end, line, 0]
        self._open[1] = end
        self._open[3] += 1
        if self._open[3] == self.chunk_size:
            self.chunks.append(tuple(self._open))
            self._open = None

    def finish(self) -> None:
        if self._open is not None:
            self.chunks.append(tuple(self._open))
            self._open = None

    def discard(self) -> None:
        return None


class PrefixGroupingChunker:
    """Chunks as ranges of an order file whose entries are grouped by prefix."""

    grouped = True

    def __init__(self, chunk_size: int, order_path: Path, window: int = GROUPING_WINDOW):
        self.chunk_size = chunk_size
        self.order_path = order_path
        self.window = window
        self.chunks: list[tuple[int, int, int, int]] = []
        self._pending: list[tuple[bytes, int, int, int]] = []  # key, offset, length, line
        self._written = 0  # entries in the order file
        order_path.parent.mkdir(parents=True, exist_ok=True)
        self._file = order_path.open("wb")

    def add(self, *, start: int, end: int, line: int, item: dict, endpoint: str) -> None:
        self._pending.append((prefix_key(item["body"], endpoint), start, end - start, line))
        if len(self._pending) >= self.window:
            self._flush()

    def _flush(self) -> None:
        self._pending.sort(key=lambda entry: entry[0])  # stable: input order within a group
        for first in range(0, len(self._pending), self.chunk_size):
            group = self._pending[first:first + self.chunk_size]
            entries = array("q")
            for _, offset, length, _ in group:
                entries.extend((offset, length))
            entries.tofile(self._file)
            begin = self._written * ORDER_ENTRY
            self._written += len(group)
            self.chunks.append((begin, self._written * ORDER_ENTRY, group[0][3], len(group)))
        self._pending = []

    def finish(self) -> None:
        if self._pending:
            self._flush()
        self._file.close()

    def discard(self) -> None:
        self._file.close()
        self.order_path.unlink(missing_ok=True)


def read_order(order_path: Path, start: int, end: int) -> list[tuple[int, int]]:
    """The (offset, length) entries of [start, end) of an order file."""
    entries = array("q")
    with order_path.open("rb") as fh:
        fh.seek(start)
        entries.frombytes(fh.read(end - start))
    return list(zip(entries[0::2], entries[1::2], strict=True))
