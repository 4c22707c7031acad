"""The chat model, a LoRA adapter on it and the embedding model served at once by one
`serve`, on real vLLM engines (as `make run` does by default, plus an adapter).

One server start for all of it, each engine loading once: this is the suite's most
expensive start-up. The adapter is made at test time with PEFT (tests/lora.py), with
random weights large enough to change what greedy decoding picks."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.e2e.harness import wait_until
from tests.lora import make_lora_adapter

pytestmark = pytest.mark.vllm

CHAT, EMBED, ADAPTER = "SmolLM2-135M-Instruct", "all-MiniLM-L6-v2", "smol-lora"
CHAT_URL, COMPLETIONS_URL, EMBED_URL = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
RESPONSES_URL = "/v1/responses"
PROMPTS = ("What is 2 + 2?", "Name a colour.", "Say hello.")


def lines(url: str, bodies: list[dict]) -> bytes:
    return b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url,
                                "body": body}).encode() + b"\n"
                    for i, body in enumerate(bodies))


def run(api, content: bytes, endpoint: str) -> dict:
    created = api.create_batch(api.upload(content)["id"], endpoint=endpoint)
    assert created.status_code == 200, created.text
    return created.json()


def outputs(api, batch: dict, count: int) -> dict[str, dict]:
    """The finished batch's output lines by custom_id, once it completed."""
    done = api.wait_status(batch["id"], {"completed", "failed"}, timeout=400)
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": count, "completed": count, "failed": 0}
    found = [json.loads(line) for line in api.content(done["output_file_id"]).splitlines()]
    return {line["custom_id"]: line["response"]["body"] for line in found}


def test_the_chat_model_its_adapter_and_the_embedding_model_serve_at_once(
        start_server, tmp_path):
    started = time.monotonic()
    chat_dir = Path(os.environ.get("BATCHGEN_TEST_MODEL_DIR")
                    or Path(__file__).parents[2] / "storage" / "models" / CHAT)
    if not (chat_dir / "config.json").exists():
        pytest.fail("BATCHGEN_TEST_MODEL_DIR must name the prepared default model "
                    "(`make test` prepares it)")
    adapter_dir = make_lora_adapter(chat_dir, tmp_path / "adapter")
    made = time.monotonic()
    embed_dir = tmp_path / "storage0" / "models" / EMBED  # serve prepares it there
    server, api = start_server(
        engine="vllm", ready_timeout=400, BATCHGEN_MAX_CONTEXT_LENGTH="512",
        BATCHGEN_MAX_POOL_SIZE="32",
        BATCHGEN_MODELS=f"{CHAT}={chat_dir},{EMBED}={embed_dir},"
                        f"{ADAPTER}=lora:{adapter_dir}@{CHAT}")
    models = wait_until(lambda: (d := api.http.get("/v1/models").json()["data"])
                        and all(m["live"] for m in d) and d, timeout=400, message="all live")
    live = time.monotonic()
    # The adapter is listed after the models, with its base; it serves what its base does
    assert [(m["id"], m["parent"], m["endpoints"]) for m in models] == [
        (CHAT, None, [CHAT_URL, COMPLETIONS_URL, RESPONSES_URL]),
        (EMBED, None, [EMBED_URL, "/v1/score", "/score", "/v1/rerank", "/rerank"]),
        (ADAPTER, CHAT, [CHAT_URL, COMPLETIONS_URL, RESPONSES_URL])]

    # One chat batch whose lines name the base model and the adapter in turn, on the
    # same prompts; chunks mix them (the base's workers run both)
    named = [model for _ in PROMPTS for model in (CHAT, ADAPTER)]
    chat = run(api, lines(CHAT_URL, [
        {"model": model, "max_tokens": 12, "messages": [{"role": "user", "content": prompt}]}
        for prompt in PROMPTS for model in (CHAT, ADAPTER)]), CHAT_URL)
    embed = run(api, lines(EMBED_URL, [
        {"model": EMBED, "input": text} for text in ("a guitar", "a violin", "a tax form")]),
        EMBED_URL)
    # An unknown model, the chat model and the adapter in an embeddings batch: each
    # refused on its own line, never answered by another model
    refused = run(api, lines(EMBED_URL, [{"model": model, "input": "x"} for model in (
        EMBED, "gpt-4o", CHAT, ADAPTER)]), EMBED_URL)

    answers = outputs(api, chat, len(named))
    for index, model in enumerate(named):
        assert answers[f"r{index}"]["model"] == model  # each line got the one it named
    texts = [answers[f"r{index}"]["choices"][0]["message"]["content"]
             for index in range(len(named))]
    for base_text, adapter_text in zip(texts[::2], texts[1::2], strict=True):
        assert base_text != adapter_text, texts  # the adapter changed the answer
    vectors = outputs(api, embed, 3)
    assert all(body["model"] == EMBED and len(body["data"][0]["embedding"]) == 384
               for body in vectors.values())
    failed = api.wait_status(refused["id"], {"failed"}, timeout=60)
    assert [(e["code"], e["line"]) for e in failed["errors"]["data"]] == [
        ("model_not_found", 2), ("model_not_found", 3), ("model_not_found", 4)]
    print(f"\nadapter made in {made - started:.0f} s, engines live after {live - made:.0f} s, "
          f"batches done after {time.monotonic() - live:.0f} s")
