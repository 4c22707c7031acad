"""/metrics: Prometheus text, read from the database at scrape time."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from batches.models import BatchStatus
from tests.ops.conftest import chunks_of

pytestmark = pytest.mark.django_db


def scrape(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_show_pool_figures_batches_requests_and_workers(client, make_batch, run_chunk,
                                                                worker_row):
    from batches.selectors import pool_status

    worker_row("host-a:1:1", slots_active=5, slots_capacity=64, requests_completed=40,
               requests_failed=2, tokens_generated=1234, tokens_active=700, token_budget=9000,
               busy_seconds=12.5, prompt_tokens_computed=5678)
    worker_row("host-b:2:1", hostname="host-b", age=3600, tokens_generated=100)  # dead
    worker_row("host-c:3:1", hostname="host-c", slots_capacity=0,
               storage_error="No space left on device writing results to /s/incremental")
    batch = make_batch(5)
    make_batch(3, validate=False)
    run_chunk(chunks_of(batch)[0])

    metrics = scrape(client)

    pool = pool_status()
    for key in ("intake_pool_size", "intake_pool_capacity", "scheduling_pool_active",
                "scheduling_pool_free", "scheduling_pool_capacity", "active_batches",
                "scheduling_pool_tokens_active", "scheduling_pool_token_budget"):
        assert metrics[(f"batchgen_{key}", ())] == pool[key]
    assert metrics[("batchgen_scheduling_pool_active", ())] == 5
    assert metrics[("batchgen_batches", (("status", "in_progress"),))] == 1
    assert metrics[("batchgen_batches", (("status", "validating"),))] == 1
    for status in BatchStatus.values:
        assert ("batchgen_batches", (("status", status),)) in metrics
    assert metrics[("batchgen_requests_completed_total", ())] == 2
    assert metrics[("batchgen_requests_failed_total", ())] == 0
    assert metrics[("batchgen_requests_admitted_total", ())] == 5
    assert sum(v for (name, _), v in metrics.items() if name == "batchgen_chunks_open") == 2
    assert metrics[("batchgen_tokens_generated_total", ())] == 1334  # dead workers count too
    assert metrics[("batchgen_workers_live", ())] == 2
    live = (("hostname", "host-a"), ("worker", "host-a:1:1"))
    full = (("hostname", "host-c"), ("worker", "host-c:3:1"))
    assert metrics[("batchgen_worker_storage_full", live)] == 0
    assert metrics[("batchgen_worker_storage_full", full)] == 1
    assert metrics[("batchgen_worker_requests_completed_total", live)] == 40
    assert metrics[("batchgen_worker_requests_failed_total", live)] == 2
    assert metrics[("batchgen_worker_tokens_generated_total", live)] == 1234
    assert metrics[("batchgen_worker_prompt_tokens_computed_total", live)] == 5678
    assert metrics[("batchgen_worker_busy_seconds_total", live)] == 12.5
    assert ("batchgen_worker_token_budget", full) not in metrics  # none: absent
    assert metrics[("batchgen_worker_slots_active", live)] == 5
    assert metrics[("batchgen_worker_slots_capacity", live)] == 64
    assert metrics[("batchgen_worker_ready", live)] == 1
    assert metrics[("batchgen_worker_tokens_active", live)] == 700
    assert metrics[("batchgen_worker_token_budget", live)] == 9000
    assert metrics[("batchgen_scheduling_pool_token_budget", ())] == 9000
    assert not any(labels and dict(labels).get("worker") == "host-b:2:1"
                   for _, labels in metrics)


def test_metrics_follow_progress_between_scrapes(client, make_batch, run_chunk):
    batch = make_batch(6)
    before = scrape(client)

    run_chunk(chunks_of(batch)[0])
    run_chunk(chunks_of(batch)[1])
    after = scrape(client)

    assert before[("batchgen_requests_completed_total", ())] == 0
    assert after[("batchgen_requests_completed_total", ())] == 4
    assert after[("batchgen_intake_pool_size", ())] == before[("batchgen_intake_pool_size", ())] - 4


def test_a_pool_without_token_budget_has_no_budget_series(client, worker_row):
    worker_row("host-a:1:1", token_budget=None)

    metrics = scrape(client)

    assert ("batchgen_scheduling_pool_token_budget", ()) not in metrics
    assert metrics[("batchgen_scheduling_pool_tokens_active", ())] == 0


def test_metrics_answer_503_when_the_database_is_down(client, monkeypatch):
    from django.db import OperationalError

    def down():
        raise OperationalError("connection refused")

    monkeypatch.setattr("batches.selectors.pool_status", down)

    response = client.get("/metrics")

    assert response.status_code == 503
    assert b"database unreachable" in response.content


def test_metrics_count_the_batches_at_risk_of_missing_their_window(client, make_batch):
    from batches.models import Batch

    batch = make_batch(5)
    make_batch(3)
    assert scrape(client)[("batchgen_batches_at_risk", ())] == 0

    Batch.objects.filter(id=batch.id).update(at_risk=True)

    assert scrape(client)[("batchgen_batches_at_risk", ())] == 1
