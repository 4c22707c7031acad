"""The msgspec fast path never accepts a line the rule-by-rule checks refuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batches.line_schema import DECODERS, DecodeError
from batches.validation import LineError, parse_line

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "inputs"
ENDPOINTS = ["/v1/chat/completions", "/v1/completions"]


def corpus_lines() -> list[bytes]:
    lines = []
    for path in sorted(CORPUS.glob("*.jsonl")):
        lines += [line for line in path.read_bytes().splitlines() if line.strip()]
    return lines


def variants() -> list[bytes]:
    base = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}
    odd_values = [None, True, False, 0, 1, -1, 1.0, 0.5, 2, 1e999, -0.0, "", "x", [], {},
                  [1], ["a"], 10**20, -(10**20), [10**20], [True], [1.5], [None]]
    out = []
    for key in ("max_tokens", "temperature", "top_p", "top_k", "n", "stream", "model",
                "messages", "prompt", "max_completion_tokens"):
        for value in odd_values:
            line = json.loads(json.dumps(base))
            line["body"][key] = value
            out.append(json.dumps(line).encode())
            line["url"] = "/v1/completions"
            line["body"].setdefault("prompt", "p")
            out.append(json.dumps(line).encode())
    for key in ("custom_id", "method", "url", "body"):
        for value in odd_values + ["POST", "a" * 513]:
            line = json.loads(json.dumps(base))
            line[key] = value
            out.append(json.dumps(line).encode())
    return out


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_fast_path_is_never_more_lenient(endpoint):
    lines = corpus_lines() + variants()
    assert len(lines) > 300
    accepted_fast = 0
    for raw in lines:
        try:
            fast = DECODERS[endpoint].decode(raw)
        except DecodeError:
            continue
        accepted_fast += 1
        try:
            item = parse_line(raw, endpoint=endpoint)
        except LineError as error:
            pytest.fail(f"fast path accepted what the checks refuse ({error.code}): {raw[:200]!r}")
        assert item["custom_id"] == fast.custom_id
    assert accepted_fast > 0
