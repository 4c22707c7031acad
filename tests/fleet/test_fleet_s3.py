"""The fleet on object storage: PostgreSQL, RabbitMQ, the real SeaweedFS of
tests/s3.py and four inference workers, each with a storage path of its own (no
folder shared with the web and control process or with each other). One worker is
SIGKILLed and one stopped with SIGTERM mid-batch. What must hold: every custom_id
once in the output, and the incremental view, followed all along, never shows a
torn or a repeated line."""

from __future__ import annotations

import os
import signal
import uuid

import httpx
import pytest

from tests.e2e.harness import Server, chat_lines, output_ids, server_env, wait_until
from tests.faults.faults import assert_each_custom_id_once, request_ids
from tests.fleet.fleet import ExtraWorker, RecordingApi, error_lines
from tests.s3 import BUCKET

COUNT = 2_000
# 100 ms a request, 16 slots a worker: about 600 requests/s for the fleet at most,
# so the batch runs long enough for the kill and the stop to land mid-way; a short
# lease requeues the killed worker's chunks within seconds.
SETTINGS = {"BATCHGEN_SIM_LATENCY_MS": "100", "BATCHGEN_MAX_POOL_SIZE": "16",
            "BATCHGEN_CHUNK_SIZE": "50", "BATCHGEN_CHUNK_LEASE_SECONDS": "8"}


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code in (200, 503)
    except httpx.HTTPError:
        return False


@pytest.fixture
def s3_fleet(fleet_backends, s3_server, tmp_path):
    """`serve --inference-workers 0` (web, control) and four inference workers, each
    process with a storage path of its own; /health answers once the workers are up."""
    database_url, broker_url = fleet_backends
    env = server_env(storage=tmp_path / "web", database_url=database_url,
                     broker_url=broker_url,
                     BATCHGEN_STORAGE_URL=f"s3://{BUCKET}/{uuid.uuid4().hex}",
                     **s3_server.env, **SETTINGS)
    server = Server(storage=tmp_path / "web", env=env, args=["--inference-workers", "0"])
    server.wait_healthy = lambda timeout: None  # healthy only once workers join, below
    workers: list[ExtraWorker] = []
    try:
        server.start()
        del server.wait_healthy
        # The web answers once serve has migrated the database the workers need.
        wait_until(lambda: _answers(f"{server.base_url}/health"), timeout=120,
                   message="the web server to answer")
        for number in range(4):
            own = {**env, "BATCHGEN_STORAGE_PATH": str(tmp_path / f"worker{number}")}
            workers.append(ExtraWorker(f"s3worker{number}", own,
                                       tmp_path / f"s3worker{number}.log").start())
        server.wait_healthy(180)
        yield server, workers
    finally:
        for worker in workers:
            worker.stop()
        server.stop()


def test_four_workers_without_a_shared_path_survive_a_kill_and_a_stop_exactly_once(s3_fleet):
    server, workers = s3_fleet
    api = RecordingApi(server.base_url)
    batch = api.create_batch(api.upload(chat_lines(COUNT))["id"]).json()
    seen: list[str] = []
    offset = 0

    def follow() -> dict:
        nonlocal offset
        response = api.http.get(f"/v1/batches/{batch['id']}/output", params={"offset": offset})
        assert response.status_code == 200, response.text
        assert response.content == b"" or response.content.endswith(b"\n")  # whole lines
        seen.extend(output_ids(response.content))
        offset = int(response.headers["X-Next-Offset"])
        return api.batch(batch["id"])

    def done_at_least(count: int):
        return lambda: (b := follow())["request_counts"]["completed"] >= count and b

    wait_until(done_at_least(COUNT // 5), timeout=120, interval=0.3, message="a fifth done")
    os.killpg(workers[0].process.pid, signal.SIGKILL)
    wait_until(done_at_least(COUNT * 2 // 5), timeout=120, interval=0.3, message="2/5 done")
    os.killpg(workers[1].process.pid, signal.SIGTERM)
    wait_until(lambda: follow()["status"] == "completed", timeout=180, interval=0.3,
               message="the batch to complete")
    follow()

    assert len(seen) == len(set(seen)), "the incremental view repeated a line"
    assert set(seen) == request_ids(COUNT)
    assert_each_custom_id_once(api, api.batch(batch["id"]), request_ids(COUNT))
    assert not (server.storage / "incremental").exists() or not any(
        (server.storage / "incremental").iterdir())
    logs = [server.log_path, *(worker.log_path for worker in workers)]
    errors = error_lines(logs, expected_exits=[workers[0].process.pid])
    assert errors == [], f"{len(errors)} error line(s):\n" + "\n".join(errors[:20])
