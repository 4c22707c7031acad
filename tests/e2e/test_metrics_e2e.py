"""/metrics on a real server: scraped twice while a slow simulated batch runs, the
figures move."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness import chat_lines, wait_until


def scrape(base_url: str) -> dict[str, float]:
    """Sample name (with labels) -> value."""
    response = httpx.get(f"{base_url}/metrics", timeout=30)
    assert response.status_code == 200, response.text
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def worker_total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(f"{name}{{"))


def test_metrics_move_while_a_batch_runs(start_server):
    # Given: a batch of 600 requests at 8 at a time, 0.3 s each (about 20 s)
    server, api = start_server(BATCHGEN_SIM_LATENCY_MS="300", BATCHGEN_MAX_POOL_SIZE="8",
                               BATCHGEN_CHUNK_SIZE="20")
    batch = api.create_batch(api.upload(chat_lines(600))["id"]).json()

    # When: scraped once some requests are done, and again a little later
    try:
        first = wait_until(lambda: (s := scrape(server.base_url))
                           ["batchgen_requests_completed_total"] >= 16 and s,
                           timeout=60, message="requests completed in /metrics")
    except TimeoutError:
        raise AssertionError(server.log(400)) from None
    second = wait_until(lambda: (s := scrape(server.base_url))
                        ["batchgen_requests_completed_total"]
                        >= first["batchgen_requests_completed_total"] + 16 and s,
                        timeout=60, message="more requests completed in /metrics")
    still_running = api.batch(batch["id"])

    # Then: the totals, the worker's own counters and tokens grew while the batch ran
    assert still_running["status"] == "in_progress"
    assert second["batchgen_batches{status=in_progress}"] == 1
    assert second["batchgen_active_batches"] == 1
    assert second["batchgen_requests_admitted_total"] == 600
    assert second["batchgen_workers_live"] == 1
    assert second["batchgen_scheduling_pool_capacity"] == 8
    assert second["batchgen_intake_pool_size"] < first["batchgen_intake_pool_size"]
    # and the worker's own counters, which its heartbeat (every 2 s) carries, grow too
    def worker_completed() -> float:
        return worker_total(scrape(server.base_url), "batchgen_worker_requests_completed_total")

    seen = wait_until(worker_completed, timeout=30, message="the worker's counter")
    wait_until(lambda: worker_completed() > seen, timeout=30,
               message="the worker's counter to grow")
    tokens = scrape(server.base_url)["batchgen_tokens_generated_total"]
    assert tokens > first["batchgen_tokens_generated_total"]

    # Finally: cancel it rather than wait; the figures settle
    api.http.post(f"/v1/batches/{batch['id']}/cancel")
    api.wait_status(batch["id"], {"cancelled"}, timeout=60)
    done = scrape(server.base_url)
    assert done["batchgen_batches{status=cancelled}"] == 1
    assert done["batchgen_active_batches"] == 0
    assert done["batchgen_intake_pool_size"] == 0
