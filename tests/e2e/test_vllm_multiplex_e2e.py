"""Model multiplexing on real vLLM engines: one inference worker (`serve
--inference-workers 1 --multiplex`) serves the bundled chat model, a LoRA adapter on
it and the bundled embedding model by turns.

Three batches are submitted together: chat on the base model, chat on the adapter,
and embeddings. The policy's promise with one worker and every batch submitted at
once (fleet/residency.py): each base model with work is resident once, so two
models mean one load and one swap (the adapter rides on its base model's engine).
What must hold: all three complete, each custom_id once, exactly that many swaps."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.faults.faults import assert_each_custom_id_once, query, request_ids
from tests.fleet.fleet import error_lines
from tests.lora import make_lora_adapter

pytestmark = pytest.mark.vllm

CHAT, EMBED, ADAPTER = "SmolLM2-135M-Instruct", "all-MiniLM-L6-v2", "smol-lora"
CHAT_URL, EMBED_URL = "/v1/chat/completions", "/v1/embeddings"
COUNT = 6


def lines(prefix: str, url: str, bodies: list[dict]) -> bytes:
    return b"".join(json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST", "url": url,
                                "body": body}).encode() + b"\n"
                    for i, body in enumerate(bodies))


def chat(model: str) -> list[dict]:
    return [{"model": model, "max_tokens": 8,
             "messages": [{"role": "user", "content": f"Count to {i}."}]} for i in range(COUNT)]


def test_one_worker_serves_chat_adapter_and_embeddings_by_turns_with_one_swap(
        start_server, tmp_path):
    chat_dir = Path(os.environ.get("BATCHGEN_TEST_MODEL_DIR")
                    or Path(__file__).parents[2] / "storage" / "models" / CHAT)
    if not (chat_dir / "config.json").exists():
        pytest.fail("BATCHGEN_TEST_MODEL_DIR must name the prepared default model "
                    "(`make test` prepares it)")
    adapter_dir = make_lora_adapter(chat_dir, tmp_path / "adapter")
    embed_dir = tmp_path / "storage0" / "models" / EMBED  # serve prepares it there
    server, api = start_server(
        engine="vllm", ready_timeout=400, args=["--inference-workers", "1", "--multiplex"],
        BATCHGEN_MAX_CONTEXT_LENGTH="512", BATCHGEN_MAX_POOL_SIZE="32",
        BATCHGEN_MODELS=f"{CHAT}={chat_dir},{EMBED}={embed_dir},"
                        f"{ADAPTER}=lora:{adapter_dir}@{CHAT}")
    # Nothing is loaded before there is work; every model is servable all the same
    models = api.http.get("/v1/models").json()["data"]
    assert [(m["id"], m["live"], m["resident"]) for m in models] == [
        (CHAT, True, False), (EMBED, True, False), (ADAPTER, True, False)]

    # Given: three batches submitted together
    contents = {"base": (lines("base", CHAT_URL, chat(CHAT)), CHAT_URL),
                "lora": (lines("lora", CHAT_URL, chat(ADAPTER)), CHAT_URL),
                "embed": (lines("embed", EMBED_URL, [{"model": EMBED, "input": f"text {i}"}
                                                     for i in range(COUNT)]), EMBED_URL)}
    files = {name: api.upload(content)["id"] for name, (content, _) in contents.items()}
    batches = {name: api.create_batch(files[name], endpoint=url).json()
               for name, (_, url) in contents.items()}

    # Then: all complete, each custom_id once
    for name, batch in batches.items():
        done = api.wait_status(batch["id"], {"completed", "failed", "cancelled"}, timeout=600)
        assert_each_custom_id_once(api, done, request_ids(COUNT, name))
    lora = [json.loads(line) for line in api.content(
        api.batch(batches["lora"]["id"])["output_file_id"]).splitlines()]
    assert {line["response"]["body"]["model"] for line in lora} == {ADAPTER}

    # Then: one load and one swap, the minimum for two base models on one worker
    swaps = query(server, "SELECT from_model, to_model, reason, drain_seconds, seconds "
                          "FROM inference_modelswap ORDER BY id")
    pool = api.http.get("/v1/pool/status").json()
    print("\nswaps:", swaps, "\nmultiplexing:", pool["multiplexing"])
    assert [(f, t) for f, t, *_ in swaps] in ([("", CHAT), (CHAT, EMBED)],
                                              [("", EMBED), (EMBED, CHAT)]), swaps
    assert (pool["multiplexing"]["loads"], pool["multiplexing"]["swaps"]) == (1, 1)
    assert error_lines([server.log_path]) == []
