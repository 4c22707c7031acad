"""Streaming validation of a batch input file.

One pass over the file in bounded reads: every line is parsed once, checked, and
its byte offsets feed the chunk boundaries. Memory holds only one line at a time,
the 8-byte digests of the custom_ids seen (for uniqueness) and the error list.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from batches.chunking import ContiguousChunker, PrefixGroupingChunker
from batches.input_file import BOM
from serving.endpoints import endpoint_spec
from serving.endpoints.base import EndpointSpec
from serving.line_checks import LineError, shown
from serving.line_schema import DecodeError
from serving.params import OUTPUT_LIMIT_FIELDS

MAX_CUSTOM_ID_LENGTH = 512
# errors.data keeps the first this many bad lines; the error message gives the total.
MAX_LISTED_ERRORS = 10_000


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    start_offset: int
    end_offset: int
    first_line: int
    count: int
    model: str = ""  # the served model whose workers run its requests (adapters: the base)


@dataclass(slots=True)
class ValidationReport:
    total: int = 0
    invalid: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    chunks: list[ChunkSpan] = field(default_factory=list)
    grouped: bool = False  # chunks are ranges of the order file, not of the input
    # The lines' output token limits (the ETA's answer-length prior): their sum over
    # the lines that name one, and how many do.
    output_limit_sum: int = 0
    output_limited: int = 0

    def output_limit_mean(self, default: int | None = None) -> float | None:
        """The mean output limit per request, lines without one at `default`; None
        when some line has none and there is no default."""
        unlimited = self.total - self.output_limited
        if not self.total or (unlimited and not default):
            return None
        return (self.output_limit_sum + unlimited * (default or 0)) / self.total

    def add_error(self, line: int, code: str, message: str, param: str | None = None) -> None:
        self.invalid += 1
        if len(self.errors) < MAX_LISTED_ERRORS:
            self.errors.append({"code": code, "message": message, "line": line, "param": param})

    def add_line_error(self, line: int, error: LineError) -> None:
        self.add_error(line, error.code, error.message, error.param)


def _skip_rest_of_line(fh) -> int:
    """Read past the rest of an over-long line in bounded pieces; bytes skipped."""
    skipped = 0
    while True:
        rest = fh.readline(1024 * 1024)
        skipped += len(rest)
        if not rest or rest.endswith(b"\n"):
            return skipped


def parse_line(raw: bytes, *, endpoint: str) -> dict[str, Any]:
    """Parse and check one input line; raise LineError naming what is wrong."""
    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise LineError("invalid_json", f"Line is not valid JSON: {exc}") from None
    if not isinstance(item, dict):
        raise LineError("invalid_json", "Line must be a JSON object.")
    custom_id = item.get("custom_id")
    if custom_id is None or custom_id == "":
        raise LineError("missing_custom_id", "Missing custom_id.", "custom_id")
    if not isinstance(custom_id, str) or len(custom_id) > MAX_CUSTOM_ID_LENGTH:
        raise LineError("invalid_custom_id",
                        f"custom_id must be a string of at most {MAX_CUSTOM_ID_LENGTH} "
                        "characters.", "custom_id")
    if item.get("method") != "POST":
        raise LineError("invalid_method", "method must be \"POST\".", "method")
    if item.get("url") != endpoint:
        raise LineError("invalid_url",
                        f"url must be {endpoint!r}, the endpoint of this batch "
                        f"(got {shown(item.get('url'))}).", "url")
    body = item.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_body", "body must be a JSON object.", "body")
    check_body(body, endpoint=endpoint)
    return item


def check_body(body: dict[str, Any], *, endpoint: str) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise LineError("invalid_body", "body.model is required (a string).", "body.model")
    endpoint_spec(endpoint).check_body(body)


def model_not_found(model: str, served: Collection[str], endpoint: str) -> LineError:
    return LineError("model_not_found",
                     f"The model {model!r} is not served here for {endpoint}; the models "
                     f"that serve it: {', '.join(repr(name) for name in served)}.",
                     "body.model")


def line_too_long(max_line_bytes: int) -> LineError:
    return LineError("line_too_long", f"Line is longer than the server's limit of "
                     f"{max_line_bytes} bytes (BATCHGEN_MAX_LINE_BYTES).")


def duplicate_custom_id(custom_id: str) -> LineError:
    return LineError("duplicate_custom_id", f"custom_id {custom_id!r} appears more than once.",
                     "custom_id")


def too_many_requests(max_requests: int) -> LineError:
    return LineError("too_many_requests",
                     f"A batch holds at most {max_requests} requests "
                     "(BATCHGEN_MAX_REQUESTS_PER_BATCH); this line is one more.")


def validate_file(path: Path, *, endpoint: str, chunk_size: int, max_line_bytes: int,
                  max_requests: int, order_path: Path | None = None,
                  models: Mapping[str, str] | None = None) -> ValidationReport:
    """Check every line once and cut the valid requests into chunks: byte ranges of
    the input, or, with `order_path`, ranges of an order file that groups requests
    sharing a prompt prefix (batches/chunking.py). Each chunk holds the requests of
    one served model's workers; with `models` (each name that serves `endpoint`, a
    model or a LoRA adapter, to the served model whose workers run it: an adapter's
    lines join its base's chunks), a line naming another model is refused with
    model_not_found, never answered by a model it did not name."""
    report = ValidationReport()
    chunker = (PrefixGroupingChunker(chunk_size, endpoint, order_path)
               if order_path is not None else ContiguousChunker(chunk_size, endpoint))
    try:
        _check_lines(path, report, chunker, endpoint=endpoint, max_line_bytes=max_line_bytes,
                     max_requests=max_requests, models=models)
        chunker.finish()
    except BaseException:
        chunker.discard()
        raise
    if report.invalid:
        chunker.discard()
        return report
    report.grouped = chunker.grouped
    report.chunks = [ChunkSpan(*chunk) for chunk in chunker.chunks]
    return report


def _check_lines(path: Path, report: ValidationReport,
                 chunker: ContiguousChunker | PrefixGroupingChunker, *, endpoint: str,
                 max_line_bytes: int, max_requests: int,
                 models: Mapping[str, str] | None) -> None:
    """The one pass over the file: each line decoded and checked, its error reported,
    or, while no line is bad, its request added to the chunker. The loop runs once
    per line of a file of up to millions: what it calls is looked up once, here."""
    # Uniqueness by 64-bit hashes of the ids, not the ids: flat memory for a million
    # lines (a false duplicate needs a collision, about 1 in 10^7 for 10^6 ids).
    seen: set[int] = set()
    add_to_chunk = chunker.add
    grouped = chunker.grouped
    fast = _fast_decoder(endpoint_spec(endpoint), grouped)
    line_number = 0
    offset = 0
    with path.open("rb") as fh:
        readline = fh.readline
        limit = max_line_bytes + 1
        while raw := readline(limit):
            line_start = offset
            offset += len(raw)
            line_number += 1
            if len(raw) == limit and not raw.endswith(b"\n"):
                offset += _skip_rest_of_line(fh)
                report.add_line_error(line_number, line_too_long(max_line_bytes))
                continue
            if line_number == 1 and raw.startswith(BOM):
                raw = raw[len(BOM):]
                line_start += len(BOM)
            if not raw.strip():
                continue
            try:
                custom_id, model, key, answer_limit = fast(raw)
            except DecodeError:
                answer_limit = None
                try:
                    custom_id, model, key = _check_slowly(raw, endpoint, grouped)
                except LineError as error:
                    report.add_line_error(line_number, error)
                    continue
            if models is not None:
                if model not in models:
                    report.add_line_error(line_number, model_not_found(model, models, endpoint))
                    continue
                model = models[model]
            digest = hash(custom_id)
            if digest in seen:
                report.add_line_error(line_number, duplicate_custom_id(custom_id))
                continue
            seen.add(digest)
            report.total += 1
            if report.total > max_requests:
                report.add_line_error(line_number, too_many_requests(max_requests))
                break
            if not report.invalid:  # once a line is bad nothing will be queued
                add_to_chunk(line_start, offset, line_number, key, model)
                report.output_limit_sum += answer_limit or 0
                report.output_limited += bool(answer_limit)


def _fast_decoder(spec: EndpointSpec, grouped: bool) -> Callable[[bytes], tuple]:
    """The fast path: a line decoded by the endpoint's strict types (DecodeError if
    they refuse it), as (custom_id, model, prefix key, output token limit or None)."""
    decode, key_of_line = spec.decoder.decode, spec.prefix_key_of_line
    # The output limit's names, the endpoint's own first.
    own_limit, *other_limits = dict.fromkeys((spec.output_limit_field, *OUTPUT_LIMIT_FIELDS))

    def fast(raw: bytes) -> tuple[str, str, Any, int | None]:
        line = decode(raw)
        body = line.body
        return (line.custom_id, body.model, key_of_line(line) if grouped else 0,
                getattr(body, own_limit, None) or _output_limit(body, other_limits))

    return fast


def _output_limit(body: Any, fields: list[str]) -> int | None:
    """A decoded body's output token limit, under the first of `fields` it has."""
    for name in fields:
        value = getattr(body, name, None)
        if value:
            return value
    return None


def _check_slowly(raw: bytes, endpoint: str, grouped: bool) -> tuple[str, str, Any]:
    """The slow path, for a line the strict types refused: it names the problem
    (LineError), or accepts what they did not (a float 1.0 for n, say). The line's
    custom_id, model and prefix key."""
    item = parse_line(raw, endpoint=endpoint)
    key = endpoint_spec(endpoint).prefix_key(item["body"]) if grouped else 0
    return item["custom_id"], item["body"]["model"], key
