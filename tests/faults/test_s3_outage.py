"""The object store (BATCHGEN_STORAGE_URL=s3://..., the real SeaweedFS of tests/s3.py)
killed for 10 s in the middle of a running batch, and started again on the same
folder and ports. An outage like the database's: /health names it while it lasts,
work pauses and resumes, each process says it once (one WARNING, at most one INFO),
nothing is lost or repeated, and the batch completes within 30 s of the store's
return with no ERROR line or traceback in any log."""

from __future__ import annotations

import re
import time
import uuid

import httpx

from tests.e2e.harness import chat_lines, wait_until
from tests.faults.faults import assert_each_custom_id_once, request_ids
from tests.faults.test_database_outage import lines_by_pid
from tests.fleet.fleet import error_lines
from tests.s3 import BUCKET

COUNT = 600
OUTAGE_SECONDS = 10
# 200 ms a request, 16 slots: about 80 requests a second, so the batch runs some 8 s
# without the outage and is mid-way when the store goes.
SETTINGS = {"BATCHGEN_SIM_LATENCY_MS": "200", "BATCHGEN_MAX_POOL_SIZE": "16",
            "BATCHGEN_CHUNK_SIZE": "50", "BATCHGEN_PROGRESS_FLUSH_SECONDS": "0.5"}
OUTAGE_LINE = re.compile(r" WARNING batchgen\.outage object store outage: .*\(pid (\d+)\)")
RECOVERED_LINE = re.compile(r" INFO batchgen\.outage object store recovered: .*\(pid (\d+)\)")


def test_an_s3_outage_of_10_s_pauses_the_batch_which_then_completes_exactly_once(
        start_server, s3_server):
    server, api = start_server(BATCHGEN_STORAGE_URL=f"s3://{BUCKET}/{uuid.uuid4().hex}",
                               **s3_server.env, **SETTINGS)
    batch = api.create_batch(api.upload(chat_lines(COUNT))["id"],
                             endpoint="/v1/chat/completions", completion_window="24h").json()
    wait_until(lambda: api.batch(batch["id"])["request_counts"]["completed"] >= COUNT // 5,
               timeout=60, message="a fifth of the batch done")

    s3_server.stop()
    stopped_at = time.monotonic()
    try:
        unhealthy = wait_until(
            lambda: (r := httpx.get(f"{server.base_url}/health", timeout=10)).status_code == 503
            and "object store" in r.json().get("reason", "") and r.json(),
            timeout=OUTAGE_SECONDS, interval=0.5, message="/health to name the object store")
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped_at)))  # the outage
    finally:
        s3_server.start()
    back_at = time.monotonic()

    done = api.wait_status(batch["id"], {"completed", "failed", "cancelled"}, timeout=30)
    assert time.monotonic() - back_at <= 30
    assert_each_custom_id_once(api, done, request_ids(COUNT))
    assert "object store" in unhealthy["reason"]
    logs = [server.log_path]
    outages = lines_by_pid(OUTAGE_LINE, logs)
    recoveries = lines_by_pid(RECOVERED_LINE, logs)
    assert outages, "no process said the object store outage began"
    assert max(outages.values()) == 1, f"outage warnings by pid: {outages}"
    assert max(recoveries.values(), default=0) <= 1, f"recoveries by pid: {recoveries}"
    errors = error_lines(logs)
    assert errors == [], f"{len(errors)} error line(s):\n" + "\n".join(errors[:20])
