"""/v1/responses batches: the line checks (exact codes and params), parameter priority,
the prefix key, the simulated answer parsed by the openai SDK's Response, and a keyed
batch through the in-process runtime whose usage reaches the batch, the key and
/metrics."""

from __future__ import annotations

import asyncio
import json

import orjson
import pytest
from openai.types.responses import Response

from batches import quotas, services
from batches.models import BatchStatus, Chunk
from batches.usage import Usage
from batches.validation import parse_line, validate_file
from core.auth import apikey_create
from core.models import KeyUsage
from files import storage
from inference.engines.simulated import SimulatedEngine
from inference.slots import estimate_cost
from serving.endpoints import endpoint_spec
from serving.engines.base import EngineConfig, EngineRequest
from serving.params import BatchParams
from tests.conftest import jsonl

RESPONSES = "/v1/responses"
spec = endpoint_spec(RESPONSES)
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}},
          "required": ["answer"], "additionalProperties": False}


def line(custom_id: str, input_: object = "Hello", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": RESPONSES,
            "body": {"model": "m", "input": input_, **body}}


def validate(tmp_path, lines):
    path = tmp_path / "in.jsonl"
    path.write_bytes(jsonl(lines))
    return validate_file(path, endpoint=RESPONSES, chunk_size=10, max_line_bytes=1 << 20,
                         max_requests=1000)


ITEMS = [
    {"role": "developer", "content": "Answer in one word."},
    {"type": "message", "role": "user",
     "content": [{"type": "input_text", "text": "Capital of France?"}]},
    {"type": "message", "role": "assistant",
     "content": [{"type": "output_text", "text": "Paris."}]},
    {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "42"},
    {"role": "user", "content": "And of Italy?"},
]

GOOD_BODIES = {
    "string": {},
    "items": {"input": ITEMS},
    "everything": {"instructions": "Be brief.", "max_output_tokens": 16, "temperature": 0.5,
                   "top_p": 0.9, "seed": 7, "metadata": {"team": "a"}, "user": "u-1",
                   "store": True, "stream": False, "background": False,
                   "reasoning": {"effort": "low", "summary": "auto"},
                   "text": {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA,
                                       "strict": True}}},
    "json_object": {"text": {"format": {"type": "json_object"}}},
    "text": {"text": {"format": {"type": "text"}}},
    "function_tool": {"tools": [{"type": "function", "name": "lookup",
                                 "parameters": {"type": "object"}}]},
}


@pytest.mark.parametrize("body", GOOD_BODIES.values(), ids=GOOD_BODIES)
def test_openais_body_is_accepted(tmp_path, body):
    report = validate(tmp_path, [line("a", **body)])

    assert (report.total, report.invalid) == (1, 0), report.errors


def test_the_common_shapes_take_the_fast_path():
    for name in ("string", "everything", "json_object"):
        raw = json.dumps(line("a", **GOOD_BODIES[name])).encode()
        assert spec.decoder.decode(raw).custom_id == "a", name
    messages = [item for item in ITEMS if item.get("type", "message") == "message"]
    assert spec.decoder.decode(json.dumps(line("a", messages)).encode()).body.input


BAD_BODIES = [
    ({"input": None}, "invalid_body", "body.input"),
    ({"input": []}, "invalid_body", "body.input"),
    ({"input": 5}, "invalid_body", "body.input"),
    ({"input": ["hi"]}, "invalid_body", "body.input[0]"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "invalid_body", "body.input[0].role"),
    ({"input": [{"role": "user"}]}, "invalid_body", "body.input[0].content"),
    ({"input": [{"role": "user", "content": []}]}, "invalid_body", "body.input[0].content"),
    ({"input": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]},
     "invalid_body", "body.input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
     "invalid_body", "body.input[0].content[0].text"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
     "invalid_body", "body.input[0].arguments"),
    ({"input": [{"type": "function_call_output", "output": "x"}]},
     "invalid_body", "body.input[0].call_id"),
    ({"input": [{"type": "web_search_call"}]}, "invalid_body", "body.input[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]},
     "unsupported_parameter", "body.input[0].type"),
    ({"instructions": 5}, "invalid_body", "body.instructions"),
    ({"max_output_tokens": 0}, "invalid_body", "body.max_output_tokens"),
    ({"max_output_tokens": 1.5}, "invalid_body", "body.max_output_tokens"),
    ({"temperature": 2.5}, "invalid_body", "body.temperature"),
    ({"top_p": 0}, "invalid_body", "body.top_p"),
    ({"seed": "7"}, "invalid_body", "body.seed"),
    ({"text": "json"}, "invalid_body", "body.text"),
    ({"text": {"format": {"type": "xml"}}}, "invalid_body", "body.text.format"),
    ({"text": {"format": {"type": "json_schema", "schema": SCHEMA}}},
     "invalid_body", "body.text.format.name"),
    ({"text": {"format": {"type": "json_schema", "name": "a"}}},
     "invalid_body", "body.text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA,
                          "strict": "yes"}}}, "invalid_body", "body.text.format.strict"),
    ({"reasoning": {"effort": "extreme"}}, "invalid_body", "body.reasoning.effort"),
    ({"reasoning": "low"}, "invalid_body", "body.reasoning"),
    ({"metadata": {"k": 1}}, "invalid_body", "body.metadata"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "invalid_body", "body.metadata"),
    ({"user": 5}, "invalid_body", "body.user"),
    ({"store": "yes"}, "invalid_body", "body.store"),
    ({"stream": True}, "unsupported_parameter", "body.stream"),
    ({"background": True}, "unsupported_parameter", "body.background"),
    ({"previous_response_id": "resp_1"}, "unsupported_parameter",
     "body.previous_response_id"),
    ({"conversation": "conv_1"}, "unsupported_parameter", "body.conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "unsupported_parameter", "body.prompt"),
    ({"tools": [{"type": "web_search"}]}, "unsupported_parameter", "body.tools[0].type"),
    ({"tools": [{"type": "function"}]}, "invalid_body", "body.tools[0].name"),
    ({"model": ""}, "invalid_body", "body.model"),
]


