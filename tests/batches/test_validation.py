"""Streaming validation of input files (batches.validation), without the database."""

from __future__ import annotations

import json

import pytest

from batches.input_file import BOM, read_chunk
from batches.validation import validate_file
from tests.conftest import chat_line, completion_line, jsonl

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MAX_LINE = 4096


def validate(tmp_path, content: bytes, *, endpoint: str = CHAT, chunk_size: int = 100,
             max_line_bytes: int = MAX_LINE, max_requests: int = 1_000_000):
    path = tmp_path / "input.jsonl"
    path.write_bytes(content)
    return validate_file(path, endpoint=endpoint, chunk_size=chunk_size,
                         max_line_bytes=max_line_bytes, max_requests=max_requests)


def with_body(**body) -> dict:
    line = chat_line("x")
    line["body"] = body
    return line


def chat_with(**fields) -> dict:
    line = chat_line("x")
    line["body"].update(fields)
    return line


BAD_CHAT_LINES = [
    pytest.param(b"{not json", "invalid_json", None, id="not-json"),
    pytest.param(b"[1, 2]", "invalid_json", None, id="array"),
    pytest.param(b'"a string"', "invalid_json", None, id="string"),
    pytest.param({k: v for k, v in chat_line("x").items() if k != "custom_id"},
                 "missing_custom_id", "custom_id", id="no-custom-id"),
    pytest.param({**chat_line("x"), "custom_id": ""}, "missing_custom_id", "custom_id",
                 id="empty-custom-id"),
    pytest.param({**chat_line("x"), "custom_id": 7}, "invalid_custom_id", "custom_id",
                 id="int-custom-id"),
    pytest.param({**chat_line("x"), "custom_id": "c" * 513}, "invalid_custom_id", "custom_id",
                 id="long-custom-id"),
    pytest.param({**chat_line("x"), "method": "GET"}, "invalid_method", "method", id="get"),
    pytest.param({k: v for k, v in chat_line("x").items() if k != "method"},
                 "invalid_method", "method", id="no-method"),
    pytest.param({**chat_line("x"), "url": COMPLETIONS}, "invalid_url", "url",
                 id="other-endpoint"),
    pytest.param({**chat_line("x"), "url": "/v1/moderations"}, "invalid_url", "url",
                 id="unknown-url"),
    pytest.param({k: v for k, v in chat_line("x").items() if k != "url"},
                 "invalid_url", "url", id="no-url"),
    pytest.param({**chat_line("x"), "body": "text"}, "invalid_body", "body", id="body-string"),
    pytest.param({k: v for k, v in chat_line("x").items() if k != "body"},
                 "invalid_body", "body", id="no-body"),
    pytest.param(with_body(messages=[{"role": "user", "content": "hi"}]),
                 "invalid_body", "body.model", id="no-model"),
    pytest.param(with_body(model="m"), "invalid_body", "body.messages", id="no-messages"),
    pytest.param(with_body(model="m", messages=[]), "invalid_body", "body.messages",
                 id="empty-messages"),
    pytest.param(with_body(model="m", messages=[{"content": "hi"}]), "invalid_body",
                 "body.messages[0].role", id="message-without-role"),
    pytest.param(with_body(model="m", messages=["hi"]), "invalid_body",
                 "body.messages[0]", id="message-a-string"),
    *[pytest.param(with_body(model="m", messages=messages), "invalid_body", param, id=name)
      for name, messages, param in [
          ("role-wizard", [{"role": "wizard", "content": "hi"}], "body.messages[0].role"),
          ("role-function", [{"role": "function", "name": "f", "content": "1"}],
           "body.messages[0].role"),
          ("role-uppercase", [{"role": "User", "content": "hi"}], "body.messages[0].role"),
          ("content-number", [{"role": "user", "content": 123}], "body.messages[0].content"),
          ("content-missing", [{"role": "user"}], "body.messages[0].content"),
          ("content-null", [{"role": "system", "content": None}], "body.messages[0].content"),
          ("content-object", [{"role": "user", "content": {"text": "hi"}}],
           "body.messages[0].content"),
          ("content-empty-list", [{"role": "user", "content": []}],
           "body.messages[0].content"),
          ("content-part-string", [{"role": "user", "content": ["hi"]}],
           "body.messages[0].content[0]"),
          ("content-part-without-type", [{"role": "user", "content": [{"text": "hi"}]}],
           "body.messages[0].content[0]"),
          ("text-part-without-text", [{"role": "user", "content": [{"type": "text"}]}],
           "body.messages[0].content[0].text"),
          ("assistant-without-content-or-tool-calls", [{"role": "assistant"}],
           "body.messages[0].content"),
          ("assistant-with-empty-tool-calls", [{"role": "assistant", "tool_calls": []}],
           "body.messages[0].content"),
          ("assistant-tool-calls-not-a-list",
           [{"role": "assistant", "content": "x", "tool_calls": {"id": "c"}}],
           "body.messages[0].tool_calls"),
          ("tool-without-tool-call-id", [{"role": "tool", "content": "42"}],
           "body.messages[0].tool_call_id"),
          ("tool-call-id-number", [{"role": "tool", "content": "42", "tool_call_id": 7}],
           "body.messages[0].tool_call_id"),
          ("second-message-content-number",
           [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 5}],
           "body.messages[1].content"),
      ]],
    pytest.param(with_body(model="m", messages="hi"), "invalid_body", "body.messages",
                 id="messages-string"),
    pytest.param(chat_with(temperature=-0.5), "invalid_body", "body.temperature",
                 id="negative-temperature"),
    pytest.param(chat_with(temperature="warm"), "invalid_body", "body.temperature",
                 id="string-temperature"),
    *[pytest.param(chat_with(**{key: value}), "invalid_body", f"body.{key}",
                   id=f"{key}-{value}")
      for key, value in [("temperature", 2.01), ("temperature", 5), ("presence_penalty", -2.5),
                         ("presence_penalty", 3), ("frequency_penalty", 2.1),
                         ("frequency_penalty", "high"), ("top_logprobs", 21),
                         ("top_logprobs", -1), ("top_logprobs", 1.5), ("seed", 1.5),
                         ("seed", "7"), ("seed", 2**63)]],
    pytest.param(chat_with(top_p=0), "invalid_body", "body.top_p", id="top-p-0"),
    pytest.param(chat_with(top_p=1.5), "invalid_body", "body.top_p", id="top-p-1.5"),
    pytest.param(chat_with(top_k=-2), "invalid_body", "body.top_k", id="top-k-minus-2"),
    pytest.param(chat_with(top_k=2.5), "invalid_body", "body.top_k", id="top-k-float"),
    pytest.param(chat_with(max_tokens=0), "invalid_body", "body.max_tokens", id="max-tokens-0"),
    pytest.param(chat_with(max_tokens="10"), "invalid_body", "body.max_tokens",
                 id="max-tokens-string"),
    pytest.param(chat_with(max_tokens=True), "invalid_body", "body.max_tokens",
                 id="max-tokens-bool"),
    pytest.param(chat_with(max_completion_tokens=-1), "invalid_body",
                 "body.max_completion_tokens", id="max-completion-tokens-negative"),
    pytest.param(chat_with(n=129), "invalid_body", "body.n", id="n-over-128"),
    pytest.param(chat_with(n=0), "invalid_body", "body.n", id="n-0"),
    pytest.param(chat_with(stream=True), "invalid_body", "body.stream", id="stream"),
]


