"""How validated requests are cut into chunks.

Contiguous (prefix grouping off): a chunk is a byte range of the input file.

Prefix-grouped (the default): requests that share a prompt prefix — the same system
prompt, which few-shot turns follow — are put in the same chunks, so they reach the engine
together and vLLM's prefix cache computes the shared part once. Validation sorts each
window of lines by prefix key (stable, so input order holds within a group) and
writes the sorted (offset, length) pairs to an order file beside the upload; a chunk
is then a range of that file. Windows bound the memory: a window holds a few tens of
thousands of small tuples, never request bodies. Per-request results do not change:
order in the output was never guaranteed, and each line still carries its custom_id.
"""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

CHAT = "/v1/chat/completions"
ORDER_ENTRY = array("q").itemsize * 2  # (offset, length) as two int64
# Lines sorted together. Shuffled inputs with up to a few thousand distinct prefixes
# group well within this; memory stays under ~10 MB.
GROUPING_WINDOW = 65_536
# Without earlier turns, the first characters of the only message or of the prompt
# stand for its prefix.
PREFIX_CHARS = 512


def prefix_key_of_line(line) -> int:
    """prefix_key for a line decoded by batches.line_schema (the fast path)."""
    body = line.body
    if hasattr(body, "messages"):
        first = body.messages[0]
        content = first.content
        if not isinstance(content, str):
            # As the slow path sees them: the parts as dicts, not as msgspec structs.
            content = str(msgspec.to_builtins(content))
        if len(body.messages) == 1:
            content = content[:PREFIX_CHARS]
        return hash((first.role, content))
    prompt = body.prompt
    return hash(prompt[:PREFIX_CHARS] if isinstance(prompt, str) else str(prompt)[:PREFIX_CHARS])


def prefix_key(body: dict[str, Any], endpoint: str) -> int:
    """A key equal for requests that likely share a prefix: for chat, the first
    message (the system prompt, which few-shot turns follow) when more come after it;
    otherwise the first characters of the only message or of the prompt. Keys are
    compared only within one validation run, so Python's own hash serves, and it is
    cached on each string."""
    if endpoint == CHAT:
        messages = body["messages"]
        first = messages[0]
        content = first.get("content")
        if not isinstance(content, str):
            content = str(content)
        if len(messages) == 1:
            content = content[:PREFIX_CHARS]
        return hash((first.get("role"), content))
    prompt = body.get("prompt")
    return hash(prompt[:PREFIX_CHARS] if isinstance(prompt, str) else str(prompt)[:PREFIX_CHARS])


class ContiguousChunker:
    """Chunks as byte ranges of the input, in input order."""

    grouped = False

    def __init__(self, chunk_size: int, endpoint: str) -> None:
        self.chunk_size = chunk_size
        self.chunks: list[tuple[int, int, int, int]] = []  # start, end, first line, count
        self._open: list[int] | None = None

    def add(self, start: int, end: int, line: int, key: int) -> None:
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

    def __init__(self, chunk_size: int, endpoint: str, order_path: Path,
                 window: int = GROUPING_WINDOW):
        self.chunk_size = chunk_size
        self.endpoint = endpoint
        self.order_path = order_path
        self.window = window
        self.chunks: list[tuple[int, int, int, int]] = []
        # One window of lines, column by column: cheap to append, sorted with numpy.
        self._keys, self._offsets, self._lengths, self._lines = (
            array("q"), array("q"), array("q"), array("q"))
        self._written = 0  # entries in the order file
        order_path.parent.mkdir(parents=True, exist_ok=True)
        self._file = order_path.open("wb")

    def add(self, start: int, end: int, line: int, key: int) -> None:
        self._keys.append(key)
        self._offsets.append(start)
        self._lengths.append(end - start)
        self._lines.append(line)
        if len(self._keys) >= self.window:
            self._flush()

    def _flush(self) -> None:
        count = len(self._keys)
        order = np.argsort(np.frombuffer(self._keys, dtype=np.int64), kind="stable")
        entries = np.empty((count, 2), dtype=np.int64)  # (offset, length) in group order
        entries[:, 0] = np.frombuffer(self._offsets, dtype=np.int64)[order]
        entries[:, 1] = np.frombuffer(self._lengths, dtype=np.int64)[order]
        entries.tofile(self._file)
        first_lines = np.frombuffer(self._lines, dtype=np.int64)[order]
        for first in range(0, count, self.chunk_size):
            size = min(self.chunk_size, count - first)
            begin = (self._written + first) * ORDER_ENTRY
            self.chunks.append((begin, begin + size * ORDER_ENTRY, int(first_lines[first]), size))
        self._written += count
        self._keys, self._offsets, self._lengths, self._lines = (
            array("q"), array("q"), array("q"), array("q"))

    def finish(self) -> None:
        if self._keys:
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
