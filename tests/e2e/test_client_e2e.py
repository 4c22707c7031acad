"""The user's guide, run as written against a real server, and the same flow with
the official openai SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import openai
import pytest

from batchgen.batchgen_client import BatchGenHttpClient
from tests.e2e.harness import ROOT, chat_lines, output_ids


@pytest.fixture
def server(start_server):
    # 8 slots at 20 ms a request: the flows' batches of 10-30 lines take a tenth of a
    # second, and the 2,000-line batch the SDK cancels at least 5 s, so the cancel
    # finds it running (with the default slots it could complete in well under a
    # second, before the cancel arrived: a CI run saw it).
    srv, api = start_server(BATCHGEN_SIM_LATENCY_MS="20", BATCHGEN_MAX_POOL_SIZE="8")
    return srv


def run_guide_code(code: str, base_url: str, workdir) -> None:
    """Run a snippet of the user's guide in a fresh interpreter, as a user would."""
    code = code.replace("http://localhost:10900", base_url)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=workdir,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_quick_start_one_liner_as_written(server, tmp_path):
    (tmp_path / "input.jsonl").write_bytes(chat_lines(20))
    stdout = run_guide_code('''
        from batchgen.batchgen_client import BatchGenHttpClient

        client = BatchGenHttpClient("http://localhost:10900")

        # One-liner: upload -> create -> wait -> download
        batch = client.submit_batch(
            input_file_path="input.jsonl",
            output_file_path="output.jsonl",
            max_decoding_length=4096,
        )
        print(f"Status: {batch['status']}")  # "completed"
    ''', server.base_url, tmp_path)
    assert "Status: completed" in stdout
    ids = output_ids((tmp_path / "output.jsonl").read_bytes())
    assert sorted(ids) == sorted(f"req-{i}" for i in range(20))


def test_step_by_step_as_written(server, tmp_path):
    (tmp_path / "input.jsonl").write_bytes(chat_lines(10))
    stdout = run_guide_code('''
        from batchgen.batchgen_client import BatchGenHttpClient

        client = BatchGenHttpClient("http://localhost:10900")
        # 1. Upload input file
        file_obj = client.upload_file("input.jsonl", purpose="batch")
        print(f"File ID: {file_obj['id']}")

        # 2. Create batch
        batch = client.create_batch(
            input_file_id=file_obj["id"],
            endpoint="/v1/chat/completions",
            max_decoding_length=4096,
            temperature=0.7,
        )
        print(f"Batch ID: {batch['id']}, Status: {batch['status']}")

        # 3. Poll until complete
        batch = client.wait_for_batch(batch["id"], poll_interval=10.0)

        # 4. Download results
        content = client.download_file_content(batch["output_file_id"])
        with open("output.jsonl", "wb") as f:
            f.write(content)
    ''', server.base_url, tmp_path)
    assert "Status: validating" in stdout
    lines = [json.loads(line) for line in (tmp_path / "output.jsonl").read_bytes().splitlines()]
    assert len(lines) == 10 and all(line["response"]["status_code"] == 200 for line in lines)


def test_openai_sdk_batch_flow(server, tmp_path):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    path = tmp_path / "input.jsonl"
    path.write_bytes(chat_lines(15))
    input_file = client.files.create(file=path.open("rb"), purpose="batch")

    batch = client.batches.create(input_file_id=input_file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"team": "sdk"})
    assert batch.status == "validating" and batch.metadata == {"team": "sdk"}
    assert client.batches.retrieve(batch.id).id == batch.id
    assert batch.id in [b.id for b in client.batches.list(limit=5).data]

    bc = BatchGenHttpClient(server.base_url)
    done = bc.wait_for_batch(batch.id, poll_interval=0.2, timeout=120)
    finished = client.batches.retrieve(batch.id)
    assert finished.status == "completed" == done["status"]
    assert finished.request_counts.completed == 15
    content = client.files.content(finished.output_file_id).read()
    assert sorted(output_ids(content)) == sorted(f"req-{i}" for i in range(15))

    # Cancel through the SDK: a second, slow batch on another file.
    slow = tmp_path / "slow.jsonl"
    slow.write_bytes(chat_lines(2000, prefix="slow"))
    slow_file = client.files.create(file=slow.open("rb"), purpose="batch")
    second = client.batches.create(input_file_id=slow_file.id,
                                   endpoint="/v1/chat/completions", completion_window="24h")
    cancelled = client.batches.cancel(second.id)
    assert cancelled.status in ("cancelling", "cancelled")
    with pytest.raises(RuntimeError):
        bc.wait_for_batch(second.id, poll_interval=0.2, timeout=120)
    assert client.batches.retrieve(second.id).status == "cancelled"


