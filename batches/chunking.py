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
Each endpoint's spec says what a request's prefix key is (serving/endpoints/).

Per model: a chunk holds requests for one model only (its inference workers hold
that model alone), so both chunkers close a chunk where the model changes; the
grouped one sorts by model first, then by prefix.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np

ORDER_ENTRY = array("q").itemsize * 2  # (offset, length) as two int64
# Lines sorted together. Shuffled inputs with up to a few thousand distinct prefixes
# group well within this; memory stays under ~10 MB.
GROUPING_WINDOW = 65_536


class ContiguousChunker:
    """Chunks as byte ranges of the input, in input order."""

    grouped = False

    def __init__(self, chunk_size: int, endpoint: str) -> None:
        self.chunk_size = chunk_size
        # start, end, first line, count, model
        self.chunks: list[tuple[int, int, int, int, str]] = []
        self._open: list | None = None

    def add(self, start: int, end: int, line: int, key: int, model: str = "") -> None:
        if self._open is not None and self._open[4] != model:
            self.chunks.append(tuple(self._open))
            self._open = None
        if self._open is None:
            self._open = [start, end, line, 0, model]
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
        self.chunks: list[tuple[int, int, int, int, str]] = []
        # One window of lines, column by column: cheap to append, sorted with numpy.
        self._keys, self._offsets, self._lengths, self._lines, self._models = (
            array("q"), array("q"), array("q"), array("q"), array("q"))
        self._model_names: dict[str, int] = {}  # model -> its number in _models
        self._written = 0  # entries in the order file
        order_path.parent.mkdir(parents=True, exist_ok=True)
        self._file = order_path.open("wb")

    def add(self, start: int, end: int, line: int, key: int, model: str = "") -> None:
        self._models.append(self._model_names.setdefault(model, len(self._model_names)))
        self._keys.append(key)
        self._offsets.append(start)
        self._lengths.append(end - start)
        self._lines.append(line)
        if len(self._keys) >= self.window:
            self._flush()

    def _flush(self) -> None:
        count = len(self._keys)
        models = np.frombuffer(self._models, dtype=np.int64)
        # lexsort is stable: by model, then prefix key, then input order.
        order = np.lexsort((np.frombuffer(self._keys, dtype=np.int64), models))
        entries = np.empty((count, 2), dtype=np.int64)  # (offset, length) in group order
        entries[:, 0] = np.frombuffer(self._offsets, dtype=np.int64)[order]
        entries[:, 1] = np.frombuffer(self._lengths, dtype=np.int64)[order]
        entries.tofile(self._file)
        first_lines = np.frombuffer(self._lines, dtype=np.int64)[order]
        sorted_models = models[order]
        names = {number: name for name, number in self._model_names.items()}
        # One run of entries per model (sorted, so each model's entries are together).
        run_starts = [0, *(np.flatnonzero(np.diff(sorted_models)) + 1).tolist()]
        for run_start, run_end in zip(run_starts, [*run_starts[1:], count], strict=True):
            model = names[int(sorted_models[run_start])]
            for first in range(run_start, run_end, self.chunk_size):
                size = min(self.chunk_size, run_end - first)
                begin = (self._written + first) * ORDER_ENTRY
                self.chunks.append((begin, begin + size * ORDER_ENTRY,
                                    int(first_lines[first]), size, model))
        self._written += count
        self._keys, self._offsets, self._lengths, self._lines, self._models = (
            array("q"), array("q"), array("q"), array("q"), array("q"))

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
