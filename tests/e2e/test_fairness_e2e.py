"""Fair sharing: a small batch behind a large one does not wait for it."""

from __future__ import annotations

from tests.e2e.harness import chat_lines


def test_small_batch_finishes_before_large_is_a_quarter_done(start_server):
    server, api = start_server(BATCHGEN_SIM_LATENCY_MS="300", BATCHGEN_MAX_POOL_SIZE="500",
                               BATCHGEN_CHUNK_SIZE="100")
    large_file = api.upload(chat_lines(20_000, prefix="large"))
    small_file = api.upload(chat_lines(50, prefix="small"))
    large = api.create_batch(large_file["id"]).json()
    api.wait_status(large["id"], {"in_progress"}, timeout=60)

    small = api.create_batch(small_file["id"]).json()
    done = api.wait_status(small["id"], {"completed", "failed", "cancelled"}, timeout=120)

    assert done["status"] == "completed"
    large_now = api.batch(large["id"])
    finished = large_now["request_counts"]["completed"] + large_now["request_counts"]["failed"]
    assert finished < 20_000 / 4, f"the large batch had {finished} done already"
    api.http.post(f"/v1/batches/{large['id']}/cancel")
