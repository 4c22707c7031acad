"""The disk filling up under the real inference runtime, in process, for machines
where a small volume cannot be mounted (test_disk_full.py needs root): os.write on
the incremental file fails with ENOSPC, as it does on a full volume.

What the worker does today: the chunk's thread raises (the task fails), the lines
already written stay and nothing half-written does (append_lines cuts the file back),
the chunk stays `running` until its lease runs out, recovery requeues it, and a
retry once there is room again finishes it without writing anything twice."""

from __future__ import annotations

import errno
import os

import pytest
from django.utils import timezone

from batches import recovery, services
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from files import incremental, storage
from inference.engines.base import EngineConfig
from inference.runtime import InferenceRuntime
from tests.conftest import chat_line, jsonl
from tests.e2e.harness import output_ids, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runtime(published):
    runtime = InferenceRuntime(
        config=EngineConfig(engine="simulated", model="/nonexistent",
                            served_model_name="sim"), capacity=64, name="disk-full-worker")
    runtime.start()
    assert runtime.ready.wait(30)
    yield runtime
    runtime.stop()


@pytest.fixture
def full_disk(monkeypatch):
    """While `full` is set, writes to incremental files fail with ENOSPC."""
    real_write = os.write
    state = {"full": False}

    def write(fd, data):
        if state["full"] and "/incremental/" in os.path.realpath(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(incremental.os, "write", write)
    return state


def expire_leases(batch: Batch) -> None:
    Chunk.objects.filter(batch=batch, status=ChunkStatus.RUNNING).update(
        lease_expires_at=timezone.now() - timezone.timedelta(seconds=1))


def test_full_disk_fails_the_attempt_keeps_what_was_written_and_retries(
        runtime, full_disk, upload, settings):
    # Given: a batch of two chunks; the first ran before the disk filled up
    settings.BATCHGEN_CHUNK_SIZE = 10
    file = upload(jsonl([chat_line(f"req-{i}", f"question {i}") for i in range(20)]))
    batch = services.batch_create(input_file_id=file["id"], endpoint="/v1/chat/completions",
                                  model="sim")
    batch = services.batch_validate(batch_id=batch.id)
    first, second = Chunk.objects.filter(batch=batch).order_by("index")
    runtime.run_chunk(first.id)
    output = storage.absolute(storage.incremental_name(batch.id))
    written = output.read_bytes()

    # When: the disk is full while the second chunk runs
    full_disk["full"] = True
    with pytest.raises(OSError) as raised:
        runtime.run_chunk(second.id)

    # Then: the attempt fails with ENOSPC; the file is as it was; the chunk stays
    # running (its lease will run out); the batch waits; no slot is held
    assert raised.value.errno == errno.ENOSPC
    assert output.read_bytes() == written
    second.refresh_from_db()
    assert (second.status, second.attempts, second.completed) == (ChunkStatus.RUNNING, 1, 0)
    batch.refresh_from_db()
    assert (batch.status, batch.completed) == (BatchStatus.IN_PROGRESS, 10)
    # (the requests in flight are cancelled on the engine loop, which frees their slots)
    wait_until(lambda: runtime.slots.active == 0, timeout=10, message="every slot freed")

    # When: its lease runs out, recovery requeues it, and the retry fails again
    expire_leases(batch)
    assert recovery.recover().chunks_requeued == 1
    with pytest.raises(OSError):
        runtime.run_chunk(second.id)
    assert output.read_bytes() == written

    # When: there is room again and the chunk is retried
    full_disk["full"] = False
    expire_leases(batch)
    assert recovery.recover().chunks_requeued == 1
    runtime.run_chunk(second.id)
    services.batch_finalize(batch_id=batch.id)

    # Then: every custom_id once, the earlier lines untouched, the counts right
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED
    assert (batch.total, batch.completed, batch.failed) == (20, 20, 0)
    content = output.read_bytes()
    assert content.startswith(written)
    assert sorted(output_ids(content)) == sorted(f"req-{i}" for i in range(20))
    second.refresh_from_db()
    assert (second.status, second.attempts) == (ChunkStatus.DONE, 3)
