"""The bad-input corpus manifest: every case and the outcome it must get.

Four kinds of case, by where the bad input enters:

- InputFile: a batch input file (`inputs/<name>.jsonl`, or bytes from `generated.py`).
  It is uploaded, a batch is created on it and validated; the outcome is the batch's:
  failed with exactly these per-line errors, failed as a whole, or validated.
- Upload: a multipart body sent to POST /v1/files: refused (4xx), or stored under the
  file's id with the shown filename sanitised.
- CreateBatch: a body sent to POST /v1/batches: refused (4xx).
- Request: a method and path with a hostile id or cursor: refused (4xx) or answered.

No case may answer 5xx; every refusal is in the OpenAI error envelope.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.corpus import generated
from tests.files.helpers import MULTIPART, multipart

INPUTS = Path(__file__).parent / "inputs"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
SCORE, RERANK = "/v1/score", "/v1/rerank"
MiB = 1024 * 1024


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY: Any = _Any()  # the error's `code` or `param` is not part of the expectation


# --- outcomes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Refused:
    """A 4xx in the error envelope, with this `code` and `param` unless ANY."""

    status: int
    code: Any = ANY
    param: Any = ANY


@dataclass(frozen=True)
class Answered:
    """Accepted: a 2xx whose JSON is an object of this kind (a hostile cursor that
    matches nothing gets a "list", a chunked upload a "file")."""

    status: int = 200
    object: str = "list"


@dataclass(frozen=True)
class Stored:
    """The upload is accepted, its bytes stored under the file id alone, and the
    filename shown back is this one."""

    filename: str


@dataclass(frozen=True)
class LineErrors:
    """The batch fails validation (`invalid_input`) and errors.data is exactly these
    (code, line, param) in order. Messages are at most `max_message_chars` long."""

    errors: tuple[tuple[str, int, str | None], ...]
    max_message_chars: int = 500


@dataclass(frozen=True)
class ErrorsCapped:
    """The batch fails with `invalid` bad lines, of which the first `listed` are in
    errors.data, all with this code."""

    invalid: int
    listed: int
    code: str


@dataclass(frozen=True)
class BatchFails:
    """The batch fails as a whole with this error code (no per-line errors)."""

    code: str


@dataclass(frozen=True)
class Validates:
    """The batch validates and is queued; its chunks read back exactly these requests."""

    custom_ids: tuple[str, ...]


# --- cases ------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputFile:
    name: str
    content: Callable[[], bytes]
    expected: LineErrors | ErrorsCapped | BatchFails | Validates
    endpoint: str = CHAT
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Upload:
    name: str
    body: Callable[[], bytes]
    expected: Refused | Stored
    content_type: str = MULTIPART


@dataclass(frozen=True)
class CreateBatch:
    """`@FILE@` in the body stands for the id of a valid input file."""

    name: str
    body: Callable[[], bytes]
    expected: Refused
    content_type: str = "application/json"


@dataclass(frozen=True)
class Request:
    name: str
    method: str
    path: str
    expected: Refused | Answered


@dataclass(frozen=True)
class RawHttp:
    """Bytes sent as they are to a real server (`test_corpus_http.py`): what the web
    server parses before Django does (request line, headers, chunked framing).
    `@FILE@` in the body stands for the id of a valid input file."""

    name: str
    head: str  # the request line and headers, one a line; Host is added
    expected: Refused | Answered
    body: Callable[[], bytes] = lambda: b""
    chunk_size: int | None = None  # sent with Transfer-Encoding: chunked, in such pieces

    def request(self, file_id: str = "") -> bytes:
        lines = self.head.split("\n")
        head = "\r\n".join([lines[0], "Host: 127.0.0.1", *lines[1:]]) + "\r\n\r\n"
        body = self.body().replace(b"@FILE@", file_id.encode())
        if self.chunk_size:
            pieces = [body[i:i + self.chunk_size] for i in range(0, len(body), self.chunk_size)]
            body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
        return head.encode("latin-1") + body


def from_file(name: str) -> Callable[[], bytes]:
    return lambda: (INPUTS / f"{name}.jsonl").read_bytes()


def bad_line_2(name: str, code: str, param: str | None = None, *,
               endpoint: str = CHAT) -> InputFile:
    """A file whose line 2 (between two good lines) is bad in one way."""
    return InputFile(name, from_file(name), LineErrors(((code, 2, param),)), endpoint)


def accepted(name: str, *custom_ids: str) -> InputFile:
    return InputFile(name, from_file(name), Validates(custom_ids))


# --- input files ------------------------------------------------------------------------

INPUT_FILES: list[InputFile] = [
    # Broken JSON.
    bad_line_2("json_truncated_object", "invalid_json"),
    bad_line_2("json_trailing_comma", "invalid_json"),
    bad_line_2("json_single_quotes", "invalid_json"),
    bad_line_2("json_unquoted_keys", "invalid_json"),
    bad_line_2("json_two_objects_on_one_line", "invalid_json"),
    bad_line_2("json_comment_line", "invalid_json"),
    bad_line_2("json_array_line", "invalid_json"),
    bad_line_2("json_string_line", "invalid_json"),
    bad_line_2("json_null_line", "invalid_json"),
    bad_line_2("json_nan_literal", "invalid_json"),
    bad_line_2("json_infinity_literal", "invalid_json"),
    bad_line_2("json_number_overflowing_double", "invalid_json"),
    InputFile("torn_last_line", from_file("torn_last_line"),
              LineErrors((("invalid_json", 3, None),))),
    # Encodings and stray bytes: JSON Lines is UTF-8.
    bad_line_2("bom_on_a_later_line", "invalid_json"),
    InputFile("utf16_encoded_file", from_file("utf16_encoded_file"),
              # Split at the 0x0A byte: the request, then the 0x00 that followed it.
              LineErrors((("invalid_json", 1, None), ("invalid_json", 2, None)))),
    bad_line_2("latin1_byte_in_a_string", "invalid_json"),
    bad_line_2("invalid_utf8_sequence", "invalid_json"),
    bad_line_2("lone_surrogate_escape", "invalid_json"),
    bad_line_2("raw_nul_byte", "invalid_json"),
    InputFile("cr_only_line_endings", from_file("cr_only_line_endings"),
              LineErrors((("invalid_json", 1, None),))),  # no \n: one line, two objects
    # Layouts the design accepts.
    accepted("accepted_bom_at_start", "a", "b"),
    accepted("accepted_crlf_line_endings", "a", "b"),
    accepted("accepted_blank_and_whitespace_lines", "a", "b"),
    accepted("accepted_no_final_newline", "a", "b"),
    accepted("accepted_bom_crlf_and_blanks", "a", "b"),
    accepted("accepted_duplicate_json_key_last_wins", "a"),
    accepted("accepted_unicode_custom_ids", "\u00e9t\u00e9-\U0001f680", "\u202ertl-override",
             "'; DROP TABLE batches; --"),
    accepted("accepted_escaped_nul_in_content", "a"),
    accepted("accepted_nesting_within_limit", "a"),
    # No request at all.
    InputFile("only_blank_lines", from_file("only_blank_lines"), BatchFails("empty_batch")),
    InputFile("only_a_bom", from_file("only_a_bom"), BatchFails("empty_batch")),
    InputFile("only_a_bom_and_newline", from_file("only_a_bom_and_newline"),
              BatchFails("empty_batch")),
    # custom_id.
    bad_line_2("custom_id_number", "invalid_custom_id", "custom_id"),
    bad_line_2("custom_id_list", "invalid_custom_id", "custom_id"),
    bad_line_2("custom_id_object", "invalid_custom_id", "custom_id"),
    bad_line_2("custom_id_bool", "invalid_custom_id", "custom_id"),
    bad_line_2("custom_id_null", "missing_custom_id", "custom_id"),
    bad_line_2("custom_id_empty", "missing_custom_id", "custom_id"),
    bad_line_2("custom_id_missing", "missing_custom_id", "custom_id"),
    bad_line_2("custom_id_too_long", "invalid_custom_id", "custom_id"),
    InputFile("custom_id_duplicate", from_file("custom_id_duplicate"),
              LineErrors((("duplicate_custom_id", 3, "custom_id"),))),
    # method.
    bad_line_2("method_lowercase", "invalid_method", "method"),
    bad_line_2("method_get", "invalid_method", "method"),
    bad_line_2("method_missing", "invalid_method", "method"),
    bad_line_2("method_number", "invalid_method", "method"),
    # url.
    bad_line_2("url_wrong_path", "invalid_url", "url"),
    bad_line_2("url_other_endpoint", "invalid_url", "url"),
    bad_line_2("url_unsupported_endpoint", "invalid_url", "url"),
    bad_line_2("url_absolute", "invalid_url", "url"),
    bad_line_2("url_missing", "invalid_url", "url"),
    bad_line_2("url_trailing_slash", "invalid_url", "url"),
    # body.
    bad_line_2("body_list", "invalid_body", "body"),
    bad_line_2("body_string", "invalid_body", "body"),
    bad_line_2("body_null", "invalid_body", "body"),
    bad_line_2("body_missing", "invalid_body", "body"),
    # body.model: present, and one of the served models (the tests serve "m"); never
    # answered by another model. Names are exact: "M" is not "m".
    bad_line_2("model_missing", "invalid_body", "body.model"),
    bad_line_2("model_number", "invalid_body", "body.model"),
    bad_line_2("model_empty", "invalid_body", "body.model"),
    bad_line_2("model_not_served", "model_not_found", "body.model"),
    bad_line_2("model_not_served_slow_path", "model_not_found", "body.model"),
    # body.messages.
    bad_line_2("messages_missing", "invalid_body", "body.messages"),
    bad_line_2("messages_empty", "invalid_body", "body.messages"),
    bad_line_2("messages_object_not_list", "invalid_body", "body.messages"),
    bad_line_2("messages_string", "invalid_body", "body.messages"),
    bad_line_2("message_without_role", "invalid_body", "body.messages[0].role"),
    bad_line_2("message_role_number", "invalid_body", "body.messages[0].role"),
    bad_line_2("message_role_null", "invalid_body", "body.messages[0].role"),
    bad_line_2("message_not_an_object", "invalid_body", "body.messages[0]"),
    bad_line_2("second_message_without_role", "invalid_body", "body.messages[1].role"),
    # A message as OpenAI's chat schema has it: roles system, developer, user, assistant,
    # tool; content a string or a non-empty list of typed parts.
    bad_line_2("message_role_wizard", "invalid_body", "body.messages[0].role"),
    bad_line_2("message_role_function", "invalid_body", "body.messages[0].role"),
    bad_line_2("message_role_empty", "invalid_body", "body.messages[0].role"),
    bad_line_2("message_content_number", "invalid_body", "body.messages[0].content"),
    bad_line_2("message_content_missing", "invalid_body", "body.messages[0].content"),
    bad_line_2("message_content_null", "invalid_body", "body.messages[0].content"),
    bad_line_2("message_content_object", "invalid_body", "body.messages[0].content"),
    bad_line_2("message_content_empty_list", "invalid_body", "body.messages[0].content"),
    bad_line_2("message_content_part_a_string", "invalid_body", "body.messages[0].content[0]"),
    bad_line_2("message_content_part_without_type", "invalid_body",
               "body.messages[0].content[0]"),
    bad_line_2("message_text_part_without_text", "invalid_body",
               "body.messages[0].content[0].text"),
    bad_line_2("assistant_without_content_or_tool_calls", "invalid_body",
               "body.messages[1].content"),
    bad_line_2("assistant_tool_calls_not_a_list", "invalid_body", "body.messages[1].tool_calls"),
    bad_line_2("tool_message_without_tool_call_id", "invalid_body",
               "body.messages[2].tool_call_id"),
    bad_line_2("second_message_content_number", "invalid_body", "body.messages[1].content"),
    accepted("accepted_tool_call_turns", "a", "b"),
    accepted("accepted_content_parts_and_developer_role", "a", "b"),
    # body.prompt, in a /v1/completions batch.
    bad_line_2("completions_prompt_missing", "invalid_body", "body.prompt",
               endpoint=COMPLETIONS),
    bad_line_2("completions_prompt_number", "invalid_body", "body.prompt",
               endpoint=COMPLETIONS),
    bad_line_2("completions_prompt_empty_list", "invalid_body", "body.prompt",
               endpoint=COMPLETIONS),
    bad_line_2("completions_prompt_list_of_bools", "invalid_body", "body.prompt",
               endpoint=COMPLETIONS),
    bad_line_2("completions_prompt_nested_lists", "invalid_body", "body.prompt",
               endpoint=COMPLETIONS),
    bad_line_2("completions_prompt_null", "invalid_body", "body.prompt", endpoint=COMPLETIONS),
    bad_line_2("completions_batch_given_a_chat_line", "invalid_url", "url",
               endpoint=COMPLETIONS),
    # body.input and the embedding options, in a /v1/embeddings batch.
    bad_line_2("embeddings_input_empty_string", "invalid_body", "body.input",
               endpoint=EMBEDDINGS),
    bad_line_2("embeddings_input_mixed_texts_and_ids", "invalid_body", "body.input",
               endpoint=EMBEDDINGS),
    bad_line_2("embeddings_input_negative_token_id", "invalid_body", "body.input",
               endpoint=EMBEDDINGS),
    bad_line_2("embeddings_encoding_format_bytes", "invalid_body", "body.encoding_format",
               endpoint=EMBEDDINGS),
    bad_line_2("embeddings_dimensions_zero", "invalid_body", "body.dimensions",
               endpoint=EMBEDDINGS),
    # vLLM's Score and Rerank bodies, in /v1/score, /score, /v1/rerank and /rerank batches.
    bad_line_2("score_documents_empty_list", "invalid_body", "body.documents", endpoint=SCORE),
    bad_line_2("score_queries_and_documents_of_different_lengths", "invalid_body",
               "body.documents", endpoint=SCORE),
    bad_line_2("score_no_sides", "invalid_body", "body.text_1", endpoint=SCORE),
    bad_line_2("score_text_2_missing", "invalid_body", "body.text_2", endpoint="/score"),
    bad_line_2("rerank_documents_empty_list", "invalid_body", "body.documents",
               endpoint=RERANK),
    bad_line_2("rerank_top_n_zero", "invalid_body", "body.top_n", endpoint=RERANK),
    bad_line_2("rerank_query_missing", "invalid_body", "body.query", endpoint=RERANK),
    bad_line_2("rerank_return_documents_a_string", "invalid_body", "body.return_documents",
               endpoint="/rerank"),
    bad_line_2("rerank_batch_given_a_score_line", "invalid_url", "url", endpoint=RERANK),
    # OpenAI's Responses body in a /v1/responses batch, and what a batch cannot do.
    *[bad_line_2(f"responses_{name}", code, param, endpoint=RESPONSES) for name, code, param in [
        ("input_empty_list", "invalid_body", "body.input"),
        ("item_role_unknown", "invalid_body", "body.input[0].role"),
        ("content_part_type_text", "invalid_body", "body.input[0].content[0].type"),
        ("max_output_tokens_zero", "invalid_body", "body.max_output_tokens"),
        ("text_format_schema_missing", "invalid_body", "body.text.format.schema"),
        ("reasoning_effort_unknown", "invalid_body", "body.reasoning.effort"),
        ("metadata_value_number", "invalid_body", "body.metadata"),
        ("stream_true", "unsupported_parameter", "body.stream"),
        ("background_true", "unsupported_parameter", "body.background"),
        ("previous_response_id", "unsupported_parameter", "body.previous_response_id"),
        ("builtin_tool", "unsupported_parameter", "body.tools[0].type"),
        ("batch_given_a_chat_line", "invalid_url", "url"),
    ]],
    InputFile("responses_string_and_items_and_options",
              from_file("responses_string_and_items_and_options"),
              Validates(("ok-1", "ok-2", "ok-3")), RESPONSES),
    # Output length.
    bad_line_2("max_tokens_negative", "invalid_body", "body.max_tokens"),
    bad_line_2("max_tokens_zero", "invalid_body", "body.max_tokens"),
    bad_line_2("max_tokens_string", "invalid_body", "body.max_tokens"),
    bad_line_2("max_tokens_float", "invalid_body", "body.max_tokens"),
    bad_line_2("max_tokens_bool", "invalid_body", "body.max_tokens"),
    bad_line_2("max_completion_tokens_negative", "invalid_body", "body.max_completion_tokens"),
    # Sampling.
    bad_line_2("temperature_negative", "invalid_body", "body.temperature"),
    bad_line_2("temperature_string", "invalid_body", "body.temperature"),
    bad_line_2("temperature_nan_string", "invalid_body", "body.temperature"),
    bad_line_2("temperature_list", "invalid_body", "body.temperature"),
    bad_line_2("top_p_zero", "invalid_body", "body.top_p"),
    bad_line_2("top_p_two", "invalid_body", "body.top_p"),
    bad_line_2("top_k_minus_five", "invalid_body", "body.top_k"),
    bad_line_2("top_k_float", "invalid_body", "body.top_k"),
    bad_line_2("temperature_five", "invalid_body", "body.temperature"),
    bad_line_2("temperature_just_over_two", "invalid_body", "body.temperature"),
    bad_line_2("presence_penalty_three", "invalid_body", "body.presence_penalty"),
    bad_line_2("frequency_penalty_minus_three", "invalid_body", "body.frequency_penalty"),
    bad_line_2("top_logprobs_21", "invalid_body", "body.top_logprobs"),
    bad_line_2("top_logprobs_negative", "invalid_body", "body.top_logprobs"),
    bad_line_2("seed_float", "invalid_body", "body.seed"),
    accepted("accepted_sampling_at_the_bounds", "a", "b"),
    bad_line_2("n_over_the_ceiling", "invalid_body", "body.n"),
    accepted("accepted_n_logprobs_seed_and_json_schema", "ok-1", "x", "ok-2"),
    bad_line_2("response_format_type_xml", "invalid_body", "body.response_format"),
    bad_line_2("response_format_json_schema_without_name", "invalid_body",
               "body.response_format.json_schema"),
    bad_line_2("response_format_schema_a_string", "invalid_body",
               "body.response_format.json_schema.schema"),
    bad_line_2("chat_logprobs_a_number", "invalid_body", "body.logprobs"),
    bad_line_2("completions_logprobs_21", "invalid_body", "body.logprobs", endpoint=COMPLETIONS),
    bad_line_2("stream_true", "invalid_body", "body.stream"),
    bad_line_2("stream_string", "invalid_body", "body.stream"),
    # Several bad lines: each listed with its own number (blank lines count).
    InputFile("every_bad_line_listed_with_its_number",
              from_file("every_bad_line_listed_with_its_number"),
              LineErrors((("invalid_json", 2, None), ("invalid_method", 4, "method"),
                          ("duplicate_custom_id", 6, "custom_id"), ("invalid_url", 7, "url"),
                          ("invalid_body", 8, "body.top_p")))),
    # Generated: sizes and depths a checked-in file should not hold.
    InputFile("line_of_10_mb_over_a_1_mib_limit", generated.line_of_10_mb,
              LineErrors((("line_too_long", 2, None),)),
              settings={"BATCHGEN_MAX_LINE_BYTES": MiB}),
    InputFile("line_of_17_mb_over_the_default_limit", generated.line_of_17_mb,
              LineErrors((("line_too_long", 2, None),))),
    InputFile("line_of_10_mb_within_the_default_limit", generated.line_of_10_mb,
              Validates(("ok-1", "long", "ok-2"))),
    InputFile("unterminated_10_mb_of_garbage", generated.unterminated_10_mb_of_garbage,
              LineErrors((("line_too_long", 2, None),)),
              settings={"BATCHGEN_MAX_LINE_BYTES": MiB}),
    InputFile("deeply_nested_body", generated.deeply_nested_body,
              LineErrors((("invalid_json", 2, None),))),
    InputFile("deeply_nested_list_in_messages", generated.deeply_nested_list_in_messages,
              LineErrors((("invalid_json", 2, None),))),
    InputFile("url_of_a_megabyte", generated.url_of_a_megabyte,
              LineErrors((("invalid_url", 2, "url"),))),
    InputFile("custom_id_of_a_megabyte", generated.custom_id_of_a_megabyte,
              LineErrors((("invalid_custom_id", 2, "custom_id"),))),
    InputFile("ten_thousand_and_one_bad_lines", generated.ten_thousand_bad_lines,
              ErrorsCapped(invalid=10_001, listed=10_000, code="invalid_json")),
]


# --- uploads (POST /v1/files) -------------------------------------------------------------

GOOD_LINE = generated.chat_line("a") + b"\n"


def _upload(filename: str = "in.jsonl", content: bytes = GOOD_LINE,
            purpose: str | None = "batch", **extra: str) -> Callable[[], bytes]:
    fields = {"purpose": purpose} if purpose is not None else {}
    return lambda: multipart(fields={**fields, **extra}, files=[("file", filename, content)])


def _expiring(anchor: str | None = "created_at", seconds: str | None = None,
              **more: str) -> Callable[[], bytes]:
    """An upload with `expires_after`, in the multipart brackets the openai SDK sends."""
    fields = {f"expires_after[{key}]": value for key, value in
              {"anchor": anchor, "seconds": seconds, **more}.items() if value is not None}
    return _upload(**fields)


def _raw(body: bytes) -> Callable[[], bytes]:
    return lambda: body


UPLOADS: list[Upload] = [
    Upload("empty_file", _upload(content=b""), Refused(400, "empty_file", "file")),
    Upload("no_file_part", lambda: multipart(fields={"purpose": "batch"}),
           Refused(400, "required", "file")),
    Upload("file_sent_as_a_text_field", lambda: multipart(fields={"purpose": "batch",
                                                                  "file": "x"}),
           Refused(400, param="file")),
    Upload("empty_filename", _upload(filename=""), Refused(400, param="file")),
    Upload("purpose_missing", _upload(purpose=None), Refused(400, "required", "purpose")),
    Upload("purpose_fine_tune", _upload(purpose="fine-tune"), Refused(400, param="purpose")),
    Upload("purpose_batch_output", _upload(purpose="batch_output"),
           Refused(400, param="purpose")),
    Upload("purpose_with_nul", _upload(purpose="batch\x00"), Refused(400, param="purpose")),
    Upload("filename_dot_dot", _upload(filename=".."), Refused(400, param="file")),
    Upload("filename_path_traversal", _upload(filename="../../../etc/passwd"),
           Stored("passwd")),
    Upload("filename_windows_traversal", _upload(filename="..\\..\\boot.ini"),
           Stored("boot.ini")),
    Upload("filename_absolute_windows_path", _upload(filename="C:\\Users\\me\\in.jsonl"),
           Stored("in.jsonl")),
    Upload("filename_with_nul", _upload(filename="evil\x00.jsonl"), Stored("evil.jsonl")),
    Upload("filename_with_control_characters", _upload(filename="tab\tesc\x1b.jsonl"),
           Stored("tabesc.jsonl")),
    Upload("filename_with_a_quote", _upload(filename='a\\"b.jsonl'), Stored('a"b.jsonl')),
    Upload("filename_only_spaces", _upload(filename="   "), Stored("upload.jsonl")),
    Upload("filename_unicode", _upload(filename="donn\u00e9es \U0001f680.jsonl"),
           Stored("donn\u00e9es \U0001f680.jsonl")),
    Upload("filename_decomposed_unicode_is_nfc", _upload(filename="cafe\u0301.jsonl"),
           Stored("caf\u00e9.jsonl")),
    Upload("filename_600_characters", _upload(filename="n" * 600), Stored("n" * 255)),
    Upload("filename_over_the_multipart_header_limit", _upload(filename="n" * 5000),
           Refused(400, "parse_error")),
    Upload("two_file_parts_keeps_the_last", lambda: multipart(
        fields={"purpose": "batch"}, files=[("file", "first.jsonl", GOOD_LINE),
                                            ("file", "second.jsonl", GOOD_LINE)]),
           Stored("second.jsonl")),
    Upload("too_many_fields", lambda: multipart(
        fields={**{f"f{i}": "x" for i in range(1_100)}, "purpose": "batch"},
        files=[("file", "in.jsonl", GOOD_LINE)]), Refused(400)),
    Upload("too_many_files", lambda: multipart(
        fields={"purpose": "batch"},
        files=[("file", f"in-{i}.jsonl", GOOD_LINE) for i in range(120)]), Refused(400)),
    Upload("multipart_without_boundary", _raw(b"--x\r\n"), Refused(400, "parse_error"),
           content_type="multipart/form-data"),
    Upload("multipart_garbage", _raw(b"\x00\xff" * 100), Refused(400)),
    Upload("multipart_truncated_mid_file",
           lambda: multipart(fields={"purpose": "batch"},
                             files=[("file", "in.jsonl", GOOD_LINE * 100)])[:2000],
           Refused(400)),
    Upload("json_instead_of_multipart", _raw(b'{"purpose": "batch"}'),
           Refused(415), content_type="application/json"),
    # Compressed input: refused by its magic number with a message to decompress it, not
    # stored to fail validation as a file that is "not valid UTF-8".
    *[Upload(f"{kind}_compressed", _upload(filename=f"in.jsonl.{ext}", content=pack(GOOD_LINE)),
             Refused(400, "compressed_file", "file"))
      for kind, ext, pack in [("gzip", "gz", generated.gzip_of), ("zip", "zip", generated.zip_of),
                              ("bzip2", "bz2", generated.bzip2_of),
                              ("xz", "xz", generated.xz_of), ("zstd", "zst", generated.zstd_of)]],
    Upload("gzip_compressed_named_jsonl", _upload(content=generated.gzip_of(GOOD_LINE)),
           Refused(400, "compressed_file", "file")),
    Upload("gzip_of_an_empty_file", _upload(content=generated.gzip_of(b"")),
           Refused(400, "compressed_file", "file")),
    Upload("plain_jsonl_named_gz", _upload(filename="in.jsonl.gz"), Stored("in.jsonl.gz")),
    # expires_after: OpenAI's bounds (an hour to 30 days), its one anchor, integers only.
    Upload("expires_after_below_an_hour", _expiring(seconds="3599"),
           Refused(400, "invalid_expires_after", "expires_after.seconds")),
    Upload("expires_after_over_30_days", _expiring(seconds="2592001"),
           Refused(400, "invalid_expires_after", "expires_after.seconds")),
    Upload("expires_after_negative", _expiring(seconds="-3600"),
           Refused(400, "invalid_expires_after", "expires_after.seconds")),
    Upload("expires_after_huge", _expiring(seconds="9" * 400),
           Refused(400, param="expires_after.seconds")),
    Upload("expires_after_fraction", _expiring(seconds="3600.5"),
           Refused(400, param="expires_after.seconds")),
    Upload("expires_after_not_a_number", _expiring(seconds="1h"),
           Refused(400, param="expires_after.seconds")),
    Upload("expires_after_without_seconds", _expiring(),
           Refused(400, "required", "expires_after.seconds")),
    Upload("expires_after_unknown_anchor", _expiring(anchor="last_active_at", seconds="3600"),
           Refused(400, param="expires_after.anchor")),
    Upload("expires_after_anchor_with_nul", _expiring(anchor="created_at\x00",
                                                      seconds="3600"),
           Refused(400, param="expires_after.anchor")),
    Upload("expires_after_unknown_key", _expiring(seconds="3600", days="1"),
           Refused(400, "invalid_expires_after", "expires_after")),
    Upload("expires_after_as_a_plain_field", _upload(expires_after="3600"),
           Refused(400, param="expires_after")),
]


# --- batch creation (POST /v1/batches) ------------------------------------------------------


def _json(value: Any) -> Callable[[], bytes]:
    return lambda: json.dumps(value).encode()


def _with_file(**fields: Any) -> Callable[[], bytes]:
    return _json({"input_file_id": "@FILE@", **fields})


CREATES: list[CreateBatch] = [
    CreateBatch("not_json", _raw(b"{"), Refused(400, "parse_error")),
    CreateBatch("json_array", _raw(b"[]"), Refused(400)),
    CreateBatch("json_null", _raw(b"null"), Refused(400)),
    CreateBatch("json_string", _raw(b'"file-x"'), Refused(400)),
    CreateBatch("empty_body", _raw(b""), Refused(400, "required", "input_file_id")),
    CreateBatch("nested_100000_levels", lambda: generated.json_body_nested(100_000),
                Refused(400, "parse_error")),
    CreateBatch("nested_2000_levels", lambda: generated.json_body_nested(2_000),
                Refused(400, "parse_error")),
    CreateBatch("nan_literal", _raw(b'{"input_file_id": "@FILE@", "temperature": NaN}'),
                Refused(400, "parse_error")),
    CreateBatch("lone_surrogate_in_a_key",
                _raw(b'{"input_file_id": "@FILE@", "metadata": {"\\udc00": "v"}}'),
                Refused(400, "parse_error")),
    CreateBatch("invalid_utf8", _raw(b'{"input_file_id": "\xff\xfe"}'),
                Refused(400, "parse_error")),
    CreateBatch("bom_before_the_object", _raw(b'\xef\xbb\xbf{"input_file_id": "@FILE@"}'),
                Refused(400, "parse_error")),
    CreateBatch("input_file_id_missing", _json({"endpoint": CHAT}),
                Refused(400, "required", "input_file_id")),
    CreateBatch("input_file_id_null", _json({"input_file_id": None}),
                Refused(400, "null", "input_file_id")),
    CreateBatch("input_file_id_list", _json({"input_file_id": ["file-x"]}),
                Refused(400, param="input_file_id")),
    CreateBatch("input_file_id_object", _json({"input_file_id": {"id": "file-x"}}),
                Refused(400, param="input_file_id")),
    CreateBatch("input_file_id_unknown", _json({"input_file_id": "file-nope"}),
                Refused(400, "invalid_input_file", "input_file_id")),
    CreateBatch("input_file_id_sql", _json({"input_file_id": "' OR '1'='1"}),
                Refused(400, "invalid_input_file", "input_file_id")),
    CreateBatch("input_file_id_with_nul", _json({"input_file_id": "file-\x00"}),
                Refused(400, param="input_file_id")),
    CreateBatch("input_file_id_path_traversal", _json({"input_file_id": "../../etc/passwd"}),
                Refused(400, "invalid_input_file", "input_file_id")),
    CreateBatch("input_file_id_too_long", _json({"input_file_id": "f" * 10_000}),
                Refused(400, "max_length", "input_file_id")),
    CreateBatch("endpoint_moderations", _with_file(endpoint="/v1/moderations"),
                Refused(400, "invalid_choice", "endpoint")),
    CreateBatch("endpoint_number", _with_file(endpoint=1), Refused(400, param="endpoint")),
    # An object or list where the endpoint goes (schema fuzzing found the 500).
    CreateBatch("endpoint_object", _with_file(endpoint={"url": "/v1/responses"}),
                Refused(400, param="endpoint")),
    CreateBatch("endpoint_list", _with_file(endpoint=["/v1/responses"]),
                Refused(400, param="endpoint")),
    CreateBatch("completion_window_200h", _with_file(completion_window="200h"),
                Refused(400, "invalid_completion_window", "completion_window")),
    CreateBatch("completion_window_no_unit", _with_file(completion_window="24"),
                Refused(400, "invalid_completion_window", "completion_window")),
    CreateBatch("output_expires_after_below_an_hour",
                _with_file(output_expires_after={"anchor": "created_at", "seconds": 60}),
                Refused(400, "invalid_expires_after", "output_expires_after.seconds")),
    CreateBatch("output_expires_after_over_30_days",
                _with_file(output_expires_after={"anchor": "created_at", "seconds": 2592001}),
                Refused(400, "invalid_expires_after", "output_expires_after.seconds")),
    CreateBatch("output_expires_after_beyond_64_bits",
                _with_file(output_expires_after={"anchor": "created_at", "seconds": 10**30}),
                Refused(400, param="output_expires_after.seconds")),
    CreateBatch("output_expires_after_seconds_as_text",
                _with_file(output_expires_after={"anchor": "created_at", "seconds": "1 day"}),
                Refused(400, param="output_expires_after.seconds")),
    CreateBatch("output_expires_after_seconds_null",
                _with_file(output_expires_after={"anchor": "created_at", "seconds": None}),
                Refused(400, "null", "output_expires_after.seconds")),
    CreateBatch("output_expires_after_unknown_anchor",
                _with_file(output_expires_after={"anchor": "completed_at", "seconds": 3600}),
                Refused(400, "invalid_choice", "output_expires_after.anchor")),
    CreateBatch("output_expires_after_unknown_key",
                _with_file(output_expires_after={"anchor": "created_at", "seconds": 3600,
                                                 "after": "completion"}),
                Refused(400, "invalid_expires_after", "output_expires_after")),
    CreateBatch("output_expires_after_a_number", _with_file(output_expires_after=3600),
                Refused(400, param="output_expires_after")),
    CreateBatch("metadata_list", _with_file(metadata=["a"]), Refused(400, "not_a_dict",
                                                                      "metadata")),
    CreateBatch("metadata_nested_value", _with_file(metadata={"k": {"a": 1}}),
                Refused(400, param="metadata.k")),
    CreateBatch("metadata_null_value", _with_file(metadata={"k": None}),
                Refused(400, "null", "metadata.k")),
    CreateBatch("metadata_nul_in_value", _with_file(metadata={"k": "a\x00"}),
                Refused(400, "null_characters_not_allowed", "metadata.k")),
    CreateBatch("metadata_nul_in_key", _with_file(metadata={"k\x00": "v"}),
                Refused(400, param="metadata")),
    CreateBatch("metadata_priority_not_a_number", _with_file(metadata={"priority": "high"}),
                Refused(400, param="metadata")),
    # Metadata values are strings, as OpenAI has them: a number is not kept as "5".
    CreateBatch("metadata_number_value", _with_file(metadata={"k": 5}),
                Refused(400, "invalid_type", "metadata.k")),
    CreateBatch("metadata_float_value", _with_file(metadata={"k": 0.5}),
                Refused(400, "invalid_type", "metadata.k")),
    CreateBatch("metadata_bool_value", _with_file(metadata={"k": True}),
                Refused(400, "invalid_type", "metadata.k")),
    CreateBatch("metadata_list_value", _with_file(metadata={"k": ["a"]}),
                Refused(400, "invalid_type", "metadata.k")),
    CreateBatch("metadata_priority_as_a_number", _with_file(metadata={"priority": 3}),
                Refused(400, "invalid_type", "metadata.priority")),
    CreateBatch("metadata_17_keys", _with_file(metadata={f"k{i}": "v" for i in range(17)}),
                Refused(400, "metadata_too_large", "metadata")),
    CreateBatch("metadata_key_of_65_characters", _with_file(metadata={"k" * 65: "v"}),
                Refused(400, "metadata_too_large", "metadata")),
    CreateBatch("metadata_value_of_513_characters", _with_file(metadata={"k": "v" * 513}),
                Refused(400, "metadata_too_large", "metadata.k")),
    CreateBatch("max_decoding_length_zero", _with_file(max_decoding_length=0),
                Refused(400, "min_value", "max_decoding_length")),
    CreateBatch("max_decoding_length_string", _with_file(max_decoding_length="lots"),
                Refused(400, param="max_decoding_length")),
    CreateBatch("max_decoding_length_10_to_the_40",  # beyond 64 bits: parsed as a float
                _raw(b'{"input_file_id": "@FILE@", "max_decoding_length": 1' + b"0" * 40 + b"}"),
                Refused(400, param="max_decoding_length")),
    CreateBatch("max_decoding_length_over_32_bits", _with_file(max_decoding_length=2**31),
                Refused(400, "max_value", "max_decoding_length")),
    CreateBatch("max_context_length_over_the_model", _with_file(max_context_length=2**31 - 1),
                Refused(400, param="max_context_length")),
    CreateBatch("top_k_over_32_bits", _with_file(top_k=10**12),
                Refused(400, "max_value", "top_k")),
    CreateBatch("top_k_negative", _with_file(top_k=-5), Refused(400, "min_value", "top_k")),
    CreateBatch("top_k_float", _with_file(top_k=2.5), Refused(400, param="top_k")),
    CreateBatch("temperature_negative", _with_file(temperature=-1),
                Refused(400, "min_value", "temperature")),
    CreateBatch("temperature_string", _with_file(temperature="hot"),
                Refused(400, param="temperature")),
    CreateBatch("temperature_overflowing_double",
                _raw(b'{"input_file_id": "@FILE@", "temperature": 1e999}'),
                Refused(400, "parse_error")),
    # The bounds of a request body hold at batch level too (OpenAI's: temperature 0-2).
    CreateBatch("temperature_three", _with_file(temperature=3),
                Refused(400, "max_value", "temperature")),
    CreateBatch("temperature_just_over_two", _with_file(temperature=2.01),
                Refused(400, "max_value", "temperature")),
    CreateBatch("temperature_nan_string", _with_file(temperature="NaN"),
                Refused(400, param="temperature")),
    CreateBatch("top_k_minus_two", _with_file(top_k=-2), Refused(400, "min_value", "top_k")),
    CreateBatch("top_p_zero", _with_file(top_p=0), Refused(400, "min_value", "top_p")),
    CreateBatch("top_p_two", _with_file(top_p=2), Refused(400, "max_value", "top_p")),
    CreateBatch("top_p_just_over_one", _with_file(top_p=1.01),
                Refused(400, "max_value", "top_p")),
    CreateBatch("form_encoded_body", _raw(b"input_file_id=@FILE@"), Refused(415),
                content_type="application/x-www-form-urlencoded"),
    CreateBatch("multipart_body", lambda: multipart(fields={"input_file_id": "@FILE@"}),
                Refused(415), content_type=MULTIPART),
    CreateBatch("text_plain_body", _raw(b"input_file_id"), Refused(415),
                content_type="text/plain"),
]


# --- hostile ids and cursors in URLs ----------------------------------------------------------

# (name, the id as it appears in the URL, percent-encoded where it must be)
HOSTILE_IDS = [
    ("path_traversal", "..%2F..%2F..%2Fetc%2Fpasswd"),
    ("dot_dot", ".."),
    ("nul_byte", "file%00id"),
    ("quotes", "%22%27%60"),
    ("sql", "%27%20OR%20%271%27%3D%271"),
    ("sql_drop", "x%27%3B%20DROP%20TABLE%20files%3B--"),
    ("slash", "a%2Fb"),
    ("very_long", "i" * 10_000),
    ("unicode", "%F0%9F%9A%80%E2%80%AE"),
    ("invalid_utf8", "%FF%FE"),
    ("crlf", "x%0D%0ASet-Cookie%3A%20a%3Db"),
    ("percent_encoded_percent", "%2525"),
]
ENDPOINTS = [
    # (method, path with {id}, code and param of the 404 for an id that names nothing)
    ("GET", "/v1/files/{id}", "not_found", "file_id"),
    ("DELETE", "/v1/files/{id}", "not_found", "file_id"),
    ("GET", "/v1/files/{id}/content", "not_found", "file_id"),
    ("GET", "/v1/batches/{id}", "not_found", "batch_id"),
    ("POST", "/v1/batches/{id}/cancel", "not_found", "batch_id"),
    ("GET", "/v1/batches/{id}/output", "not_found", "batch_id"),
    ("GET", "/v1/batches/{id}/errors", "not_found", "batch_id"),
    ("GET", "/v1/models/{id}", "model_not_found", "model"),
]


def _id_request(method: str, template: str, code: str, param: str, name: str,
                raw_id: str) -> Request:
    # A slash ends a path segment: such an id never reaches the view, except the model
    # id, whose route takes the rest of the path (but not a line break).
    models = "/v1/models/" in template
    if ("%2F" in raw_id and not models) or ("%0A" in raw_id and models):
        expected = Refused(404)  # no route: "Unknown path", in the envelope
    else:
        expected = Refused(404, code, param)
    label = template.replace("/v1/", "").replace("/{id}", "").replace("/", "_")
    return Request(f"{method.lower()}_{label}_{name}", method,
                   template.replace("{id}", raw_id), expected)


STALE_CURSOR = Refused(400, "invalid_cursor", "after")
# The output of a @BATCH_WITH_OUTPUT@: two whole lines.
OUTPUT_LINES = b'{"custom_id": "a1"}\n{"custom_id": "a22"}\n'

REQUESTS: list[Request] = [
    _id_request(method, template, code, param, name, raw_id)
    for method, template, code, param in ENDPOINTS
    for name, raw_id in HOSTILE_IDS
] + [
    # A cursor that names no object is refused, never answered with the first page.
    Request("files_after_sql", "GET", "/v1/files?after=%27%20OR%201%3D1--", STALE_CURSOR),
    Request("files_after_unknown_id", "GET", "/v1/files?after=file-zzz", STALE_CURSOR),
    Request("files_after_an_id_from_the_future", "GET",
            "/v1/files?after=file-ffffffffffffff0000000000", STALE_CURSOR),
    Request("files_after_a_batch_id", "GET", "/v1/files?after=batch_066188dde2cbcc4ad1538b7c",
            STALE_CURSOR),
    Request("files_after_a_past_file_id", "GET",  # a deleted file's place: answered
            "/v1/files?after=file-066188dde2cbcc4ad1538b7c", Answered()),
    Request("files_after_nul", "GET", "/v1/files?after=a%00", Refused(400, param="after")),
    Request("files_after_too_long", "GET", "/v1/files?after=" + "a" * 100,
            Refused(400, "max_length", "after")),
    Request("files_limit_huge", "GET", "/v1/files?limit=" + "9" * 40,
            Refused(400, param="limit")),
    Request("files_limit_negative", "GET", "/v1/files?limit=-1", Refused(400, param="limit")),
    Request("files_order_sql", "GET", "/v1/files?order=id%3B--", Refused(400, param="order")),
    Request("batches_after_sql", "GET", "/v1/batches?after=%27%20OR%201%3D1--", STALE_CURSOR),
    Request("batches_after_unknown_id", "GET", "/v1/batches?after=batch_unknown", STALE_CURSOR),
    Request("batches_after_an_id_of_no_batch", "GET",
            "/v1/batches?after=batch_066188dde2cbcc4ad1538b7c", STALE_CURSOR),
    Request("batches_after_nul", "GET", "/v1/batches?after=%00", Refused(400, param="after")),
    Request("batches_limit_float", "GET", "/v1/batches?limit=2.5", Refused(400,
                                                                            param="limit")),
    Request("errors_limit_zero", "GET", "/v1/batches/@BATCH@/errors?limit=0",
            Refused(400, "min_value", "limit")),
    Request("errors_limit_over_the_kept_errors", "GET",
            "/v1/batches/@BATCH@/errors?limit=10001", Refused(400, "max_value", "limit")),
    Request("errors_after_a_negative_line", "GET", "/v1/batches/@BATCH@/errors?after=-1",
            Refused(400, "min_value", "after")),
    Request("errors_after_not_a_line_number", "GET",
            "/v1/batches/@BATCH@/errors?after=batch_x", Refused(400, None, "after")),
    Request("errors_after_sql", "GET", "/v1/batches/@BATCH@/errors?after=1%20OR%201%3D1",
            Refused(400, param="after")),
    Request("errors_of_a_batch_without_bad_lines", "GET", "/v1/batches/@BATCH@/errors",
            Answered()),
    # Offsets must start a line of the output (OUTPUT_LINES: lines of 20 and 21 bytes).
    Request("output_offset_inside_the_first_line", "GET",
            "/v1/batches/@BATCH_WITH_OUTPUT@/output?offset=5",
            Refused(400, "offset_not_at_line_start", "offset")),
    Request("output_offset_on_the_last_byte_of_a_line", "GET",
            "/v1/batches/@BATCH_WITH_OUTPUT@/output?offset=19",
            Refused(400, "offset_not_at_line_start", "offset")),
    Request("output_offset_inside_the_last_line", "GET",
            "/v1/batches/@BATCH_WITH_OUTPUT@/output?offset=30",
            Refused(400, "offset_not_at_line_start", "offset")),
    Request("output_offset_past_the_whole_lines", "GET",
            "/v1/batches/@BATCH_WITH_OUTPUT@/output?offset=42", Refused(400, param="offset")),
    Request("output_offset_negative", "GET", "/v1/batches/@BATCH@/output?offset=-1",
            Refused(400, param="offset")),
    Request("output_offset_huge", "GET", "/v1/batches/@BATCH@/output?offset=" + "9" * 40,
            Refused(400, param="offset")),
]



# --- raw HTTP, as the web server reads it -----------------------------------------------------


_UPLOAD_HEAD = f"POST /v1/files HTTP/1.1\nContent-Type: {MULTIPART}"
_CREATE_HEAD = "POST /v1/batches HTTP/1.1\nContent-Type: application/json"
_CHUNKED = "\nTransfer-Encoding: chunked"


def _upload_of(content: bytes) -> Callable[[], bytes]:
    return lambda: multipart(fields={"purpose": "batch"}, files=[("file", "in.jsonl", content)])


RAW_HTTP: list[RawHttp] = [
    # gunicorn's own refusals, in the envelope (they were gunicorn's HTML pages).
    RawHttp("url_of_10000_characters", f"GET /v1/files/{'i' * 10_000} HTTP/1.1",
            Refused(414, "uri_too_long")),
    RawHttp("request_line_garbage", "HELLO", Refused(400, "bad_request")),
    RawHttp("request_line_without_version", "GET /health", Refused(400, "bad_request")),
    RawHttp("http_version_9", "GET /health HTTP/9.9", Refused(400, "bad_request")),
    RawHttp("method_lowercase", "get /health HTTP/1.1", Refused(400, "bad_request")),
    RawHttp("header_of_9000_bytes", f"GET /health HTTP/1.1\nX-Big: {'b' * 9000}",
            Refused(431, "headers_too_large")),
    RawHttp("header_fields_101", "GET /health HTTP/1.1\n" + "\n".join(
        f"X-H{i}: v" for i in range(101)), Refused(431, "headers_too_large")),
    RawHttp("header_name_with_a_space", "GET /health HTTP/1.1\nBad Name: v",
            Refused(400, "bad_request")),
    # gunicorn answered nothing at all to this one (its access log raised).
    RawHttp("content_length_not_a_number", f"{_CREATE_HEAD}\nContent-Length: ten",
            Refused(400, "bad_request")),
    RawHttp("content_length_and_chunked", f"{_CREATE_HEAD}\nContent-Length: 5{_CHUNKED}",
            Refused(400, "bad_request"), _raw(b"{}"), chunk_size=100),
    RawHttp("transfer_encoding_unknown", f"{_CREATE_HEAD}\nTransfer-Encoding: foo, chunked",
            Refused(501, "not_implemented"), _raw(b"{}"), chunk_size=100),
    # gunicorn passes gzip on, compressed; Django read it as garbage.
    RawHttp("transfer_encoding_gzip", f"{_CREATE_HEAD}\nTransfer-Encoding: gzip, chunked",
            Refused(501, "not_implemented"), lambda: gzip.compress(b"{}"), chunk_size=100),
    # Chunked bodies: read like any other, within the same limits (they were read as
    # empty: "No file was submitted", "input_file_id: This field is required").
    RawHttp("chunked_upload", _UPLOAD_HEAD + _CHUNKED, Answered(200, "file"),
            _upload_of(GOOD_LINE), chunk_size=100),
    RawHttp("chunked_batch_create", _CREATE_HEAD + _CHUNKED, Answered(200, "batch"),
            _with_file(endpoint=CHAT), chunk_size=10),
    RawHttp("chunked_batch_create_without_a_file", _CREATE_HEAD + _CHUNKED,
            Refused(400, "required", "input_file_id"), _json({"endpoint": CHAT}),
            chunk_size=10),
    RawHttp("chunked_upload_without_a_file", _UPLOAD_HEAD + _CHUNKED,
            Refused(400, "required", "file"), lambda: multipart(fields={"purpose": "batch"}),
            chunk_size=100),
    RawHttp("chunked_json_over_the_body_limit", _CREATE_HEAD + _CHUNKED,
            Refused(413, "request_too_large"),
            _json({"input_file_id": "@FILE@", "metadata": {"k": "v" * (2 * MiB + 1)}}),
            chunk_size=64 * 1024),
    # The runner's server allows uploads of RAW_HTTP_MAX_UPLOAD_BYTES.
    RawHttp("chunked_upload_over_the_upload_limit", _UPLOAD_HEAD + _CHUNKED,
            Refused(413, "file_too_large", "file"),
            _upload_of(GOOD_LINE * (MiB // len(GOOD_LINE) + 1000)), chunk_size=64 * 1024),
    RawHttp("chunked_bad_chunk_size", _CREATE_HEAD + _CHUNKED, Refused(400, "parse_error"),
            _raw(b"zz\r\n{}\r\n0\r\n\r\n")),
    RawHttp("chunked_upload_with_a_bad_chunk_size", _UPLOAD_HEAD + _CHUNKED,
            Refused(400, "parse_error"),
            lambda: b"64\r\n" + _upload_of(GOOD_LINE)()[:100] + b"\r\nzz\r\nxx\r\n0\r\n\r\n"),
]
RAW_HTTP_MAX_UPLOAD_BYTES = MiB

ALL_CASES = [*INPUT_FILES, *UPLOADS, *CREATES, *REQUESTS]


# --- races: two mutating calls on one object at the same moment -----------------------------


@dataclass(frozen=True)
class Call:
    """An API call; `@FILE@` and `@BATCH@` stand for the race's file and batch."""

    method: str
    path: str
    body: dict | None = None


