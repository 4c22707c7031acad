"""The request fields vLLM serves beyond one greedy answer: n choices, structured
output, logprobs, seed. Validation and the simulated engine here; the real engine in
tests/inference/test_vllm_request_surface.py."""

import asyncio

import pytest

from batches.validation import check_body
from inference.engines.simulated import SimulatedEngine
from serving.engines.base import EngineConfig, EngineRequest
from serving.line_checks import LineError

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {
    "name": "person", "schema": {"type": "object", "properties": {"age": {"type": "integer"}},
                                 "required": ["age"]}}}


def chat_body(**fields):
    return {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}


def simulated(endpoint, body):
    engine = SimulatedEngine(EngineConfig(engine="simulated", model="m",
                                          served_model_name="m"))
    return asyncio.run(engine.generate(EngineRequest("r", "a", endpoint, body)))


@pytest.mark.parametrize("endpoint, body", [
    (CHAT, chat_body(n=3)),
    (COMPLETIONS, {"model": "m", "prompt": "Hi", "n": 3}),
])
def test_n_choices_come_in_one_output_body_with_usage_summed(endpoint, body):
    one = simulated(endpoint, {**body, "n": 1})
    three = simulated(endpoint, body)

    assert [choice["index"] for choice in three.body["choices"]] == [0, 1, 2]
    assert three.completion_tokens == 3 * one.completion_tokens
    assert three.body["usage"]["completion_tokens"] == 3 * one.completion_tokens


@pytest.mark.parametrize("fields", [
    {"n": 128}, {"seed": 7, "temperature": 0.9}, {"logprobs": True, "top_logprobs": 5},
    {"response_format": {"type": "json_object"}}, {"response_format": {"type": "text"}},
    {"response_format": SCHEMA_FORMAT},
])
def test_the_request_surface_vllm_serves_passes_validation(fields):
    check_body(chat_body(**fields), endpoint=CHAT)


@pytest.mark.parametrize("fields, param", [
    ({"n": 129}, "body.n"),
    ({"n": 0}, "body.n"),
    ({"logprobs": "yes"}, "body.logprobs"),
    ({"response_format": "json"}, "body.response_format"),
    ({"response_format": {"type": "json_schema"}}, "body.response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": []}}},
     "body.response_format.json_schema.schema"),
])
def test_a_bad_request_field_is_named(fields, param):
    with pytest.raises(LineError) as caught:
        check_body(chat_body(**fields), endpoint=CHAT)

    assert (caught.value.code, caught.value.param) == ("invalid_body", param)


def test_completions_logprobs_is_a_count():
    check_body({"model": "m", "prompt": "Hi", "logprobs": 3}, endpoint=COMPLETIONS)
    with pytest.raises(LineError) as caught:
        check_body({"model": "m", "prompt": "Hi", "logprobs": True}, endpoint=COMPLETIONS)

    assert caught.value.param == "body.logprobs"
