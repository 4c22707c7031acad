"""The inference worker's runtime, in process, with the simulated engine: chunks
claimed, results written once, progress accounted, slots returned."""

from __future__ import annotations

import threading

import orjson
import pytest

from batches import services
from batches.intake import intake_reserved
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from files import storage
from files.incremental import append_lines
from inference.output import format_line
from serving.engines.base import EngineResult
from tests.e2e.harness import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def output_of(batch: Batch) -> list[dict]:
    path = storage.absolute(storage.incremental_name(batch.id))
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_chunks_run_to_a_completed_batch(runtime_factory, batch_in_progress):
    runtime = runtime_factory()
    batch = batch_in_progress(7, chunk_size=3)

    for chunk in Chunk.objects.filter(batch=batch).order_by("index"):
        runtime.run_chunk(chunk.id)
    services.batch_finalize(batch_id=batch.id)

    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED
    assert (batch.total, batch.completed, batch.failed) == (7, 7, 0)
    assert sorted(line["custom_id"] for line in output_of(batch)) == \
        sorted(f"req-{i}" for i in range(7))
    assert set(Chunk.objects.filter(batch=batch).values_list("status", flat=True)) == {"done"}
    assert intake_reserved() == 0 and batch.intake_reserved == 0
    assert runtime.slots.active == 0
    assert chunk.lease_expires_at is None


def test_redelivered_chunk_skips_what_was_written_and_counts_it_once(
        runtime_factory, batch_in_progress):
    # Given: an attempt that wrote two results and died before accounting them
    runtime = runtime_factory()
    batch = batch_in_progress(4, chunk_size=4)
    chunk = Chunk.objects.get(batch=batch)
    Chunk.objects.filter(id=chunk.id).update(status=ChunkStatus.RUNNING, attempts=1,
                                             worker="dead-worker", lease_expires_at=None)
    Chunk.objects.filter(id=chunk.id).update(lease_expires_at="2000-01-01T00:00:00Z")
    path = storage.absolute(storage.incremental_name(batch.id))
    append_lines(path, [format_line("req-0", EngineResult(body={"earlier": True})),
                        format_line("req-1", EngineResult.failure("x", "earlier error"))])
    with path.open("ab") as fh:
        fh.write(b'{"custom_id": "req-2", "resp')  # torn by the crash

    # When: the chunk is delivered again
    runtime.run_chunk(chunk.id)

    # Then: every custom_id exactly once, the earlier results kept and counted
    lines = output_of(batch)
    assert sorted(line["custom_id"] for line in lines) == ["req-0", "req-1", "req-2", "req-3"]
    assert lines[0]["response"]["body"] == {"earlier": True}
    batch.refresh_from_db()
    assert (batch.completed, batch.failed) == (3, 1)
    chunk.refresh_from_db()
    assert chunk.status == ChunkStatus.DONE and chunk.attempts == 2


def test_a_chunk_held_by_a_live_worker_is_not_run_twice(runtime_factory, batch_in_progress):
    runtime = runtime_factory()
    batch = batch_in_progress(2, chunk_size=2)
    chunk = Chunk.objects.get(batch=batch)
    Chunk.objects.filter(id=chunk.id).update(status=ChunkStatus.RUNNING, worker="other",
                                             lease_expires_at="2999-01-01T00:00:00Z")

    assert runtime.run_chunk(chunk.id) == "not claimed"
    assert not storage.absolute(storage.incremental_name(batch.id)).exists()


