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


# --- score and rerank on the same engine (inference/engines/vllm_scoring.py) ---------------

QUERY = "How do I play the guitar?"
DOCUMENTS = [GUITAR, UNRELATED, PARAPHRASE, "Guitar lessons for beginners: chords first.",
             "The weather is sunny."]


def scoring_request(endpoint: str, **body: Any) -> EngineRequest:
    return EngineRequest(request_id=f"s-{time.monotonic_ns()}", custom_id="s",
                         endpoint=endpoint, body={"model": EMBEDDING_MODEL_NAME, **body})


@pytest.fixture(scope="module")
def reference_dir(embedder: EngineHarness):
    return embedder.engine.config.model


def test_scores_are_the_cosine_of_mean_pooled_embeddings(embedder: EngineHarness,
                                                         reference_dir) -> None:
    from tests.inference.minilm_reference import scores

    one_to_many, one_to_one = embedder.generate_all(
        scoring_request("/v1/score", queries=QUERY, documents=DOCUMENTS),
        scoring_request("/score", text_1=[GUITAR, QUERY], text_2=[PARAPHRASE, UNRELATED]))

    assert one_to_many.error is None, one_to_many.error
    body = one_to_many.body
    assert body["object"] == "list" and body["model"] == EMBEDDING_MODEL_NAME
    assert [item["index"] for item in body["data"]] == list(range(len(DOCUMENTS)))
    assert np.allclose([item["score"] for item in body["data"]],
                       scores(reference_dir, [QUERY], DOCUMENTS), atol=1e-4)
    assert np.allclose([item["score"] for item in one_to_one.body["data"]],
                       scores(reference_dir, [GUITAR, QUERY], [PARAPHRASE, UNRELATED]),
                       atol=1e-4)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    assert "completion_tokens" not in body["usage"]
    assert one_to_many.prompt_tokens == body["usage"]["prompt_tokens"]
    assert one_to_many.completion_tokens == 0


def test_rerank_orders_documents_by_score_and_keeps_top_n(embedder: EngineHarness,
                                                          reference_dir) -> None:
    from tests.inference.minilm_reference import scores

    full, top, bare = embedder.generate_all(
        scoring_request("/v1/rerank", query=QUERY, documents=DOCUMENTS),
        scoring_request("/rerank", query=QUERY, documents=DOCUMENTS, top_n=2),
        scoring_request("/v1/rerank", query=QUERY, documents=DOCUMENTS, top_n=3,
                        return_documents=False))

    expected = scores(reference_dir, [QUERY], DOCUMENTS)
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    results = full.body["results"]
    assert [result["index"] for result in results] == order
    assert np.allclose([result["relevance_score"] for result in results],
                       [expected[i] for i in order], atol=1e-4)
    assert [result["document"]["text"] for result in results] == [DOCUMENTS[i] for i in order]
    assert [result["index"] for result in top.body["results"]] == order[:2]
    assert [result["index"] for result in bare.body["results"]] == order[:3]
    assert all("document" not in result for result in bare.body["results"])
    assert full.body["usage"]["prompt_tokens"] == full.body["usage"]["total_tokens"] > 0


def test_a_document_over_the_context_fails_its_line_only(embedder: EngineHarness) -> None:
    too_long, fine = embedder.generate_all(
        scoring_request("/v1/rerank", query=QUERY, documents=[GUITAR, "word " * 2000]),
        scoring_request("/v1/rerank", query=QUERY, documents=[GUITAR]))

    assert too_long.error["code"] == "context_length_exceeded", too_long.error
    assert fine.error is None and len(fine.body["results"]) == 1
