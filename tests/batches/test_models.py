"""Several served models on one BatchGen: chunks hold one model each, the dispatcher
publishes each to its model's queue and fills each model's window apart."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.utils import timezone

from batches import services
from batches.dispatch import MIN_WINDOW, dispatch
from batches.models import Chunk, ChunkStatus
from batches.validation import validate_file
from fleet.models import Worker
from tests.conftest import chat_line, jsonl

pytestmark = pytest.mark.django_db


@pytest.fixture
def queues(monkeypatch):
    """The queue each published chunk went to: {chunk id: queue}."""
    from celery import Celery

    sent: dict[int, str] = {}

    def fake_send_task(self, name, args=None, kwargs=None, **options):
        if name == "inference.run_chunk":
            sent[args[1]] = options["queue"]

    monkeypatch.setattr(Celery, "send_task", fake_send_task)
    return sent


def mixed_lines(count: int) -> list[dict]:
    """Lines naming "m" and "e" in turn."""
    return [chat_line(f"r{i}", f"prompt {i}", model="em"[i % 2]) for i in range(count)]


def validate(tmp_path: Path, lines, *, grouped: bool):
    path = tmp_path / "input.jsonl"
    path.write_bytes(jsonl(lines))
    return validate_file(path, endpoint="/v1/chat/completions", chunk_size=3,
                         max_line_bytes=1 << 20, max_requests=1000, models={"m": "m", "e": "e"},
                         order_path=tmp_path / "order" if grouped else None)


@pytest.mark.parametrize("grouped", [True, False])
def test_a_mixed_file_is_cut_into_chunks_of_one_model_each(tmp_path, grouped):
    lines = mixed_lines(10)
    report = validate(tmp_path, lines, grouped=grouped)

    assert report.invalid == 0 and report.total == 10
    per_model = {"m": 0, "e": 0}
    for chunk in report.chunks:
        per_model[chunk.model] += chunk.count
    assert per_model == {"m": 5, "e": 5}
    if grouped:  # sorted by model (in order of first use): two runs, cut at the chunk size
        assert [(c.model, c.count) for c in report.chunks] == [
            ("e", 3), ("e", 2), ("m", 3), ("m", 2)]
    else:  # contiguous: a chunk closes where the model changes
        assert all(chunk.count == 1 for chunk in report.chunks)


def test_a_line_naming_an_unserved_model_is_refused_not_substituted(tmp_path):
    report = validate(tmp_path, [chat_line("a", model="m"), chat_line("b", model="gpt-4o")],
                      grouped=True)

    assert report.invalid == 1
    assert report.errors[0]["code"] == "model_not_found"
    assert report.errors[0]["line"] == 2 and report.errors[0]["param"] == "body.model"
    assert "'gpt-4o'" in report.errors[0]["message"]
    assert report.chunks == []  # nothing of a bad batch is queued


def test_each_chunk_is_published_to_the_queue_of_its_model(
        two_models, create_batch, queues, settings, django_capture_on_commit_callbacks):
    settings.BATCHGEN_CHUNK_SIZE = 2
    batch = create_batch(mixed_lines(8))
    with django_capture_on_commit_callbacks(execute=True):
        services.batch_validate(batch_id=batch.id)

    chunks = list(Chunk.objects.filter(batch_id=batch.id))
    assert {chunk.model for chunk in chunks} == {"m", "e"}
    assert sum(chunk.count for chunk in chunks if chunk.model == "e") == 4
    assert queues == {chunk.id: f"inference.{chunk.model}" for chunk in chunks}


def test_a_model_with_no_live_worker_does_not_take_the_window_of_the_others(
        two_models, create_batch, queues, settings, django_capture_on_commit_callbacks):
    # "m" has a worker whose threads hold 10 chunks; "e" has none.
    settings.BATCHGEN_CHUNK_SIZE = 1
    Worker.objects.create(name="w-m", hostname="h", pid=1, engine="simulated", model="m",
                          slots_capacity=8, ready=True, heartbeat_at=timezone.now())
    batch = create_batch(mixed_lines(60))
    with django_capture_on_commit_callbacks(execute=True):
        services.batch_validate(batch_id=batch.id)

    queued = Chunk.objects.filter(batch_id=batch.id, status=ChunkStatus.QUEUED)
    # "m": its worker's 8 slots / 1 per chunk + 2, plus 2 of slack; "e": the minimum
    assert queued.filter(model="m").count() == 12
    assert queued.filter(model="e").count() == MIN_WINDOW
    # Full windows: a further dispatch adds nothing for either
    with django_capture_on_commit_callbacks(execute=True):
        assert dispatch() == 0


def test_chunks_made_before_chunks_named_a_model_go_to_the_default_models_queue(
        two_models, create_batch, queues, settings, django_capture_on_commit_callbacks):
    settings.BATCHGEN_CHUNK_SIZE = 1
    batch = create_batch([chat_line(f"r{i}", model="m") for i in range(3)])
    with django_capture_on_commit_callbacks(execute=True):
        services.batch_validate(batch_id=batch.id)
    Chunk.objects.filter(batch_id=batch.id, status=ChunkStatus.QUEUED).update(
        status=ChunkStatus.PENDING)
    Chunk.objects.filter(batch_id=batch.id).update(model="")  # as the migration leaves them
    queues.clear()

    with django_capture_on_commit_callbacks(execute=True):
        assert dispatch() == 3

    assert set(queues.values()) == {"inference.m"}


def test_an_adapters_lines_join_its_base_models_chunks_and_queue(
        create_batch, queues, settings, tmp_path, django_capture_on_commit_callbacks):
    from serving.model_info import served_models

    adapter = tmp_path / "sql"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    settings.BATCHGEN_MODELS = f"m=/models/m,sql=lora:{adapter}@m"
    settings.BATCHGEN_CHUNK_SIZE = 4
    served_models.cache_clear()
    try:
        batch = create_batch([chat_line(f"r{i}", model=("m", "sql")[i % 2]) for i in range(8)])
        with django_capture_on_commit_callbacks(execute=True):
            services.batch_validate(batch_id=batch.id)
        refused = create_batch([chat_line("a", model="sql"), chat_line("b", model="sql2")])
        services.batch_validate(batch_id=refused.id)
    finally:
        served_models.cache_clear()

    # One model's workers run both: its chunks mix the model's lines and its adapter's
    chunks = list(Chunk.objects.filter(batch_id=batch.id))
    assert [(chunk.model, chunk.count) for chunk in chunks] == [("m", 4), ("m", 4)]
    assert set(queues.values()) == {"inference.m"}
    refused.refresh_from_db()
    assert [(e["code"], e["line"]) for e in refused.errors] == [("model_not_found", 2)]
