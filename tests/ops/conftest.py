"""Batches, chunks and workers in chosen states, for the admin, command and metrics
tests. States are reached through the services the API and the workers use; only a
crash (a worker that vanished, a torn line) is staged by writing rows and bytes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from batches import chunks, services
from batches.models import Batch, Chunk, ChunkStatus
from files import storage
from files.incremental import append_lines
from fleet.models import Worker
from tests.conftest import chat_line, jsonl


@pytest.fixture
def make_batch(upload, published, settings, django_capture_on_commit_callbacks):
    """A batch of `requests` chat lines; validated and enqueued (chunks of
    `chunk_size`) unless validate=False. Tasks are recorded, not run."""

    def _make(requests: int = 5, *, chunk_size: int = 2, validate: bool = True,
              **options) -> Batch:
        settings.BATCHGEN_CHUNK_SIZE = chunk_size
        file = upload(jsonl([chat_line(f"req-{i}") for i in range(requests)]))
        options.setdefault("endpoint", "/v1/chat/completions")
        options.setdefault("model", "test-model")
        batch = services.batch_create(input_file_id=file["id"], **options)
        if validate:
            with django_capture_on_commit_callbacks(execute=True):
                batch = services.batch_validate(batch_id=batch.id)
            assert batch.status == "in_progress", batch.error
        return batch

    return _make


def result_line(custom_id: str) -> bytes:
    return (b'{"id":"batch_req_x","custom_id":"%s","response":{"status_code":200,'
            b'"body":{"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}},'
            b'"error":null}\n' % custom_id.encode())


@pytest.fixture
def worker_row():
    """A worker's heartbeat row, as a live (or, with age, a dead) worker leaves it."""

    def _worker(name: str = "host-a:101:1", *, age: float = 0, **fields) -> Worker:
        defaults = {"hostname": "host-a", "pid": 101, "engine": "simulated", "model": "m",
                    "slots_capacity": 64, "slots_active": 0, "ready": True,
                    "heartbeat_at": timezone.now() - timedelta(seconds=age)}
        defaults.update(fields)
        return Worker.objects.create(name=name, **defaults)

    return _worker


@pytest.fixture
def run_chunk(django_capture_on_commit_callbacks):
    """Run one chunk as a worker would: claim it, write `completed` result lines to
    the incremental file, account them; close it unless close=False."""

    def _run(chunk: Chunk, *, worker: str = "host-a:101:1", completed: int | None = None,
             close: bool = True) -> Chunk:
        Chunk.objects.filter(id=chunk.id, status=ChunkStatus.PENDING).update(
            status=ChunkStatus.QUEUED)  # as the dispatcher does
        work = chunks.chunk_claim(chunk_id=chunk.id, worker=worker)
        assert work is not None
        count = chunk.count if completed is None else completed
        first = chunk.first_line - 1
        path = storage.absolute(storage.incremental_name(chunk.batch_id))
        append_lines(path, [result_line(f"req-{first + i}") for i in range(count)])
        with django_capture_on_commit_callbacks(execute=True):
            if close:
                chunks.chunks_flush(worker=worker, closing={chunk.id: (count, 0)})
                # What the finalize task (recorded, not run) does after the last chunk.
                services.batch_finalize(batch_id=chunk.batch_id)
            else:
                chunks.chunks_flush(worker=worker, progress={chunk.id: (count, 0)})
        chunk.refresh_from_db()
        return chunk

    return _run


def chunks_of(batch: Batch) -> list[Chunk]:
    return list(Chunk.objects.filter(batch_id=batch.id).order_by("index"))
