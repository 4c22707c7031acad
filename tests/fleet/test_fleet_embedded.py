"""The embedded default (SQLite, the embedded broker) with two inference workers
from one `serve --inference-workers 2 --gpus-per-worker 1`: each gets its own GPU
(as CUDA_VISIBLE_DEVICES; the simulated engine ignores it, so no GPU is needed), both
take chunks, a small batch is not held back by a large one, each custom_id comes out
once, no 5xx and no error line."""

from __future__ import annotations

from tests.e2e.harness import chat_lines
from tests.faults.faults import assert_each_custom_id_once, query, request_ids
from tests.fleet.fleet import error_lines

FINISHED = {"completed", "failed", "cancelled"}
LARGE, SMALL = 2_000, 50
# 200 ms a request, 16 slots a worker: 80 requests/s each, two workers well within
# what two cores orchestrate on SQLite.
SETTINGS = {"BATCHGEN_SIM_LATENCY_MS": "200", "BATCHGEN_MAX_POOL_SIZE": "16",
            "BATCHGEN_CHUNK_SIZE": "25"}


def test_two_workers_on_the_embedded_default_share_the_work(start_fleet):
    # Given: a host whose visible GPUs are 3 and 5
    fleet = start_fleet(workers=2, args=("--gpus-per-worker", "1"),
                        CUDA_VISIBLE_DEVICES="3,5", **SETTINGS)
    api = fleet.api
    # (Celery's process title overwrites /proc/PID/environ, so serve's log says it.)
    log = fleet.server.log(tail=1_000)
    assert "inference1: CUDA_VISIBLE_DEVICES=3" in log
    assert "inference2: CUDA_VISIBLE_DEVICES=5" in log

    large = api.create_batch(api.upload(chat_lines(LARGE, prefix="large"))["id"]).json()
    api.wait_status(large["id"], {"in_progress"}, timeout=60)
    small = api.create_batch(api.upload(chat_lines(SMALL, prefix="small"))["id"]).json()
    small_done = api.wait_status(small["id"], FINISHED, timeout=120)
    large_then = api.batch(large["id"])["request_counts"]
    done = api.wait_status(large["id"], FINISHED, timeout=240)

    assert_each_custom_id_once(api, small_done, request_ids(SMALL, "small"))
    assert_each_custom_id_once(api, done, request_ids(LARGE, "large"))
    assert large_then["completed"] + large_then["failed"] < LARGE / 4, large_then
    workers = query(fleet.server, "SELECT COUNT(DISTINCT worker) FROM batches_chunk "
                                  "WHERE status = 'done' AND worker != ''")[0][0]
    assert workers == 2, f"the chunks ran on {workers} worker(s), not both"
    assert api.server_errors == []
    assert error_lines(fleet.logs) == []
