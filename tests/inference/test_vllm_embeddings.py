"""The real vLLM engine on the default embedding model (all-MiniLM-L6-v2, unpacked
from its wheel), through vLLM's own embedding serving class: real vectors."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from serving.engines.base import EngineRequest
from serving.model_prep import EMBEDDING_MODEL_NAME, prepare_embedding_model
from tests.inference.test_vllm_engine import EngineHarness, running_vllm

pytestmark = pytest.mark.vllm

EMBEDDINGS = "/v1/embeddings"
GUITAR = "A man is playing a guitar."
PARAPHRASE = "Someone plays the guitar."
UNRELATED = "The central bank raised interest rates today."


def embedding_request(text: Any, **params: Any) -> EngineRequest:
    return EngineRequest(request_id=f"e-{time.monotonic_ns()}", custom_id="e",
                         endpoint=EMBEDDINGS, body={"model": EMBEDDING_MODEL_NAME, "input": text,
                                                        **params})


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineHarness]:
    model_dir = prepare_embedding_model(tmp_path_factory.mktemp("models") / EMBEDDING_MODEL_NAME)
    with running_vllm(model_dir, EMBEDDING_MODEL_NAME) as harness:
        yield harness


def cosine(a: list[float], b: list[float]) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(embedder: EngineHarness) -> None:
    result = embedder.generate(embedding_request([GUITAR, PARAPHRASE, UNRELATED]))

    assert result.error is None, result.error
    body = result.body
    assert body["object"] == "list" and body["model"] == EMBEDDING_MODEL_NAME
    vectors = [item["embedding"] for item in sorted(body["data"], key=lambda d: d["index"])]
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.3
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    assert "completion_tokens" not in body["usage"]
    assert result.completion_tokens == 0


def test_base64_encodes_the_same_vector_as_float(embedder: EngineHarness) -> None:
    as_float, as_base64 = embedder.generate_all(
        embedding_request(GUITAR), embedding_request(GUITAR, encoding_format="base64"))

    decoded = np.frombuffer(base64.b64decode(as_base64.body["data"][0]["embedding"]),
                            dtype=np.float32)
    assert np.allclose(decoded, as_float.body["data"][0]["embedding"], atol=1e-5)


def test_token_ids_are_embedded_and_chat_is_refused(embedder: EngineHarness) -> None:
    tokens, chat = embedder.generate_all(
        embedding_request([101, 1037, 2158, 102]),
        EngineRequest(request_id="c", custom_id="c", endpoint="/v1/chat/completions",
                      body={"model": "m", "messages": [{"role": "user", "content": "hi"}]}))

    assert len(tokens.body["data"][0]["embedding"]) == 384
    assert chat.error["code"] == "invalid_request"
    assert "embedding model" in chat.error["message"]



def test_the_kv_cache_does_not_cap_how_many_embeddings_are_admitted(
        embedder: EngineHarness) -> None:
    # A pooling request decodes nothing: the worker admits embeddings up to its
    # slots, not up to the encoder's placeholder KV cache (128 tokens, ~7 requests).
    assert embedder.engine.token_capacity is None
