"""The msgspec fast path never accepts a line the rule-by-rule checks refuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batches.validation import parse_line
from serving.endpoints import ENDPOINTS, endpoint_spec
from serving.endpoints.chat import ROLES
from serving.line_checks import LineError
from serving.line_schema import DecodeError
from serving.params import SAMPLING_BOUNDS

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "inputs"
ABSENT = object()


def corpus_lines() -> list[bytes]:
    lines = []
    for path in sorted(CORPUS.glob("*.jsonl")):
        lines += [line for line in path.read_bytes().splitlines() if line.strip()]
    return lines


def variants() -> list[bytes]:
    base = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}
    # Around every bound of the table (serving.params.SAMPLING_BOUNDS) and past 64 bits.
    odd_values = [None, True, False, 0, 1, -1, 1.0, 0.5, 2, 2.0, 2.01, -2, -2.01, 3, 20, 21,
                  1e999, -0.0, "", "x", "1", [], {}, [1], ["a"], 10**20, -(10**20), 2**63 - 1,
                  2**63, -(2**63), -(2**63) - 1, [10**20], [True], [1.5], [None]]
    out = []
    for key in (*SAMPLING_BOUNDS, "n", "stream", "model", "messages", "prompt"):
        for value in odd_values:
            line = json.loads(json.dumps(base))
            line["body"][key] = value
            out.append(json.dumps(line).encode())
            line["url"] = "/v1/completions"
            line["body"].setdefault("prompt", "p")
            out.append(json.dumps(line).encode())
    for messages in odd_messages():
        line = json.loads(json.dumps(base))
        line["body"]["messages"] = messages
        out.append(json.dumps(line).encode())
    for text in ("hi", ["a", "b"]):
        embedding = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings",
                     "body": {"model": "m", "input": text}}
        for key in ("input", "encoding_format", "dimensions", "model", "temperature"):
            for value in [*odd_values, "float", "base64", "bytes", ["a", "b"], ["a", ""],
                          [[1, 2], [3]], [[1], []], [[1, "a"]], [1, "a"], [-1], [[-1]]]:
                line = json.loads(json.dumps(embedding))
                line["body"][key] = value
                out.append(json.dumps(line).encode())
    scoring_values = [*odd_values, ["a", "b"], ["a", ""], ["a", "b", "c"], "doc",
                      {"content": [{"type": "text", "text": "a"}]}, {"content": []}, [{}]]
    score_forms = [{"text_1": "q", "text_2": ["a", "b"]}, {"queries": ["q", "r"],
                                                          "documents": ["a", "b"]},
                   {"queries": "q", "items": ["a"]}, {"data_1": "q", "data_2": "a"}, {}]
    for url in ("/v1/score", "/score"):
        for form in score_forms:
            for key in ("text_1", "text_2", "queries", "documents", "items", "model",
                        "truncate_prompt_tokens", "max_tokens_per_query", "use_activation",
                        "instruction"):
                for value in scoring_values:
                    line = {"custom_id": "s", "method": "POST", "url": url,
                            "body": {"model": "m", **form, key: value}}
                    out.append(json.dumps(line).encode())
    for url in ("/v1/rerank", "/rerank"):
        for key in ("query", "documents", "top_n", "return_documents", "model",
                    "max_tokens_per_doc", "temperature"):
            for value in scoring_values:
                line = {"custom_id": "r", "method": "POST", "url": url,
                        "body": {"model": "m", "query": "q", "documents": ["a", "b"],
                                 key: value}}
                out.append(json.dumps(line).encode())
    # Good options, in combination: the fast path's own share.
    for truncate in (None, -1, 0, 5):
        for flag in (None, True, False):
            for count in (None, 1, 2, 5):
                options = {"truncate_prompt_tokens": truncate, "use_activation": flag}
                for url in ("/v1/score", "/score"):
                    for form in score_forms[:2]:
                        body = {"model": "m", **form, **options,
                                "max_tokens_per_query": count}
                        out.append(json.dumps({"custom_id": "s", "method": "POST",
                                               "url": url, "body": body}).encode())
                for url in ("/v1/rerank", "/rerank"):
                    body = {"model": "m", "query": "q", "documents": ["a", "b"], **options,
                            "top_n": count, "return_documents": flag}
                    out.append(json.dumps({"custom_id": "r", "method": "POST", "url": url,
                                           "body": body}).encode())
    items = [{"role": "user", "content": "hi"}, {"type": "message", "role": "developer",
                                                 "content": [{"type": "input_text", "text": "a"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "b"}]}]
    odd_items = [[], [None], ["hi"], [{"role": "user"}], [{"role": "tool", "content": "x"}],
                 [{"role": "user", "content": []}], [{"role": "user", "content": 5}],
                 [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
                 [{"role": "user", "content": [{"type": "input_text"}]}],
                 [{"role": "user", "content": "a", "type": "function_call"}],
                 [{"role": "user", "content": "a", "type": None}], items]
    formats = [{"type": "text"}, {"type": "json_object"}, {"type": "xml"}, {"type": None},
               {"type": "json_schema", "name": "a", "schema": {}},
               {"type": "json_schema", "name": "a"}, {"type": "json_schema", "schema": {}},
               {"type": "json_schema", "name": "a", "schema": {}, "strict": "yes"},
               {"type": "json_schema", "name": 5, "schema": {}, "description": 5}]
    for text in ("hi", items):
        response = {"custom_id": "r", "method": "POST", "url": "/v1/responses",
                    "body": {"model": "m", "input": text}}
        for key in ("input", "instructions", "max_output_tokens", "temperature", "top_p",
                    "seed", "text", "reasoning", "metadata", "user", "store", "stream",
                    "background", "previous_response_id", "tools", "conversation"):
            for value in [*odd_values, *odd_items, *({"format": f} for f in formats),
                          {"format": None}, {"effort": "low"}, {"effort": "extreme"},
                          {"summary": "auto", "effort": None}, {"a": "b"}, {"a": 1},
                          {"k" * 65: "v"}, {f"k{i}": "v" for i in range(17)},
                          [{"type": "function", "name": "f"}], [{"type": "web_search"}]]:
                line = json.loads(json.dumps(response))
                line["body"][key] = value
                out.append(json.dumps(line).encode())
    for key in ("custom_id", "method", "url", "body"):
        for value in odd_values + ["POST", "a" * 513]:
            line = json.loads(json.dumps(base))
            line[key] = value
            out.append(json.dumps(line).encode())
    return out


def odd_messages() -> list[list]:
    """Each role with each kind of content, tool fields present, absent and wrong."""
    contents = [ABSENT, None, "", "hi", 5, [], {}, ["hi"], [{"type": "text", "text": "a"}],
                [{"type": "text"}], [{"type": "text", "text": 5}], [{"text": "a"}],
                [{"type": "image_url", "image_url": {"url": "u"}}], [{"type": "image_url"}],
                [{"type": "input_audio"}], [{"type": 5}]]
    extras = [{}, {"tool_calls": [{"id": "c"}]}, {"tool_calls": []}, {"tool_calls": None},
              {"tool_calls": "c"}, {"function_call": {"name": "f"}}, {"tool_call_id": "c"},
              {"tool_call_id": 7}, {"tool_call_id": None}]
    messages = []
    for role in (*ROLES, "function", "wizard", "", None, 5, ABSENT):
        for content in contents:
            for extra in extras:
                message = {**extra}
                if role is not ABSENT:
                    message["role"] = role
                if content is not ABSENT:
                    message["content"] = content
                messages.append([message])
    return messages + [[], ["hi"], [None], [{"role": "user", "content": "a"}, 5]]


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))  # every registered endpoint
def test_fast_path_is_never_more_lenient(endpoint):
    lines = corpus_lines() + variants()
    assert len(lines) > 3000
    accepted_fast = 0
    for raw in lines:
        try:
            fast = endpoint_spec(endpoint).decoder.decode(raw)
        except DecodeError:
            continue
        accepted_fast += 1
        try:
            item = parse_line(raw, endpoint=endpoint)
        except LineError as error:
            pytest.fail(f"fast path accepted what the checks refuse ({error.code}): {raw[:200]!r}")
        assert item["custom_id"] == fast.custom_id
    # The fast path takes the common shapes itself: it is what keeps validation fast.
    assert accepted_fast > 100