@pytest.mark.parametrize("line, code, param", BAD_CHAT_LINES)
def test_a_bad_line_is_reported_with_its_code_param_and_line_number(tmp_path, line, code, param):
    content = jsonl([chat_line("ok-1"), line, chat_line("ok-2")])

    report = validate(tmp_path, content)

    assert report.invalid == 1
    assert len(report.errors) == 1
    error = report.errors[0]
    assert set(error) == {"code", "message", "line", "param"}
    assert (error["code"], error["line"], error["param"]) == (code, 2, param)
    assert error["message"]


BAD_COMPLETION_LINES = [
    pytest.param({**completion_line("x"), "body": {"model": "m"}}, "body.prompt", id="no-prompt"),
    pytest.param(completion_line("x", prompt=[]), "body.prompt", id="empty-list"),
    pytest.param(completion_line("x", prompt=[True, False]), "body.prompt", id="bools"),
    pytest.param(completion_line("x", prompt=12), "body.prompt", id="number"),
    pytest.param({**completion_line("x"), "body": {"prompt": "p"}}, "body.model", id="no-model"),
]


@pytest.mark.parametrize("line, param", BAD_COMPLETION_LINES)
def test_a_bad_completions_body_is_invalid_body(tmp_path, line, param):
    report = validate(tmp_path, jsonl([line]), endpoint=COMPLETIONS)

    assert [(e["code"], e["line"], e["param"]) for e in report.errors] == [
        ("invalid_body", 1, param)]