def test_cancel_aborts_in_flight_requests_and_keeps_finished_lines(
        runtime_factory, batch_in_progress):
    runtime = runtime_factory(capacity=4, latency_ms=300)
    batch = batch_in_progress(40, chunk_size=40)
    chunk = Chunk.objects.get(batch=batch)
    result: list[str] = []
    thread = threading.Thread(target=lambda: result.append(runtime.run_chunk(chunk.id)))
    thread.start()
    path = storage.absolute(storage.incremental_name(batch.id))
    _wait(lambda: path.exists() and len(path.read_bytes().splitlines()) >= 4)

    services.batch_cancel(batch_id=batch.id)
    thread.join(timeout=60)

    assert not thread.is_alive() and result
    written = output_of(batch)
    assert 4 <= len(written) < 40
    batch.refresh_from_db()
    services.batch_finalize(batch_id=batch.id)
    batch.refresh_from_db()
    assert batch.status == BatchStatus.CANCELLED
    assert batch.completed == len(written) and batch.output_file_id is not None
    assert intake_reserved() == 0 and runtime.slots.active == 0


def test_slots_never_exceed_capacity(runtime_factory, batch_in_progress):
    runtime = runtime_factory(capacity=3, latency_ms=20)
    batch = batch_in_progress(12, chunk_size=6)
    peak = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak.append(runtime.slots.active)
            stop.wait(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=runtime.run_chunk, args=(c.id,))
               for c in Chunk.objects.filter(batch=batch)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    stop.set()
    watcher.join()

    assert max(peak) <= 3 and max(peak) >= 2
    assert runtime.slots.active == 0
    batch.refresh_from_db()
    assert batch.completed == 12


def _wait(predicate, timeout: float = 30.0) -> None:
    event = threading.Event()
    deadline = timeout
    while not predicate():
        if deadline <= 0:
            raise TimeoutError("condition not met")
        event.wait(0.02)
        deadline -= 0.02


def test_a_draining_worker_hands_its_chunk_back_at_once(runtime_factory, batch_in_progress,
                                                        published):
    """SIGTERM (Celery's warm shutdown) drains the runtime: the chunk goes back to the
    queue now, with what was written accounted, not after its lease runs out."""
    runtime = runtime_factory(capacity=2, latency_ms=200)
    batch = batch_in_progress(10, chunk_size=10)
    chunk = Chunk.objects.get(batch=batch)
    published.clear()
    thread = threading.Thread(target=runtime.run_chunk, args=(chunk.id,))
    thread.start()
    path = storage.absolute(storage.incremental_name(batch.id))
    _wait(lambda: path.exists() and len(path.read_bytes().splitlines()) >= 2)

    runtime.drain()
    thread.join(timeout=60)

    chunk.refresh_from_db()
    written = output_of(batch)
    assert chunk.status == ChunkStatus.QUEUED and chunk.worker == ""
    assert chunk.completed == len(written) < 10
    assert ("inference.run_chunk", (batch.id, chunk.id)) in published
    assert runtime.slots.active == 0


def test_a_later_chunk_waits_until_the_earlier_one_has_admitted_everything(
        runtime_factory, batch_in_progress):
    # Two chunks held at once by a worker with 2 slots: the slots freed by the first
    # chunk's requests go to its own next requests, not to the second chunk, so a
    # chunk's requests (with grouping: one prefix group) reach the engine together.
    runtime = runtime_factory(capacity=2, latency_ms=20)
    batch = batch_in_progress(12, chunk_size=6)
    started: list[int] = []  # the chunk index of each request, in the order it started
    generate = runtime.engine.generate

    async def recording(request):
        started.append(int(request.request_id.split("-")[-3]))
        return await generate(request)

    runtime.engine.generate = recording
    first, second = Chunk.objects.filter(batch=batch).order_by("index")
    threads = [threading.Thread(target=runtime.run_chunk, args=(first.id,))]
    threads[0].start()
    wait_until(lambda: runtime.slots.active > 0, timeout=30, interval=0.005)
    threads.append(threading.Thread(target=runtime.run_chunk, args=(second.id,)))
    threads[1].start()
    for thread in threads:
        thread.join(60)

    assert started == [0] * 6 + [1] * 6
    assert sorted(line["custom_id"] for line in output_of(batch)) == \
        sorted(f"req-{i}" for i in range(12))
    assert runtime.slots.active == 0 and runtime.slots.tokens_active == 0
