"""Batch usage and expiry options through the official openai SDK against the real
processes (web, control worker, inference worker on the simulated engine)."""

from __future__ import annotations

import json

import openai
import pytest

from batchgen.batchgen_client import BatchGenHttpClient
from tests.e2e.harness import chat_lines


@pytest.fixture
def server(start_server):
    srv, api = start_server(BATCHGEN_SIM_LATENCY_MS="5")
    return srv


def test_the_sdk_sends_both_expiry_options_and_reads_the_exact_usage(server, tmp_path):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    path = tmp_path / "input.jsonl"
    path.write_bytes(chat_lines(40))

    # The SDK sends expires_after as multipart fields expires_after[anchor]/[seconds].
    uploaded = client.files.create(file=path.open("rb"), purpose="batch",
                                   expires_after={"anchor": "created_at", "seconds": 7200})
    assert uploaded.expires_at - uploaded.created_at == 7200
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 86400})

    BatchGenHttpClient(server.base_url).wait_for_batch(batch.id, poll_interval=0.2,
                                                       timeout=120)
    finished = client.batches.retrieve(batch.id)
    assert finished.status == "completed"
    output = client.files.retrieve(finished.output_file_id)
    assert output.expires_at - output.created_at == 86400

    lines = [json.loads(raw) for raw in
             client.files.content(finished.output_file_id).read().splitlines()]
    bodies = [line["response"]["body"] for line in lines]
    assert len(bodies) == 40
    prompt = sum(body["usage"]["prompt_tokens"] for body in bodies)
    completion = sum(body["usage"]["completion_tokens"] for body in bodies)
    assert finished.usage.input_tokens == prompt > 0
    assert finished.usage.output_tokens == completion > 0
    assert finished.usage.total_tokens == prompt + completion
    assert finished.usage.input_tokens_details.cached_tokens == 0
    assert finished.usage.output_tokens_details.reasoning_tokens == 0


def test_a_bad_expiry_from_the_sdk_is_a_400_naming_the_field(server, tmp_path):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused",
                           max_retries=0)
    path = tmp_path / "input.jsonl"
    path.write_bytes(chat_lines(2))

    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=path.open("rb"), purpose="batch",
                            expires_after={"anchor": "created_at", "seconds": 60})

    assert refused.value.param == "expires_after.seconds"
    assert refused.value.code == "invalid_expires_after"