def test_typed_client_flow(server, tmp_path):
    """client.files/.batches/... on a real server: every answer parses into its type
    (tests/client/test_types_schema.py holds the types to the schema), pages walk."""
    from batchgen import NotFoundError
    from batchgen.types import Batch, FileObject, Model, PoolStatus

    path = tmp_path / "input.jsonl"
    path.write_bytes(chat_lines(12))
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(chat_lines(3) + b"not json\n" + b"{}\n")
    with BatchGenHttpClient(server.base_url) as client:
        file_obj = client.files.create(path.open("rb"),
                                       expires_after={"anchor": "created_at", "seconds": 86400})
        assert isinstance(file_obj, FileObject) and file_obj.bytes == path.stat().st_size
        assert file_obj.expires_at - file_obj.created_at == 86400
        batch = client.batches.create(input_file_id=file_obj.id, metadata={"team": "typed"})
        assert isinstance(batch, Batch) and batch.metadata == {"team": "typed"}
        done = client.batches.wait(batch.id, poll_interval=0.2, timeout=120)
        assert done.status == "completed" and done["status"] == "completed"
        assert done.request_counts.completed == 12 and done.request_counts.failed == 0
        assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
        ids = [r["custom_id"] for r in client.batches.results(done)]
        assert sorted(ids) == sorted(f"req-{i}" for i in range(12))

        bad_file = client.files.create(bad)
        failed = client.batches.create(input_file_id=bad_file.id)
        with pytest.raises(RuntimeError):
            client.batches.wait(failed.id, poll_interval=0.2, timeout=120)
        failed = client.batches.retrieve(failed.id)
        assert failed.status == "failed" and failed.errors.total == 2
        assert [e.line for e in client.batches.errors(failed.id, limit=1)] == \
            [e.line for e in failed.errors.data] == [4, 5]

        # Two batches, one a page: iterating walks to the second page.
        assert [b.id for b in client.batches.list(limit=1)] == [failed.id, done.id]
        listed = [f.id for f in client.files.list(limit=1)]
        assert {file_obj.id, bad_file.id, done.output_file_id} <= set(listed)
        assert all(isinstance(m, Model) and m.live is not None for m in client.models.list())
        assert isinstance(client.pool.status(), PoolStatus)
        with pytest.raises(NotFoundError) as caught:
            client.batches.retrieve("batch_doesnotexist")
        assert caught.value.status_code == 404 and caught.value.code


def test_cli_submit_and_tail(server, tmp_path):
    (tmp_path / "input.jsonl").write_bytes(chat_lines(30))
    env = {**os.environ, "BATCHGEN_BASE_URL": server.base_url, "PYTHONPATH": str(ROOT)}
    submit = subprocess.run(
        [sys.executable, "-m", "batchgen", "submit", "input.jsonl", "-o", "output.jsonl",
         "--poll-interval", "0.2"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300)
    assert submit.returncode == 0, submit.stderr
    assert len(output_ids((tmp_path / "output.jsonl").read_bytes())) == 30
    listed = subprocess.run([sys.executable, "-m", "batchgen", "list", "--json"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=60)
    batch_id = json.loads(listed.stdout)["data"][0]["id"]
    tail = subprocess.run([sys.executable, "-m", "batchgen", "tail", batch_id], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert tail.returncode == 0, tail.stderr
    assert sum('"custom_id"' in line for line in tail.stdout.splitlines()) == 30


def embedding_lines(count: int) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"emb-{i}", "method": "POST", "url": "/v1/embeddings",
        "body": {"model": "m", "input": [f"text {i}", "another"]}}).encode() + b"\n"
        for i in range(count))