@pytest.mark.parametrize("line", [
    completion_line("x", prompt="text"),
    completion_line("x", prompt=["one", "two"]),
    completion_line("x", prompt=[1, 2, 3]),
], ids=["string", "strings", "token-ids"])
def test_completions_prompts_may_be_text_or_token_lists(tmp_path, line):
    report = validate(tmp_path, jsonl([line]), endpoint=COMPLETIONS)

    assert (report.invalid, report.total) == (0, 1)


@pytest.mark.parametrize("fields", [
    {"top_k": -1}, {"top_k": 0}, {"top_p": 1}, {"temperature": 0}, {"temperature": 2},
    {"max_tokens": 1}, {"n": 1}, {"stream": False}, {"temperature": None},
    {"presence_penalty": -2}, {"presence_penalty": 2}, {"frequency_penalty": 0.5},
    {"top_logprobs": 0}, {"top_logprobs": 20}, {"seed": -1}, {"seed": 2**63 - 1},
])
def test_edge_values_of_sampling_parameters_are_accepted(tmp_path, fields):
    report = validate(tmp_path, jsonl([chat_with(**fields)]))

    assert report.errors == []


@pytest.mark.parametrize("messages", [
    [{"role": role, "content": "hi"} for role in ("system", "developer", "user")],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                  {"type": "image_url",
                                   "image_url": {"url": "data:image/png;base64,AA=="}}]}],
    [{"role": "user", "content": [{"type": "input_audio",
                                   "input_audio": {"data": "AA==", "format": "wav"}}]}],
    [{"role": "user", "content": "weather?"},
     {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                           "function": {"name": "w", "arguments": "{}"}}]},
     {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
    [{"role": "assistant", "content": None,
      "tool_calls": [{"id": "c1", "type": "function",
                      "function": {"name": "w", "arguments": "{}"}}]}],
    [{"role": "assistant", "function_call": {"name": "w", "arguments": "{}"}}],
    [{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}],
    [{"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]}],
], ids=["system-developer-user", "empty-string", "text-and-image-parts", "audio-part",
        "tool-call-round-trip", "assistant-null-content-with-tool-calls",
        "assistant-function-call", "refusal-part", "tool-text-parts"])
def test_every_message_shape_openai_takes_is_accepted(tmp_path, messages):
    report = validate(tmp_path, jsonl([chat_with(messages=messages)]))

    assert (report.errors, report.total) == ([], 1)


def test_chat_line_in_a_completions_batch_is_invalid_url(tmp_path):
    report = validate(tmp_path, jsonl([chat_line("a")]), endpoint=COMPLETIONS)

    assert [(e["code"], e["line"]) for e in report.errors] == [("invalid_url", 1)]


def test_duplicate_custom_id_is_reported_on_its_second_occurrence(tmp_path):
    content = jsonl([chat_line("a"), chat_line("b"), chat_line("a"), chat_line("a")])

    report = validate(tmp_path, content)

    assert [(e["code"], e["line"]) for e in report.errors] == [
        ("duplicate_custom_id", 3), ("duplicate_custom_id", 4)]
    assert report.total == 2


def test_line_too_long_is_reported_and_the_next_lines_still_checked(tmp_path):
    long_line = json.dumps(chat_line("long", "x" * 500)).encode()
    content = jsonl([chat_line("a"), long_line, b"{bad", chat_line("b")])

    report = validate(tmp_path, content, max_line_bytes=300)

    assert [(e["code"], e["line"]) for e in report.errors] == [
        ("line_too_long", 2), ("invalid_json", 3)]
    assert report.total == 2


def test_every_bad_line_is_listed_with_its_own_number(tmp_path):
    content = jsonl([
        chat_line("a"),                                  # 1 ok
        b"{oops",                                        # 2
        {**chat_line("b"), "method": "PUT"},             # 3
        chat_line("c"),                                  # 4 ok
        {**chat_line("a")},                              # 5 duplicate of 1
        {**chat_line("d"), "url": COMPLETIONS},          # 6
    ])

    report = validate(tmp_path, content)

    assert [(e["code"], e["line"]) for e in report.errors] == [
        ("invalid_json", 2), ("invalid_method", 3), ("duplicate_custom_id", 5),
        ("invalid_url", 6)]
    assert report.invalid == 4


def test_bom_crlf_and_blank_lines_are_accepted_and_line_numbers_count_blanks(tmp_path):
    lines = [json.dumps(chat_line(c)).encode() for c in ("a", "b", "c")]
    content = BOM + lines[0] + b"\r\n\r\n   \r\n" + lines[1] + b"\r\n\n" + lines[2] + b"\r\n{x\r\n"

    report = validate(tmp_path, content)

    assert report.total == 3
    assert [(e["code"], e["line"]) for e in report.errors] == [("invalid_json", 7)]


def test_last_line_without_a_newline_counts(tmp_path):
    content = jsonl([chat_line("a")]) + json.dumps(chat_line("b")).encode()

    report = validate(tmp_path, content, chunk_size=1)

    assert report.total == 2
    assert report.chunks[-1].end_offset == len(content)


def test_a_file_of_blank_lines_has_no_requests(tmp_path):
    report = validate(tmp_path, b"\n\r\n   \n\n")

    assert (report.total, report.invalid, report.chunks) == (0, 0, [])


def test_more_requests_than_allowed_is_an_error(tmp_path):
    content = jsonl([chat_line(f"r{i}") for i in range(5)])

    report = validate(tmp_path, content, max_requests=3)

    assert [(e["code"], e["line"]) for e in report.errors] == [("too_many_requests", 4)]


# --- chunk spans ---------------------------------------------------------------------------


def read_all(tmp_path, report) -> list[list[str]]:
    path = tmp_path / "input.jsonl"
    return [[r["custom_id"] for r in read_chunk(path, start=c.start_offset, end=c.end_offset,
                                                  max_line_bytes=MAX_LINE)]
            for c in report.chunks]


def test_chunks_are_contiguous_and_cover_every_line_once(tmp_path):
    content = jsonl([chat_line(f"r{i}", "y" * i) for i in range(7)])

    report = validate(tmp_path, content, chunk_size=3)

    spans = [(c.start_offset, c.end_offset, c.first_line, c.count) for c in report.chunks]
    assert [s[2:] for s in spans] == [(1, 3), (4, 3), (7, 1)]
    assert spans[0][0] == 0
    assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))
    assert spans[-1][1] == len(content)
    assert read_all(tmp_path, report) == [["r0", "r1", "r2"], ["r3", "r4", "r5"], ["r6"]]


