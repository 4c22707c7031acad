"""The chat model and the embedding model served at once by one `serve`, each on its
own real vLLM engine (as `make run` does by default)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.e2e.harness import wait_until

pytestmark = pytest.mark.vllm

CHAT, EMBED = "SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"


def lines(url: str, bodies: list[dict]) -> bytes:
    return b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url,
                                "body": body}).encode() + b"\n"
                    for i, body in enumerate(bodies))


def run(api, content: bytes, endpoint: str) -> dict:
    created = api.create_batch(api.upload(content)["id"], endpoint=endpoint)
    assert created.status_code == 200, created.text
    return created.json()


def test_the_chat_model_and_the_embedding_model_serve_one_batch_each_at_once(
        start_server, tmp_path):
    chat_dir = Path(os.environ.get("BATCHGEN_TEST_MODEL_DIR")
                    or Path(__file__).parents[2] / "storage" / "models" / CHAT)
    if not (chat_dir / "config.json").exists():
        pytest.fail("BATCHGEN_TEST_MODEL_DIR must name the prepared default model "
                    "(`make test` prepares it)")
    embed_dir = tmp_path / "storage0" / "models" / EMBED  # serve prepares it there
    server, api = start_server(
        engine="vllm", ready_timeout=400, BATCHGEN_MAX_CONTEXT_LENGTH="512",
        BATCHGEN_MAX_POOL_SIZE="32", BATCHGEN_MODELS=f"{CHAT}={chat_dir},{EMBED}={embed_dir}")
    models = wait_until(lambda: (d := api.http.get("/v1/models").json()["data"])
                        and all(m["live"] for m in d) and d, timeout=400, message="both live")
    assert {m["id"]: m["endpoints"] for m in models} == {
        CHAT: ["/v1/chat/completions", "/v1/completions"], EMBED: ["/v1/embeddings"]}

    chat = run(api, lines("/v1/chat/completions", [
        {"model": CHAT, "max_tokens": 8, "messages": [{"role": "user", "content": q}]}
        for q in ("What is 2 + 2?", "Name a colour.")]), "/v1/chat/completions")
    embed = run(api, lines("/v1/embeddings", [
        {"model": EMBED, "input": text} for text in ("a guitar", "a violin", "a tax form")]),
        "/v1/embeddings")
    # A line naming the chat model in an embeddings batch: refused, not substituted
    wrong = run(api, lines("/v1/embeddings", [{"model": CHAT, "input": "x"}]), "/v1/embeddings")

    for batch, model, count in ((chat, CHAT, 2), (embed, EMBED, 3)):
        done = api.wait_status(batch["id"], {"completed", "failed"}, timeout=400)
        assert done["status"] == "completed", done
        assert done["request_counts"]["completed"] == count
        for line in api.content(done["output_file_id"]).splitlines():
            assert json.loads(line)["response"]["body"]["model"] == model
    refused = api.wait_status(wrong["id"], {"failed"}, timeout=60)
    assert [e["code"] for e in refused["errors"]["data"]] == ["model_not_found"]
