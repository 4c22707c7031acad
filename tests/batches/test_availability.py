"""A running batch whose model has no ready inference worker says so, and fails with
`model_unavailable` after BATCHGEN_MODEL_UNAVAILABLE_SECONDS (batches/availability.py)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from batches import availability, services
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from batches.serializers import BatchOutputSerializer
from files.models import File
from fleet.models import Worker

pytestmark = pytest.mark.django_db

S = BatchStatus


def ready_worker(model: str = "m", *, ready: bool = True) -> Worker:
    return Worker.objects.create(name=f"w-{model}-{ready}", hostname="h", pid=1, engine="simulated",
                                 model=model, slots_capacity=8, ready=ready,
                                 heartbeat_at=timezone.now())


def waited_since(batch, seconds: float) -> None:
    """The wait began `seconds` ago (as if the watch had seen it then)."""
    error = Batch.objects.get(id=batch.id).error
    Batch.objects.filter(id=batch.id).update(error={**error, "since": error["since"] - seconds})


def result(custom_id: str) -> bytes:
    return json.dumps({"id": f"batch_req_{custom_id}", "custom_id": custom_id,
                       "response": {"status_code": 200}, "error": None}).encode() + b"\n"


def test_a_batch_waiting_for_a_model_without_a_ready_worker_says_so(running_batch, api):
    batch = running_batch(4)
    ready_worker(ready=False)  # alive, its engine not started: nothing runs the requests

    assert availability.batches_watch_models() == 0

    waiting = Batch.objects.get(id=batch.id)
    assert waiting.status == S.IN_PROGRESS
    assert waiting.error["code"] == "model_unavailable"
    assert "model m" in waiting.error["message"]
    assert "fails with model_unavailable" in waiting.error["message"]
    # The API shows code and message, as for storage_full; when the wait began is kept.
    shown = api.get(f"/v1/batches/{batch.id}").json()["error"]
    assert "since" not in shown and shown["code"] == "model_unavailable"
    assert BatchOutputSerializer(waiting).data["error"]["code"] == "model_unavailable"


def test_the_wait_clears_when_a_worker_of_the_model_is_ready(running_batch):
    batch = running_batch(4)
    availability.batches_watch_models()
    assert Batch.objects.get(id=batch.id).error["code"] == "model_unavailable"

    ready_worker()
    availability.batches_watch_models()

    assert Batch.objects.get(id=batch.id).error is None


def test_a_batch_with_a_ready_worker_is_left_alone(running_batch):
    batch = running_batch(4)
    ready_worker()

    availability.batches_watch_models()

    assert Batch.objects.get(id=batch.id).error is None


def test_after_the_bound_the_batch_fails_keeping_its_written_lines(
        running_batch, storage, reserved, settings):
    settings.BATCHGEN_MODEL_UNAVAILABLE_SECONDS = 60
    batch = running_batch(5, chunk_size=2)
    Chunk.objects.filter(batch=batch, index=0).update(status=ChunkStatus.DONE, completed=2)
    Batch.objects.filter(id=batch.id).update(completed=2, intake_reserved=3)
    partial = result("req-0") + result("req-1")
    (storage / "incremental" / f"{batch.id}.jsonl").write_bytes(partial)
    availability.batches_watch_models()

    waited_since(batch, 59)
    assert availability.batches_watch_models() == 0  # within the bound: still waiting
    assert Batch.objects.get(id=batch.id).status == S.IN_PROGRESS

    waited_since(batch, 2)
    assert availability.batches_watch_models() == 1

    failed = Batch.objects.get(id=batch.id)
    assert failed.status == S.FAILED
    assert failed.error["code"] == "model_unavailable"
    assert "BATCHGEN_MODEL_UNAVAILABLE_SECONDS" in failed.error["message"]
    assert list(Chunk.objects.filter(batch=batch).order_by("index")
                .values_list("status", flat=True)) == [
        ChunkStatus.DONE, ChunkStatus.SKIPPED, ChunkStatus.SKIPPED]
    assert failed.intake_reserved == 0 and reserved() == 0  # its capacity is returned
    output = File.objects.get(id=failed.output_file_id)  # the written lines are its output
    assert output.bytes == len(partial)
    # Once failed, nothing more happens to it.
    assert availability.batches_watch_models() == 0
    assert File.objects.filter(id=failed.output_file_id).count() == 1


def test_a_bound_of_zero_waits_without_failing(running_batch, settings):
    settings.BATCHGEN_MODEL_UNAVAILABLE_SECONDS = 0
    batch = running_batch(2)
    availability.batches_watch_models()
    waited_since(batch, 10 * 86400)

    assert availability.batches_watch_models() == 0

    waiting = Batch.objects.get(id=batch.id)
    assert (waiting.status, waiting.error["code"]) == (S.IN_PROGRESS, "model_unavailable")
    assert "fails with" not in waiting.error["message"]


def test_a_storage_full_wait_is_not_overwritten(running_batch):
    batch = running_batch(2)
    services.batch_storage_full(batch_id=batch.id)

    availability.batches_watch_models()

    assert Batch.objects.get(id=batch.id).error["code"] == "storage_full"


def test_a_transition_ends_the_shown_wait(running_batch):
    batch = running_batch(2)
    availability.batches_watch_models()

    services.batch_transition(batch_id=batch.id, to=S.CANCELLING)

    assert Batch.objects.get(id=batch.id).error is None


def test_only_the_batches_of_the_unavailable_model_wait(running_batch, settings):
    from serving.model_info import served_models

    settings.BATCHGEN_MODELS = "m=/models/m,other=/models/other"
    served_models.cache_clear()
    try:
        batch = running_batch(2)  # its lines name model m
        ready_worker("m")

        availability.batches_watch_models()
        assert Batch.objects.get(id=batch.id).error is None

        Worker.objects.filter(model="m").update(
            heartbeat_at=timezone.now() - timedelta(hours=1))  # its worker is gone
        Worker.objects.create(name="w-other", hostname="h", pid=2, engine="simulated",
                              model="other", slots_capacity=8, ready=True,
                              heartbeat_at=timezone.now())
        availability.batches_watch_models()

        assert Batch.objects.get(id=batch.id).error["message"].startswith(
            "No inference worker of model m ")
    finally:
        served_models.cache_clear()


def test_the_admin_shows_why_the_batch_waits(running_batch, admin_client):
    batch = running_batch(2)
    availability.batches_watch_models()

    page = admin_client.get(f"/admin/batches/batch/{batch.id}/change/").content.decode()

    assert "<code>model_unavailable</code>: No inference worker of model m" in page
