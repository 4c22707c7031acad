"""Adaptive concurrency as an operator sees it: the limit and the signals it read, from
the worker's heartbeat row, in /v1/pool/status, /metrics and the admin."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from inference.adaptive import Limits
from inference.engines.adaptive_gate import AdaptiveConcurrency
from tests.ops.test_metrics import scrape

pytestmark = pytest.mark.django_db

# A vLLM server running 5 requests with 1 waiting, none of them the batch's.
VLLM_METRICS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
"""


def engine_report() -> dict:
    """What an openai-http engine reports after one look at that server."""

    async def look() -> dict:
        adaptive = AdaptiveConcurrency(Limits(target=1.5, floor=2, ceiling=64),
                                       "http://gpu:8000/v1")
        transport = httpx.MockTransport(lambda request: httpx.Response(200, text=VLLM_METRICS))
        async with httpx.AsyncClient(transport=transport) as client:
            await adaptive.step(client)
        return adaptive.report()

    return asyncio.run(look())


def test_the_limit_and_its_signals_show_in_pool_status_metrics_and_admin(
        api, client, admin_client, worker_row):
    worker_row("host-a:1:1", engine="openai-http", admission=engine_report())
    worker_row("host-b:2:1", hostname="host-b")  # an engine without it

    status = api.get("/v1/pool/status")
    metrics = scrape(client)
    listing = admin_client.get("/admin/fleet/worker/").content.decode()

    assert status.status_code == 200
    [shown] = status.json()["adaptive_concurrency"]
    assert shown == {
        "worker": "host-a:1:1", "model": "m", "limit": 2, "mode": "shared",
        "source": "metrics", "floor": 2, "ceiling": 64, "target": 1.5, "in_flight": 0,
        "waiting_at_gate": 0, "shed_total": 0, "baseline_latency": None,
        "hold_seconds": 30.0,
        "signals": {"in_flight": 0, "server_running": 5, "server_waiting": 1, "others": 6,
                    "inter_token_latency": None, "time_to_first_token": None}}
    labels = (("hostname", "host-a"), ("worker", "host-a:1:1"))
    assert metrics[("batchgen_adaptive_limit", labels)] == 2
    assert metrics[("batchgen_adaptive_server_running", labels)] == 5
    assert metrics[("batchgen_adaptive_other_requests", labels)] == 6
    assert metrics[("batchgen_adaptive_hold_seconds", labels)] == 30.0
    assert ("batchgen_adaptive_inter_token_latency_seconds", labels) not in metrics
    assert not [key for key in metrics if key[0].startswith("batchgen_adaptive")
                and ("worker", "host-b:2:1") in key[1]]
    assert "0 / 2 (shared; server runs 5, 1 waiting, 6 others)" in listing
