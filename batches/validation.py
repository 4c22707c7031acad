"""Streaming validation of a batch input file.

One pass over the file in bounded reads: every line is parsed once, checked, and
its byte offsets feed the chunk boundaries. Memory holds only one line at a time,
the 8-byte digests of the custom_ids seen (for uniqueness) and the error list.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from batches.chunking import (
    ContiguousChunker,
    PrefixGroupingChunker,
    prefix_key,
    prefix_key_of_line,
    read_order,
)
from batches.line_schema import DECODERS, DecodeError
from batches.params import SAMPLING_BOUNDS

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
BOM = b"\xef\xbb\xbf"
MAX_CUSTOM_ID_LENGTH = 512
# errors.data keeps the first this many bad lines; the error message gives the total.
MAX_LISTED_ERRORS = 10_000


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    start_offset: int
    end_offset: int
    first_line: int
    count: int


@dataclass(slots=True)
class ValidationReport:
    total: int = 0
    invalid: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    chunks: list[ChunkSpan] = field(default_factory=list)
    grouped: bool = False  # chunks are ranges of the order file, not of the input

    def add_error(self, line: int, code: str, message: str, param: str | None = None) -> None:
        self.invalid += 1
        if len(self.errors) < MAX_LISTED_ERRORS:
            self.errors.append({"code": code, "message": message, "line": line, "param": param})


class LineError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


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
                        f"(got {_shown(item.get('url'))}).", "url")
    body = item.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_body", "body must be a JSON object.", "body")
    check_body(body, endpoint=endpoint)
    return item


def _shown(value: Any, limit: int = 80) -> str:
    """A value quoted in an error message, cut short: a line may be megabytes, and
    up to MAX_LISTED_ERRORS messages are kept on the batch."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def check_body(body: dict[str, Any], *, endpoint: str) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise LineError("invalid_body", "body.model is required (a string).", "body.model")
    if endpoint == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise LineError("invalid_body", "body.messages must be a non-empty list.",
                            "body.messages")
        for index, message in enumerate(messages):
            check_message(message, where=f"body.messages[{index}]")
    else:
        prompt = body.get("prompt")
        valid = isinstance(prompt, str) or (
            isinstance(prompt, list) and prompt
            and all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in prompt)
        )
        if not valid:
            raise LineError("invalid_body",
                            "body.prompt must be a string or a non-empty list.", "body.prompt")
    check_sampling(body, prefix="body.")


# OpenAI's chat roles. Its deprecated `function` role is not taken: `tool` replaced it.
ROLES = ("system", "developer", "user", "assistant", "tool")
_ROLES_SHOWN = ", ".join(repr(role) for role in ROLES)


def check_message(message: Any, *, where: str) -> None:
    """One chat message, as OpenAI's schema has it: a known role; content a string
    or a non-empty list of parts, which only an assistant turn carrying tool calls
    may leave out; a tool message answers a tool_call_id."""
    if not isinstance(message, dict):
        raise LineError("invalid_body", f"{where} must be an object with a role.", where)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise LineError("invalid_body", f"{where}.role must be one of {_ROLES_SHOWN} "
                        f"(got {_shown(role)}).", f"{where}.role")
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise LineError("invalid_body", f"{where}.tool_call_id is required in a tool "
                        "message (a string: the id of the call it answers).",
                        f"{where}.tool_call_id")
    calls_tools = False
    if role == "assistant":
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise LineError("invalid_body", f"{where}.tool_calls must be a list.",
                            f"{where}.tool_calls")
        calls_tools = bool(tool_calls) or message.get("function_call") is not None
    content = message.get("content")
    if content is None:
        if calls_tools:
            return
        raise LineError("invalid_body", f"{where}.content is required: a string or a "
                        "list of content parts.", f"{where}.content")
    check_content(content, where=f"{where}.content")