@pytest.mark.parametrize("body, code, param", BAD_BODIES,
                         ids=[f"{param}-{i}" for i, (_, _, param) in enumerate(BAD_BODIES)])
def test_a_bad_line_is_refused_with_its_code_and_field(tmp_path, body, code, param):
    report = validate(tmp_path, [line("ok-1"), line("x", **body), line("ok-2")])

    assert report.invalid == 1 and report.total == 2
    error = report.errors[0]
    assert (error["code"], error["param"], error["line"]) == (code, param, 2), error


def test_priority_is_the_line_then_the_batch_then_the_server():
    batch = BatchParams(max_decoding_length=64, temperature=0.7, top_p=0.5)

    own = spec.resolve_body(line("a", max_output_tokens=8, temperature=0.1)["body"], batch)
    filled = spec.resolve_body(line("a")["body"], batch)
    server = spec.resolve_body(line("a", store=True)["body"], BatchParams())

    assert (own["max_output_tokens"], own["temperature"], own["top_p"]) == (8, 0.1, 0.5)
    assert (filled["max_output_tokens"], filled["temperature"]) == (64, 0.7)
    assert "max_output_tokens" not in server and server["temperature"] == 0.0
    for body in (own, filled, server):
        assert "max_tokens" not in body and "max_completion_tokens" not in body
        assert body["store"] is False  # nothing is kept


def test_prefix_key_is_the_instructions_and_the_leading_items():
    def key(**body):
        return spec.prefix_key(line("a", **body)["body"])

    shots = ITEMS[:3]
    one = key(instructions="Be brief.", input=[*shots, {"role": "user", "content": "A?"}])
    two = key(instructions="Be brief.", input=[*shots, {"role": "user", "content": "B?"}])
    other_rules = key(instructions="Be long.", input=[*shots, {"role": "user", "content": "A?"}])
    other_shots = key(instructions="Be brief.", input=[ITEMS[0], {"role": "user",
                                                                  "content": "A?"}])
    assert one == two != other_rules
    assert one != other_shots
    assert key(instructions="Rules.", input="A?") == key(instructions="Rules.", input="B?")
    assert key(input="same start " * 100 + "A") == key(input="same start " * 100 + "B")
    # The fast path (decoded structs) keys a line as the slow path (dicts) does.
    for body in ({"instructions": "Be brief.", "input": [*shots[:2], ITEMS[5]]},
                 {"input": "Hello"}, {"input": [ITEMS[1]]}):
        raw = json.dumps(line("a", **body)).encode()
        assert spec.prefix_key_of_line(spec.decoder.decode(raw)) == spec.prefix_key(
            parse_line(raw, endpoint=RESPONSES)["body"])


def test_admission_counts_max_output_tokens_and_the_shared_prefix():
    body = spec.resolve_body(line("a", "q" * 400, instructions="i" * 800,
                                  max_output_tokens=50)["body"], BatchParams())
    cost = estimate_cost(EngineRequest(request_id="r", custom_id="a", endpoint=RESPONSES,
                                       body=body))

    assert cost.tokens == (800 + 400 + 2 * 16) // 4 + 1 + 50
    assert cost.prefix == spec.prefix_key(body) and cost.shared == (800 + 16) // 4


def simulated(**body):
    engine = SimulatedEngine(EngineConfig(engine="simulated", model="m",
                                          served_model_name="m"))
    request = EngineRequest(request_id="b-0-1-1", custom_id="a", endpoint=RESPONSES,
                            body=spec.resolve_body(line("a", **body)["body"], BatchParams()))
    return asyncio.run(engine.generate(request))


def test_the_simulated_answer_is_a_response_the_openai_sdk_parses():
    result = simulated(input=ITEMS, instructions="Be brief.", metadata={"team": "a"})
    cut = simulated(max_output_tokens=2)

    response = Response.model_validate(result.body)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.output_text.startswith("sim")
    assert response.instructions == "Be brief." and response.metadata == {"team": "a"}
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens) == (result.prompt_tokens,
                                                         result.completion_tokens)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens > 0
    assert Response.model_validate(cut.body).status == "incomplete"
    assert cut.completion_tokens == 2


