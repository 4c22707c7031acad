"""Batches in a chosen state, made through the services the API uses."""

from __future__ import annotations

import orjson
import pytest

from batches import eta, services
from batches.intake import intake_reserved
from batches.models import Batch, Chunk
from files import storage
from tests.conftest import chat_line, jsonl


@pytest.fixture
def whole(monkeypatch):
    """The requests in an engine at the start of an ETA play with all their steps
    left (eta.IN_ENGINE_SPREAD at 0), so a case's figures are whole requests' and
    read by hand; tests/batches/test_deadlines.py tries the spread itself."""
    monkeypatch.setattr(eta, "IN_ENGINE_SPREAD", 0.0)


@pytest.fixture
def create_batch(upload, published):
    """Upload `lines` and create a batch on them (status validating). The validation
    task is recorded by `published`, not run."""

    def _create(lines=None, *, content: bytes | None = None, **options) -> Batch:
        if content is None:
            content = jsonl(lines if lines is not None else [chat_line("a")])
        file = upload(content)
        options.setdefault("endpoint", "/v1/chat/completions")
        options.setdefault("model", "test-model")
        return services.batch_create(input_file_id=file["id"], **options)

    return _create


@pytest.fixture
def running_batch(create_batch, settings, django_capture_on_commit_callbacks):
    """A batch validated and enqueued: `requests` chat lines in chunks of
    `chunk_size`, every chunk queued and published."""

    def _running(requests: int = 5, *, chunk_size: int = 2, **options) -> Batch:
        settings.BATCHGEN_CHUNK_SIZE = chunk_size
        batch = create_batch([chat_line(f"req-{i}") for i in range(requests)], **options)
        with django_capture_on_commit_callbacks(execute=True):
            batch = services.batch_validate(batch_id=batch.id)
        assert batch.status == "in_progress", batch.error
        return batch

    return _running


@pytest.fixture
def finished_batch(runtime_factory, upload, settings):
    """Upload `lines`, validate them into chunks of `chunk_size`, run every chunk on a
    simulated runtime and finalize: the batch row and its output lines, parsed."""

    def _finished(lines: list[dict], *, endpoint: str,
                  chunk_size: int = 3) -> tuple[Batch, list[dict]]:
        settings.BATCHGEN_CHUNK_SIZE = chunk_size
        file = upload(jsonl(lines))
        batch = services.batch_create(input_file_id=file["id"], endpoint=endpoint, model="sim")
        batch = services.batch_validate(batch_id=batch.id)
        runtime = runtime_factory()
        for chunk in Chunk.objects.filter(batch=batch).order_by("index"):
            runtime.run_chunk(chunk.id)
        services.batch_finalize(batch_id=batch.id)
        batch.refresh_from_db()
        path = storage.absolute(storage.incremental_name(batch.id))
        return batch, [orjson.loads(raw) for raw in path.read_bytes().splitlines()]

    return _finished


@pytest.fixture
def reserved():
    """The IntakePool's reservation now."""
    return intake_reserved