def check_content(content: Any, *, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not content:
        raise LineError("invalid_body", f"{where} must be a string or a non-empty list of "
                        f"content parts (got {_shown(content)}).", where)
    for index, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise LineError("invalid_body", f"{where}[{index}] must be an object with a "
                            "type, such as {\"type\": \"text\", \"text\": \"...\"}.",
                            f"{where}[{index}]")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise LineError("invalid_body", f"{where}[{index}].text must be a string.",
                            f"{where}[{index}].text")


# Each checked parameter: (value is fine?, what it must be). Only the keys a body
# actually has are looked at, so a typical line costs one set intersection.
SAMPLING_RULES: dict[str, tuple[Any, str]] = {
    **{key: (bound.admits, bound.must) for key, bound in SAMPLING_BOUNDS.items()},
    "n": (lambda v: v == 1 and not isinstance(v, bool), "must be 1"),
    "stream": (lambda v: v is False, "must be false: streaming is not available in a batch"),
}
_SAMPLING_KEYS = SAMPLING_RULES.keys()


def check_sampling(values: dict[str, Any], *, prefix: str = "") -> None:
    """The sampling and length parameters shared by lines and batches."""
    for key in values.keys() & _SAMPLING_KEYS:
        value = values[key]
        if value is None:
            continue
        valid, must = SAMPLING_RULES[key]
        if not valid(value):
            raise LineError("invalid_body", f"{prefix}{key} {must}.", f"{prefix}{key}")


def validate_file(path: Path, *, endpoint: str, chunk_size: int, max_line_bytes: int,
                  max_requests: int, order_path: Path | None = None) -> ValidationReport:
    """Check every line once and cut the valid requests into chunks: byte ranges of
    the input, or, with `order_path`, ranges of an order file that groups requests
    sharing a prompt prefix (batches/chunking.py)."""
    report = ValidationReport()
    chunker = (PrefixGroupingChunker(chunk_size, endpoint, order_path)
               if order_path is not None else ContiguousChunker(chunk_size, endpoint))
    # Uniqueness by 64-bit hashes of the ids, not the ids: flat memory for a million
    # lines (a false duplicate needs a collision, about 1 in 10^7 for 10^6 ids).
    seen: set[int] = set()
    add_to_chunk = chunker.add
    parse = parse_line
    decode = DECODERS[endpoint].decode
    grouped = chunker.grouped
    line_number = 0
    offset = 0
    try:
        with path.open("rb") as fh:
            readline = fh.readline
            limit = max_line_bytes + 1
            while raw := readline(limit):
                line_start = offset
                offset += len(raw)
                line_number += 1
                if len(raw) == limit and not raw.endswith(b"\n"):
                    offset += _skip_rest_of_line(fh)
                    report.add_error(line_number, "line_too_long",
                                     f"Line is longer than the server's limit of "
                                     f"{max_line_bytes} bytes (BATCHGEN_MAX_LINE_BYTES).")
                    continue
                if line_number == 1 and raw.startswith(BOM):
                    raw = raw[len(BOM):]
                    line_start += len(BOM)
                if not raw.strip():
                    continue
                try:
                    line = decode(raw)
                    custom_id = line.custom_id
                    key = prefix_key_of_line(line) if grouped else 0
                except DecodeError:
                    # The slow path names the problem, or accepts what the strict
                    # types did not (a float 1.0 for n, say).
                    try:
                        item = parse(raw, endpoint=endpoint)
                    except LineError as error:
                        report.add_error(line_number, error.code, error.message, error.param)
                        continue
                    custom_id = item["custom_id"]
                    key = prefix_key(item["body"], endpoint) if grouped else 0
                digest = hash(custom_id)
                if digest in seen:
                    report.add_error(line_number, "duplicate_custom_id",
                                     f"custom_id {custom_id!r} appears more than once.",
                                     "custom_id")
                    continue
                seen.add(digest)
                report.total += 1
                if report.total > max_requests:
                    report.add_error(line_number, "too_many_requests",
                                     f"A batch holds at most {max_requests} requests "
                                     "(BATCHGEN_MAX_REQUESTS_PER_BATCH); this line is one "
                                     "more.")
                    break
                if not report.invalid:  # once a line is bad nothing will be queued
                    add_to_chunk(line_start, offset, line_number, key)
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
