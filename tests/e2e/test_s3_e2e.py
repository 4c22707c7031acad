"""The whole user flow on BATCHGEN_STORAGE_URL=s3://... against the real SeaweedFS
of tests/s3.py and a real server (web, control, inference worker; simulated engine):
curl, the seed client and the openai SDK, as on a path. The bytes are objects in the
bucket; the storage path keeps none of them."""

from __future__ import annotations

import json
import subprocess
import uuid

import openai

from batchgen.batchgen_client import BatchGenHttpClient
from tests.e2e.harness import chat_lines, output_ids, wait_until
from tests.s3 import BUCKET


def curl(*args: str) -> bytes:
    result = subprocess.run(["curl", "-sS", "--fail-with-body", *args], capture_output=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


def test_the_user_flow_on_s3_with_curl_the_seed_client_and_the_openai_sdk(
        start_server, s3_server, tmp_path):
    prefix = uuid.uuid4().hex
    server, api = start_server(BATCHGEN_SIM_LATENCY_MS="5",
                               BATCHGEN_STORAGE_URL=f"s3://{BUCKET}/{prefix}", **s3_server.env)
    base = server.base_url

    # curl: upload, create, follow the incremental output, download
    (tmp_path / "input.jsonl").write_bytes(chat_lines(400))
    file = json.loads(curl("-F", "purpose=batch", "-F", f"file=@{tmp_path / 'input.jsonl'}",
                           f"{base}/v1/files"))
    batch = json.loads(curl("-H", "Content-Type: application/json", "-d", json.dumps(
        {"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
         "completion_window": "24h"}), f"{base}/v1/batches"))
    seen, offset = [], 0

    def follow() -> bool:
        nonlocal offset
        response = api.http.get(f"/v1/batches/{batch['id']}/output", params={"offset": offset})
        assert response.status_code == 200, response.text
        assert response.content == b"" or response.content.endswith(b"\n")  # whole lines
        seen.extend(output_ids(response.content))
        offset = int(response.headers["X-Next-Offset"])
        return response.headers["X-Batch-Status"] == "completed"

    wait_until(follow, timeout=120, interval=0.2, message="the batch to complete")
    follow()  # what was counted before the last look
    assert sorted(seen) == sorted(f"req-{i}" for i in range(400))  # none torn or repeated
    done = api.batch(batch["id"])
    content = curl(f"{base}/v1/files/{done['output_file_id']}/content")
    assert sorted(output_ids(content)) == sorted(seen)

    # the seed client's one-liner
    client = BatchGenHttpClient(base)
    (tmp_path / "small.jsonl").write_bytes(chat_lines(20, prefix="seed"))
    result = client.submit_batch(input_file_path=str(tmp_path / "small.jsonl"),
                                 output_file_path=str(tmp_path / "out.jsonl"))
    assert result["status"] == "completed"
    assert sorted(output_ids((tmp_path / "out.jsonl").read_bytes())) == sorted(
        f"seed-{i}" for i in range(20))

    # the openai SDK, and a delete that leaves no object behind
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    uploaded = sdk.files.create(file=(tmp_path / "small.jsonl").open("rb"), purpose="batch")
    sdk_batch = sdk.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")
    client.wait_for_batch(sdk_batch.id, poll_interval=0.2, timeout=120)
    finished = sdk.batches.retrieve(sdk_batch.id)
    assert finished.request_counts.completed == 20
    assert sorted(output_ids(sdk.files.content(finished.output_file_id).read())) == sorted(
        f"seed-{i}" for i in range(20))
    sdk.files.delete(finished.output_file_id)
    keys = s3_server.keys(prefix)
    assert f"{prefix}/incremental/{sdk_batch.id}.jsonl" not in keys
    assert f"{prefix}/incremental/{batch['id']}.jsonl" in keys
    assert not [key for key in keys if key.count("/") > 2]  # no segment left behind
    stored = [p.name for p in (server.storage / "incremental").glob("*")] if (
        server.storage / "incremental").exists() else []
    assert stored == []  # the path holds no output