def test_chunks_skip_blank_lines_and_read_back_through_bom_and_crlf(tmp_path):
    lines = [json.dumps(chat_line(f"r{i}")).encode() for i in range(5)]
    content = BOM + lines[0] + b"\r\n\n" + lines[1] + b"\r\n" + lines[2] + b"\n\n\n" \
        + lines[3] + b"\n" + lines[4] + b"\n\n"

    report = validate(tmp_path, content, chunk_size=2)

    assert [c.count for c in report.chunks] == [2, 2, 1]
    assert [c.first_line for c in report.chunks] == [1, 4, 8]
    assert read_all(tmp_path, report) == [["r0", "r1"], ["r2", "r3"], ["r4"]]


@pytest.mark.parametrize(("limits", "default", "mean"), [
    ([16, 48], None, 32.0),  # max_tokens on every line
    ([16, None], 100, 58.0),  # a line without one takes the batch's max_decoding_length
    ([16, None], None, None),  # unknown: no prior
    ([None, None], 64, 64.0),
])
def test_the_lines_output_limits_give_the_batch_s_mean_limit(tmp_path, limits, default, mean):
    lines = [chat_line(f"c{i}", **({"max_tokens": limit} if limit else {}))
             for i, limit in enumerate(limits)]
    if limits[0]:  # chat's own name counts as max_tokens does
        lines[0]["body"]["max_completion_tokens"] = lines[0]["body"].pop("max_tokens")
    report = validate(tmp_path, jsonl(lines))
    assert report.output_limit_mean(default) == mean