def test_openai_sdk_and_cli_embeddings_batch(server, tmp_path):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    path = tmp_path / "input.jsonl"
    path.write_bytes(embedding_lines(12))
    input_file = client.files.create(file=path.open("rb"), purpose="batch")

    batch = client.batches.create(input_file_id=input_file.id, endpoint="/v1/embeddings",
                                  completion_window="24h")
    BatchGenHttpClient(server.base_url).wait_for_batch(batch.id, poll_interval=0.2,
                                                       timeout=120)
    finished = client.batches.retrieve(batch.id)
    assert finished.status == "completed" and finished.endpoint == "/v1/embeddings"
    lines = [json.loads(line) for line in
             client.files.content(finished.output_file_id).read().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(f"emb-{i}" for i in range(12))
    body = lines[0]["response"]["body"]
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1]

    env = {**os.environ, "BATCHGEN_BASE_URL": server.base_url, "PYTHONPATH": str(ROOT)}
    submit = subprocess.run(
        [sys.executable, "-m", "batchgen", "submit", "input.jsonl", "-o", "output.jsonl",
         "--endpoint", "/v1/embeddings", "--poll-interval", "0.2"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=300)
    assert submit.returncode == 0, submit.stderr
    assert len(output_ids((tmp_path / "output.jsonl").read_bytes())) == 12


def response_lines(count: int) -> bytes:
    """/v1/responses lines: string inputs and item lists, with instructions."""
    lines = []
    for i in range(count):
        text = f"question {i}"
        items = [{"role": "user", "content": [{"type": "input_text", "text": text}]}]
        lines.append({"custom_id": f"resp-{i}", "method": "POST", "url": "/v1/responses",
                      "body": {"model": "m", "input": items if i % 2 else text,
                               "instructions": "Be brief.", "max_output_tokens": 6}})
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_openai_sdk_and_cli_responses_batch(server, tmp_path):
    from openai.types.responses import Response

    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    path = tmp_path / "input.jsonl"
    path.write_bytes(response_lines(12))
    input_file = client.files.create(file=path.open("rb"), purpose="batch")

    batch = client.batches.create(input_file_id=input_file.id, endpoint="/v1/responses",
                                  completion_window="24h")
    BatchGenHttpClient(server.base_url).wait_for_batch(batch.id, poll_interval=0.2,
                                                       timeout=120)
    finished = client.batches.retrieve(batch.id)
    assert finished.status == "completed" and finished.endpoint == "/v1/responses"
    lines = [json.loads(line) for line in
             client.files.content(finished.output_file_id).read().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(f"resp-{i}" for i in range(12))
    responses = [Response.model_validate(line["response"]["body"]) for line in lines]
    assert all(r.object == "response" and r.id.startswith("resp_") and r.output_text
               for r in responses)
    assert finished.usage.input_tokens == sum(r.usage.input_tokens for r in responses)
    assert finished.usage.output_tokens == sum(r.usage.output_tokens for r in responses) > 0

    env = {**os.environ, "BATCHGEN_BASE_URL": server.base_url, "PYTHONPATH": str(ROOT)}
    submit = subprocess.run(
        [sys.executable, "-m", "batchgen", "submit", "input.jsonl", "-o", "output.jsonl",
         "--endpoint", "/v1/responses", "--poll-interval", "0.2"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=300)
    assert submit.returncode == 0, submit.stderr
    assert len(output_ids((tmp_path / "output.jsonl").read_bytes())) == 12