@dataclass(frozen=True)
class Race:
    """Two calls sent at once on threads of their own, `trials` times, each time on a
    fresh `subject`: a good input `file`, a `validating` batch or a `running` one (with
    its file). The two answers, as (status, error code or None), must be one of
    `outcomes`: one call wins, the other gets a clear 4xx, never a 5xx."""

    name: str
    subject: str
    calls: tuple[Call, Call]
    outcomes: frozenset[tuple[tuple[int, str | None], tuple[int, str | None]]]
    trials: int = 10


OK = (200, None)


def either_wins(winner_a: tuple, loser_b: tuple, winner_b: tuple, loser_a: tuple) -> frozenset:
    return frozenset({(winner_a, loser_b), (loser_a, winner_b)})


CREATE = Call("POST", "/v1/batches", {"input_file_id": "@FILE@"})
DELETE_FILE = Call("DELETE", "/v1/files/@FILE@")
CANCEL = Call("POST", "/v1/batches/@BATCH@/cancel")
NOT_CANCELLABLE = (400, "batch_not_cancellable")

RACES: list[Race] = [
    Race("create_a_batch_and_delete_its_file", "file", (CREATE, DELETE_FILE),
         either_wins(OK, (400, "file_in_use"), OK, (400, "invalid_input_file")), trials=20),
    Race("create_two_batches_on_one_file", "file", (CREATE, CREATE),
         either_wins(OK, (400, "duplicate_batch"), OK, (400, "duplicate_batch"))),
    Race("delete_one_file_twice", "file", (DELETE_FILE, DELETE_FILE),
         either_wins(OK, (404, "not_found"), OK, (404, "not_found"))),
    Race("cancel_a_validating_batch_twice", "validating", (CANCEL, CANCEL),
         either_wins(OK, NOT_CANCELLABLE, OK, NOT_CANCELLABLE)),
    # The second cancel sees the first under way (200) or done (400).
    Race("cancel_a_running_batch_twice", "running", (CANCEL, CANCEL),
         frozenset({(OK, OK), (OK, NOT_CANCELLABLE), (NOT_CANCELLABLE, OK)})),
    # The file is free once the batch is cancelled, not before.
    Race("cancel_a_running_batch_and_delete_its_file", "running", (CANCEL, DELETE_FILE),
         frozenset({(OK, OK), (OK, (400, "file_in_use"))})),
    Race("cancel_a_validating_batch_and_create_another_on_its_file", "validating",
         (CANCEL, CREATE), frozenset({(OK, OK), (OK, (400, "duplicate_batch"))})),
]
