from __future__ import annotations

import orjson

from inference.output import format_line
from serving.engines.base import EngineResult


def test_success_line_has_the_batch_api_shape():
    body = {"object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 1,
            "completion_tokens": 2, "total_tokens": 3}}
    line = format_line("req-1", EngineResult(body=body))

    assert line.endswith(b"\n") and line.count(b"\n") == 1
    item = orjson.loads(line)
    assert set(item) == {"id", "custom_id", "response", "error"}
    assert item["id"].startswith("batch_req_") and item["custom_id"] == "req-1"
    assert item["error"] is None
    assert item["response"]["status_code"] == 200
    assert item["response"]["request_id"].startswith("req_")
    assert item["response"]["body"] == body


def test_error_line_has_no_response():
    line = format_line("req-5", EngineResult.failure(
        "context_length_exceeded", "Prompt length 200000 exceeds model context 131072"))

    item = orjson.loads(line)
    assert item["response"] is None
    assert item["error"] == {"code": "context_length_exceeded",
                             "message": "Prompt length 200000 exceeds model context 131072"}


def test_each_line_gets_its_own_ids():
    first = orjson.loads(format_line("a", EngineResult(body={})))
    second = orjson.loads(format_line("a", EngineResult(body={})))
    assert first["id"] != second["id"]
    assert first["response"]["request_id"] != second["response"]["request_id"]


def test_unicode_and_line_separators_stay_on_one_line():
    line = format_line("ü\u2028id", EngineResult(body={"text": "a\nb\u2028c"}))
    assert line.count(b"\n") == 1
    assert orjson.loads(line)["response"]["body"]["text"] == "a\nb\u2028c"
