"""A batch's token usage, as OpenAI's Batch object shows it (`usage`).

While a batch runs, workers add the usage of the results they wrote to the batch row
with their progress flushes (batches.chunks.chunks_flush), never per request. At
finalization the figures are recomputed from the output file in the same pass that
checksums it, so the final `usage` is exactly the sum over the output lines'
`response.body.usage`, whatever crashes and redeliveries happened on the way (a
result a dead worker wrote but never flushed is counted there, and only there).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from pathlib import Path

import orjson


@dataclass(slots=True)
class Usage:
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    # Not a usage figure the API shows: the output token limits (max_tokens, or the
    # batch's max_decoding_length) of the requests these results answer, summed
    # (Batch.output_limit_done, for the ETA: batches/estimates.py). The worker adds
    # it; an output file cannot tell it.
    output_limit: int = 0

    def add_body(self, body: dict | None) -> None:
        """Add one response body's `usage` (chat, completion or embedding: an
        embedding has prompt tokens only; a Response counts input and output tokens)."""
        usage = (body or {}).get("usage") or {}
        self.input_tokens += usage.get("prompt_tokens") or usage.get("input_tokens") or 0
        self.output_tokens += usage.get("completion_tokens") or usage.get("output_tokens") or 0
        inputs = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        self.cached_tokens += inputs.get("cached_tokens") or 0
        outputs = (usage.get("completion_tokens_details") or usage.get("output_tokens_details")
                   or {})
        self.reasoning_tokens += outputs.get("reasoning_tokens") or 0

    def __iadd__(self, other: Usage) -> Usage:
        for name in _FIGURES:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    def __bool__(self) -> bool:
        return any(getattr(self, name) for name in _FIGURES)

    def as_api(self) -> dict:
        """The shape of openai.types.BatchUsage."""
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


_FIGURES = tuple(f.name for f in fields(Usage))
# The usage the API shows: each a Batch column and a KeyUsage one (batches.quotas).
USAGE_FIELDS = tuple(name for name in _FIGURES if name != "output_limit")
# The Batch columns that hold each figure.
USAGE_COLUMNS = {name: f"usage_{name}" for name in USAGE_FIELDS}



def batch_usage(batch) -> Usage:
    """The figures a Batch row holds now."""
    return Usage(**{name: getattr(batch, column) for name, column in USAGE_COLUMNS.items()})


_READ_BLOCK = 1 << 20


class OutputFigures:
    """Size, sha256 and summed usage of an output, fed its bytes in order (a file read
    back, or an object store's output as it is composed, files.segments.compose).

    Only lines holding a usage are parsed (an error line has none); the digest is
    fed whole blocks, so the parse is the only per-line cost. Measured: 2.4 s for a
    million 785-byte chat lines, against 0.4 s for the hash alone."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.usage = Usage()
        self.size = 0
        self._tail = b""

    def update(self, block: bytes) -> None:
        self.digest.update(block)
        self.size += len(block)
        lines = (self._tail + block).split(b"\n")
        self._tail = lines.pop()
        for line in lines:
            _add_line(self.usage, line)

    def result(self) -> tuple[int, str, Usage]:
        _add_line(self.usage, self._tail)  # empty after repair_tail, which finalization runs
        self._tail = b""
        return self.size, self.digest.hexdigest(), self.usage


def output_digest_and_usage(path: Path) -> tuple[int, str, Usage]:
    """Size, sha256 and summed usage of an output file, in one streaming read."""
    figures = OutputFigures()
    with path.open("rb") as fh:
        while block := fh.read(_READ_BLOCK):
            figures.update(block)
    return figures.result()


def _add_line(usage: Usage, line: bytes) -> None:
    if b'"usage"' not in line:
        return
    try:
        item = orjson.loads(line)
    except orjson.JSONDecodeError:
        return
    response = item.get("response") if isinstance(item, dict) else None
    if isinstance(response, dict):
        usage.add_body(response.get("body"))