def test_a_responses_usage_adds_to_the_batch_figures():
    usage = Usage()
    usage.add_body({"usage": {"input_tokens": 10, "output_tokens": 4, "total_tokens": 14,
                              "input_tokens_details": {"cached_tokens": 6},
                              "output_tokens_details": {"reasoning_tokens": 3}}})
    usage.add_body({"usage": {"prompt_tokens": 1, "completion_tokens": 2}})

    assert usage == Usage(input_tokens=11, cached_tokens=6, output_tokens=6,
                          reasoning_tokens=3)


@pytest.mark.django_db(transaction=True)
def test_a_keyed_responses_batch_runs_and_its_usage_reaches_batch_key_and_metrics(
        api, client, admin_client, runtime_factory, upload, settings, published):
    settings.BATCHGEN_CHUNK_SIZE = 3
    key, raw_key = apikey_create(name="team-r")
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    lines = [line(f"r{i}", ITEMS if i % 2 else f"question {i}", instructions="Be brief.",
                  max_output_tokens=4) for i in range(7)]
    file = upload(jsonl(lines))
    created = api.post("/v1/batches", {"input_file_id": file["id"], "endpoint": RESPONSES,
                                       "completion_window": "24h"}, format="json")
    assert created.status_code == 200, created.content
    batch = services.batch_validate(batch_id=created.json()["id"])
    assert batch.status == BatchStatus.IN_PROGRESS, batch.error
    runtime = runtime_factory()
    for chunk in Chunk.objects.filter(batch=batch).order_by("index"):
        runtime.run_chunk(chunk.id)
    services.batch_finalize(batch_id=batch.id)

    shown = api.get(f"/v1/batches/{batch.id}").json()
    assert shown["status"] == "completed" and shown["request_counts"]["completed"] == 7
    path = storage.absolute(storage.incremental_name(batch.id))
    outputs = [orjson.loads(raw) for raw in path.read_bytes().splitlines()]
    assert sorted(o["custom_id"] for o in outputs) == sorted(f"r{i}" for i in range(7))
    responses = [Response.model_validate(o["response"]["body"]) for o in outputs]
    assert all(r.status == "incomplete" and r.usage.output_tokens == 4 for r in responses)
    input_tokens = sum(r.usage.input_tokens for r in responses)
    assert shown["usage"]["input_tokens"] == input_tokens > 0
    assert shown["usage"]["output_tokens"] == 7 * 4
    row = KeyUsage.objects.get(key=key, day=quotas.utc_today())
    assert (row.input_tokens, row.output_tokens) == (input_tokens, 28)
    metrics = client.get("/metrics").content.decode()
    assert f'batchgen_key_output_tokens_total{{key="team-r"}} {28:.1f}' in metrics
    # The admin filters batches by the new endpoint and shows its usage.
    listing = admin_client.get("/admin/batches/batch/", {"endpoint": RESPONSES})
    assert listing.status_code == 200 and batch.id in listing.content.decode()
    assert batch.id not in admin_client.get("/admin/batches/batch/", {
        "endpoint": "/v1/chat/completions"}).content.decode()
    page = admin_client.get(f"/admin/batches/batch/{batch.id}/change/").content.decode()
    assert RESPONSES in page and str(input_tokens) in page


def test_the_vllm_engines_response_body_keeps_openais_json_schema_names():
    """vLLM's Response holds OpenAI's text config, whose `schema` is the pydantic
    field `schema_`: dumped by name, the SDK could not parse the output (found by the
    real-engine e2e)."""
    from vllm.entrypoints.openai.responses.protocol import ResponsesResponse

    from inference.engines.vllm_engine import _dumped, _output_body

    text = {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA, "strict": True}}
    response = ResponsesResponse.model_validate({
        "id": "resp_1", "model": "m", "status": "completed", "parallel_tool_calls": True,
        "temperature": 0.0, "tool_choice": "auto", "tools": [], "top_p": 1.0,
        "background": False, "max_output_tokens": 8, "service_tier": "auto",
        "truncation": "disabled", "text": text,
        "output": [{"id": "msg_1", "type": "message", "role": "assistant",
                    "status": "completed", "content": [
                        {"type": "output_text", "text": '{"answer":"yes"}',
                         "annotations": []}]}],
        "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8,
                  "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0,
                                           "input_tokens_per_turn": [5]},
                  "output_tokens_details": {"reasoning_tokens": 0}}})

    body = _output_body(_dumped(response), spec)

    assert body["text"] == text
    assert "input_tokens_per_turn" not in body["usage"]["input_tokens_details"]
    parsed = Response.model_validate(body)
    assert json.loads(parsed.output_text) == {"answer": "yes"}
    assert parsed.usage.total_tokens == 8
