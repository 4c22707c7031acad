"""/v1/embeddings batches: the line checks, the spec, and a batch through the
in-process runtime on the simulated engine."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest

from batches.models import BatchStatus
from batches.validation import validate_file
from inference.engines.simulated import SimulatedEngine
from inference.slots import estimate_tokens
from serving.endpoints import endpoint_spec
from serving.engines.base import EngineConfig, EngineRequest
from serving.params import BatchParams
from tests.conftest import jsonl

EMBEDDINGS = "/v1/embeddings"
spec = endpoint_spec(EMBEDDINGS)


def line(custom_id: str, text="Hello", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": EMBEDDINGS,
            "body": {"model": "m", "input": text, **body}}


def validate(tmp_path, lines):
    path = tmp_path / "in.jsonl"
    path.write_bytes(jsonl(lines))
    return validate_file(path, endpoint=EMBEDDINGS, chunk_size=10, max_line_bytes=1 << 20,
                         max_requests=1000)


@pytest.mark.parametrize("text", ["a text", ["one", "two"], [101, 2023, 102],
                                  [[101, 102], [7]]], ids=["text", "texts", "tokens",
                                                          "token-lists"])
def test_openais_four_input_shapes_are_accepted(tmp_path, text):
    report = validate(tmp_path, [line("a", text, encoding_format="base64", dimensions=64)])

    assert (report.total, report.invalid) == (1, 0), report.errors


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "body.input"),
    ({"input": []}, "body.input"),
    ({"input": ["a", ""]}, "body.input"),
    ({"input": ["a", 1]}, "body.input"),
    ({"input": [-1]}, "body.input"),
    ({"input": [[1], []]}, "body.input"),
    ({"input": None}, "body.input"),
    ({"encoding_format": "bytes"}, "body.encoding_format"),
    ({"dimensions": 0}, "body.dimensions"),
    ({"dimensions": 1.5}, "body.dimensions"),
    ({"model": ""}, "body.model"),
])
def test_a_bad_embedding_line_names_its_field(tmp_path, body, param):
    report = validate(tmp_path, [{**line("a"), "body": {**line("a")["body"], **body}}])

    assert report.invalid == 1
    assert (report.errors[0]["code"], report.errors[0]["param"]) == ("invalid_body", param)


def test_sampling_fields_are_left_alone_and_no_output_is_counted():
    body = {"model": "m", "input": ["abcd" * 10, "ef"], "temperature": 9}
    request = EngineRequest(request_id="r", custom_id="a", endpoint=EMBEDDINGS, body=body)

    assert spec.resolve_body(body, BatchParams(temperature=0.5, max_decoding_length=9)) == body
    assert estimate_tokens(request) == 42 // 4 + 1  # the input alone, no output tokens


def test_the_simulated_engine_answers_one_vector_per_input_in_either_encoding():
    engine = SimulatedEngine(EngineConfig(engine="simulated", model="m",
                                          served_model_name="m"))

    def embed(**body):
        request = EngineRequest(request_id="r", custom_id="a", endpoint=EMBEDDINGS,
                                body={"model": "m", **body})
        return asyncio.run(engine.generate(request))

    floats = embed(input=["one", "two"], dimensions=8)
    encoded = embed(input="one", encoding_format="base64", dimensions=8)

    assert [item["index"] for item in floats.body["data"]] == [0, 1]
    first = floats.body["data"][0]["embedding"]
    assert len(first) == 8
    decoded = np.frombuffer(base64.b64decode(encoded.body["data"][0]["embedding"]),
                            dtype=np.float32)
    assert np.allclose(decoded, first)
    assert floats.body["usage"] == {"prompt_tokens": 2, "total_tokens": 2}
    assert floats.completion_tokens == 0


@pytest.mark.django_db(transaction=True)
def test_an_embeddings_batch_runs_to_completion(finished_batch):
    lines = [line(f"e{i}", [f"text {i}", "shared"]) for i in range(5)]
    batch, outputs = finished_batch(lines, endpoint=EMBEDDINGS)

    assert batch.status == BatchStatus.COMPLETED
    assert (batch.total, batch.completed, batch.failed) == (5, 5, 0)
    for output in outputs:
        body = output["response"]["body"]
        assert body["object"] == "list" and len(body["data"]) == 2
        assert "completion_tokens" not in body["usage"]


@pytest.fixture
def vllm_serving(settings):
    """The vLLM engine configured (not started) with a model folder of either kind."""
    from serving.model_info import served_model
    from serving.model_prep import EMBEDDING_MODEL_NAME, prepare_embedding_model

    def _serve(kind: str):
        settings.BATCHGEN_ENGINE = "vllm"
        if kind == "embedding":
            folder = prepare_embedding_model(settings.STORAGE_PATH / "m" / EMBEDDING_MODEL_NAME)
        else:
            folder = settings.STORAGE_PATH / "m" / "chat-model"
            folder.mkdir(parents=True)
            (folder / "config.json").write_text('{"max_position_embeddings": 8192}')
        settings.BATCHGEN_MODEL = str(folder)
        settings.BATCHGEN_MODELS = ""  # the one-model form
        served_model.cache_clear()

    yield _serve
    served_model.cache_clear()


@pytest.mark.django_db
@pytest.mark.parametrize("kind, refused, taken", [
    ("embedding", "/v1/chat/completions", EMBEDDINGS),
    ("generative", EMBEDDINGS, "/v1/completions"),
])
def test_a_batch_for_an_endpoint_the_model_does_not_serve_is_refused_at_create(
        api, upload, published, vllm_serving, kind, refused, taken):
    from tests.files.test_api import assert_envelope

    vllm_serving(kind)
    file_id = upload(jsonl([line("a")]))["id"]

    response = api.post("/v1/batches", {"input_file_id": file_id, "endpoint": refused},
                        format="json")
    assert_envelope(response, 400, param="endpoint", code="unsupported_endpoint")
    assert taken in response.json()["error"]["message"]
    accepted = api.post("/v1/batches", {"input_file_id": file_id, "endpoint": taken},
                        format="json")
    assert accepted.status_code == 200, accepted.content
