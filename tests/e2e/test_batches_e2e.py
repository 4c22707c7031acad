"""A batch through real processes: web, control worker, inference worker (simulated
engine) and a real broker, for each broker BatchGen supports."""

from __future__ import annotations

import pytest

from tests import services
from tests.e2e.harness import (
    chat_lines,
    fresh_postgres_database,
    output_ids,
    purge_broker,
    wait_until,
)

BROKERS = ["embedded", "redis", "rabbitmq"]


@pytest.fixture(params=BROKERS)
def broker_options(request, tmp_path):
    """Embedded broker on SQLite; Redis on SQLite; RabbitMQ on PostgreSQL."""
    if request.param == "embedded":
        yield {}
        return
    if request.param == "redis":
        services.require("redis")
        options = {"broker_url": services.REDIS_URL}
    else:
        services.require("rabbitmq")
        services.require("postgresql")
        database_url, drop = fresh_postgres_database(services.POSTGRES_URL)
        request.addfinalizer(drop)
        options = {"broker_url": services.RABBITMQ_URL, "database_url": database_url}
    from tests.e2e.harness import server_env

    purge_broker(server_env(storage=tmp_path / "purge", broker_url=options["broker_url"]))
    yield options


def test_batch_of_5000_completes_and_pool_returns_to_empty(start_server, broker_options):
    # Given: slow enough requests that the batch is seen running
    server, api = start_server(**broker_options, BATCHGEN_SIM_LATENCY_MS="400",
                               BATCHGEN_MAX_POOL_SIZE="1000")
    input_file = api.upload(chat_lines(5000))

    # When
    created = api.create_batch(input_file["id"], metadata={"run": "e2e"})

    # Then
    assert created.status_code == 200, created.text
    batch = created.json()
    assert batch["status"] == "validating"
    running = api.wait_status(batch["id"], {"in_progress", "completed"}, timeout=120)
    assert running["status"] == "in_progress", "the batch was never seen in progress"
    assert running["in_progress_at"] is not None and running["request_counts"]["total"] == 5000
    done = api.wait_status(batch["id"], {"completed", "failed", "cancelled"}, timeout=300)
    assert done["status"] == "completed", done
    counts = done["request_counts"]
    assert counts == {"total": 5000, "completed": 5000, "failed": 0}
    assert done["created_at"] <= done["in_progress_at"] <= done["finalizing_at"] \
        <= done["completed_at"]
    ids = output_ids(api.content(done["output_file_id"]))
    assert sorted(ids) == sorted(f"req-{i}" for i in range(5000))
    # Slot figures come with the worker's next heartbeat (every 2 s).
    pool = wait_until(lambda: (p := api.pool())["scheduling_pool_active"] == 0 and p,
                      timeout=15, message="the scheduling pool to empty")
    assert pool["intake_pool_size"] == 0
    assert pool["active_batches"] == 0
    assert pool["scheduling_pool_free"] == pool["scheduling_pool_capacity"] == 1000
    # The access log has the upload, the create and the download, not the polls
    log = server.log(tail=1_000_000)
    assert '"POST /v1/files HTTP/1.1" 200' in log
    assert '"POST /v1/batches HTTP/1.1" 200' in log
    assert f'"GET /v1/files/{done["output_file_id"]}/content HTTP/1.1" 200' in log
    assert "GET /v1/pool/status" not in log
    assert f"GET /v1/batches/{batch['id']} " not in log


def test_capacity_gives_429_or_capacity_exceeded_never_half_enqueued(start_server):
    server, api = start_server(BATCHGEN_MAX_INTAKE_CAPACITY="300",
                               BATCHGEN_SIM_LATENCY_MS="3000", BATCHGEN_MAX_POOL_SIZE="100")
    filling = api.upload(chat_lines(300, prefix="a"))
    too_big = api.upload(chat_lines(400, prefix="c"))
    waiting = api.upload(chat_lines(10, prefix="b"))

    # A batch of 300 fills the intake pool.
    first = api.create_batch(filling["id"]).json()
    api.wait_status(first["id"], {"in_progress"}, timeout=60)
    assert api.pool()["intake_pool_size"] + api.pool()["scheduling_pool_active"] == 300

    # The pool is full: new batches are refused up front.
    refused = api.create_batch(waiting["id"])
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) > 0
    assert refused.json()["error"]["type"] == "rate_limit_error"

    # Once it drains, a batch that can never fit fails whole with capacity_exceeded.
    api.wait_status(first["id"], {"completed"}, timeout=120)
    failed = api.create_batch(too_big["id"]).json()
    failed = api.wait_status(failed["id"], {"failed", "in_progress"}, timeout=60)
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "capacity_exceeded"
    assert failed["output_file_id"] is None and failed["request_counts"]["completed"] == 0
    pool = api.pool()
    assert pool["intake_pool_size"] == 0 and pool["active_batches"] == 0
