"""The openai-http engine against a real `vllm serve` on this machine's CPU, with the
default model: a batch runs through BatchGen's `serve --engine openai-http`, and the
vLLM server is killed and started again while the batch runs."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.harness import wait_until
from tests.e2e.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

REQUESTS = 40
# Eight in flight at once: results come back in waves, so the server can be killed
# with some lines written and others inside it.
POOL_SIZE = 8


@pytest.fixture
def vllm(model_dir, tmp_path):
    server = VllmServer(model_dir=model_dir, log_path=tmp_path / "vllm-serve.log")
    yield server
    server.stop()


def chat_input() -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"q-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "m", "max_tokens": 24,
                 "messages": [{"role": "user", "content": f"Write one sentence about the "
                                                          f"number {i}."}]}}).encode() + b"\n"
        for i in range(REQUESTS))


class Statuses:
    """Every status code BatchGen answered the test with."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def __call__(self, response: httpx.Response) -> None:
        self.seen.append((response.request.url.path, response.status_code))

    def server_errors(self) -> list[tuple[str, int]]:
        return [item for item in self.seen if item[1] >= 500]


def test_a_batch_survives_the_vllm_server_restarting_mid_batch(start_server, vllm):
    # Given: vllm serve starting, and BatchGen started against it at the same time;
    # BatchGen's worker waits for the server, so /health turns 200 once both are up.
    vllm.start()
    server, api = start_server(
        engine="openai-http", ready_timeout=400,
        args=["--engine", "openai-http", "--engine-url", vllm.url],
        BATCHGEN_MODELS="m=SmolLM2-135M-Instruct", BATCHGEN_MAX_POOL_SIZE=str(POOL_SIZE))
    statuses = Statuses()
    api.http.event_hooks["response"].append(statuses)
    model = api.http.get("/v1/models").json()["data"][0]
    assert (model["id"], model["engine"], model["max_context_length"]) == (
        "m", "openai-http", 8192)

    # When: a batch runs and the vLLM server is killed once some lines are written,
    # then started again on the same port.
    file_id = api.upload(chat_input())["id"]
    created = api.create_batch(file_id, endpoint="/v1/chat/completions")
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    before = wait_until(lambda: (b := api.batch(batch_id))["request_counts"]["completed"]
                        >= POOL_SIZE and b, timeout=300, interval=0.25,
                        message="the first lines to be written")
    assert before["status"] == "in_progress"
    vllm.kill()
    killed_at = before["request_counts"]["completed"]
    assert killed_at < REQUESTS, "the batch ended before the server could be killed"
    vllm.start()
    # While it is down and starting, BatchGen answers (its worker retries).
    assert api.batch(batch_id)["status"] == "in_progress"
    assert api.http.get("/health").status_code == 200
    done = api.wait_status(batch_id, {"completed", "failed", "cancelled"}, timeout=600)

    # Then: every line exactly once, every one answered; no 5xx from BatchGen.
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": REQUESTS, "completed": REQUESTS, "failed": 0}
    lines = [json.loads(line) for line in api.content(done["output_file_id"]).splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(
        f"q-{i}" for i in range(REQUESTS))
    for line in lines:
        assert line["error"] is None, line
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and body["model"] == "m"
        assert body["choices"][0]["message"]["content"].strip()
        assert 0 < body["usage"]["completion_tokens"] <= 24
    assert statuses.server_errors() == []
    log = server.log_path.read_text(errors="replace")
    assert "requests retry for up to" in log and "answers again after" in log
