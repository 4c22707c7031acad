"""Exactly-once output when the inference worker is SIGKILLed mid-batch."""

from __future__ import annotations

import json
import signal

import psutil

from tests.e2e.harness import chat_lines, wait_until
from tests.faults.faults import assert_each_custom_id_once, request_ids


def test_sigkilled_worker_leaves_each_custom_id_exactly_once(start_server):
    # Given: a 10,000-request batch slow enough to be killed in several times
    server, api = start_server(BATCHGEN_SIM_LATENCY_MS="250", BATCHGEN_MAX_POOL_SIZE="600",
                               BATCHGEN_CHUNK_SIZE="100", BATCHGEN_CHUNK_LEASE_SECONDS="20")
    input_file = api.upload(chat_lines(10_000))
    batch = api.create_batch(input_file["id"]).json()
    api.wait_status(batch["id"], {"in_progress"}, timeout=60)

    # When: the inference worker is SIGKILLed three times while chunks run; the
    # supervisor restarts it each time.
    killed = []
    for threshold in (1_500, 4_000, 6_500):
        wait_until(lambda t=threshold: api.batch(batch["id"])["request_counts"]["completed"] >= t,
                   timeout=180, message=f"{threshold} completed requests")
        workers = wait_until(lambda: server.children("-Q inference"), timeout=60,
                             message="a running inference worker")
        for worker in workers:
            worker.send_signal(signal.SIGKILL)
            killed.append(worker.pid)
        psutil.wait_procs(workers, timeout=10)

    # Then
    done = api.wait_status(batch["id"], {"completed", "failed", "cancelled"}, timeout=400)
    assert len(killed) >= 3
    assert done["status"] == "completed", done
    assert_each_custom_id_once(api, done, request_ids(10_000))
    assert done["request_counts"] == {"total": 10_000, "completed": 10_000, "failed": 0}
    assert "restarting" in server.log(tail=100_000)
    # Usage is exact despite results written by killed workers and never flushed.
    bodies = [json.loads(raw)["response"]["body"]
              for raw in api.content(done["output_file_id"]).splitlines()]
    assert done["usage"]["input_tokens"] == sum(b["usage"]["prompt_tokens"] for b in bodies)
    assert done["usage"]["output_tokens"] == sum(b["usage"]["completion_tokens"]
                                                 for b in bodies)
