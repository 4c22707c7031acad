"""Chunk accounting (batches.chunks): one flush for all of a worker's chunks, a fixed
number of statements whatever it holds, and no deadlock or lost count when many
workers flush, dispatch, cancel and admit at once on PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from batches import chunks, dispatch, services
from batches.intake import intake_reserved
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from tests.concurrency import require_concurrent_database, run_together
from tests.conftest import chat_line, jsonl

pytestmark = pytest.mark.django_db


def claim_all(batch: Batch, worker: str) -> list[int]:
    Chunk.objects.filter(batch=batch).update(status=ChunkStatus.QUEUED)
    ids = list(Chunk.objects.filter(batch=batch).order_by("id").values_list("id", flat=True))
    for chunk_id in ids:
        assert chunks.chunk_claim(chunk_id=chunk_id, worker=worker) is not None
    return ids


def flush_statements(worker: str, ids: list[int]) -> int:
    with CaptureQueriesContext(connection) as queries:
        chunks.chunks_flush(worker=worker, progress={i: (1, 0) for i in ids}, holding=ids)
    return len(queries)


def test_a_flush_costs_the_same_statements_for_one_chunk_or_twenty(running_batch):
    one = running_batch(2, chunk_size=2)
    many = running_batch(40, chunk_size=2)
    single = claim_all(one, "w-one")
    twenty = claim_all(many, "w-many")
    assert len(twenty) == 20

    assert flush_statements("w-one", single) == flush_statements("w-many", twenty)
    assert Batch.objects.get(id=many.id).completed == 20
    assert Batch.objects.get(id=many.id).intake_reserved == 20


def test_a_flush_closes_chunks_returns_capacity_and_finalizes_the_last(
        running_batch, published, django_capture_on_commit_callbacks):
    batch = running_batch(5, chunk_size=2)
    ids = claim_all(batch, "w1")
    published.clear()

    with django_capture_on_commit_callbacks(execute=True):
        result = chunks.chunks_flush(worker="w1", closing={ids[0]: (2, 0), ids[1]: (1, 1),
                                                           ids[2]: (0, 0)})

    assert result.closed == {ids[0]: ChunkStatus.DONE, ids[1]: ChunkStatus.DONE,
                             ids[2]: ChunkStatus.SKIPPED}
    batch.refresh_from_db()
    assert (batch.completed, batch.failed, batch.intake_reserved) == (3, 1, 0)
    assert ("batches.finalize_batch", (batch.id,)) in published


def test_a_chunk_whose_lease_was_taken_is_lost_and_its_counts_are_not_kept(running_batch):
    batch = running_batch(4, chunk_size=2)
    mine, taken = claim_all(batch, "w1")
    Chunk.objects.filter(id=taken).update(worker="w2")  # recovery gave it to another

    result = chunks.chunks_flush(worker="w1", progress={mine: (1, 0), taken: (2, 0)},
                                 holding=[mine, taken])

    assert result.lost == {taken}
    assert Batch.objects.get(id=batch.id).completed == 1
    assert Chunk.objects.get(id=taken).completed == 0


def test_a_flush_tells_which_held_batches_must_stop(running_batch):
    batch = running_batch(4, chunk_size=2)
    ids = claim_all(batch, "w1")
    Batch.objects.filter(id=batch.id).update(status=BatchStatus.CANCELLING)

    assert chunks.chunks_flush(worker="w1", holding=ids).stop_batches == {batch.id}


@pytest.mark.django_db(transaction=True)
def test_many_workers_flushing_dispatching_and_cancelling_at_once_never_deadlock(
        upload, published, settings):
    """What deadlocked within seconds on PostgreSQL before the lock order (issue 12):
    progress flushes of several workers over chunks of the same batches, dispatches,
    a cancel and admissions, all at once. Every call succeeds; every count adds up."""
    require_concurrent_database()
    settings.BATCHGEN_CHUNK_SIZE = 2
    batches = []
    for n in range(3):
        batch = services.batch_create(
            input_file_id=upload(jsonl([chat_line(f"b{n}-{i}") for i in range(24)]))["id"],
            endpoint="/v1/chat/completions", model="m")
        batches.append(services.batch_validate(batch_id=batch.id))
    # Half of each batch's chunks run on four workers, the rest wait to be dispatched.
    held: dict[str, list[int]] = {f"w{i}": [] for i in range(4)}
    running = Chunk.objects.filter(index__lt=6).order_by("id")
    for position, chunk in enumerate(running):
        worker = f"w{position % 4}"
        Chunk.objects.filter(id=chunk.id).update(status=ChunkStatus.QUEUED)
        assert chunks.chunk_claim(chunk_id=chunk.id, worker=worker)
        held[worker].append(chunk.id)
    cancelled = batches[2]
    late = services.batch_create(
        input_file_id=upload(jsonl([chat_line(f"late-{i}") for i in range(8)]))["id"],
        endpoint="/v1/chat/completions", model="m")
    rounds = 15
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker_flushes(name: str):
        for round_ in range(rounds):
            last = round_ == rounds - 1
            counts = {chunk_id: (1, 0) if round_ < 2 else (0, 0) for chunk_id in held[name]}
            if last:
                chunks.chunks_flush(worker=name, closing=counts)
            else:
                chunks.chunks_flush(worker=name, progress=counts, holding=held[name])

    def work(i: int):
        try:
            if i < 4:
                worker_flushes(f"w{i}")
            elif i == 4:
                for _ in range(rounds):
                    dispatch.dispatch()
            elif i == 5:
                services.batch_cancel(batch_id=cancelled.id)
            else:
                services.batch_validate(batch_id=late.id)
        except BaseException as exc:
            with lock:
                errors.append(exc)
            raise

    outcomes = run_together(7, work)

    assert errors == [] and not [o for o in outcomes if isinstance(o, BaseException)], errors
    for batch in Batch.objects.filter(id__in=[b.id for b in batches]):
        chunk_rows = Chunk.objects.filter(batch=batch)
        assert batch.completed == sum(c.completed for c in chunk_rows)
        # What a batch holds is exactly what its unfinished chunks have still to run.
        assert batch.intake_reserved == sum(
            c.count - c.completed - c.failed for c in chunk_rows
            if c.status not in (ChunkStatus.DONE, ChunkStatus.SKIPPED)), batch.id
    assert Batch.objects.get(id=cancelled.id).intake_reserved == 0
    assert Batch.objects.get(id=late.id).status == BatchStatus.IN_PROGRESS
    assert intake_reserved() == Batch.objects.get(id=late.id).intake_reserved + sum(
        Batch.objects.get(id=b.id).intake_reserved for b in batches)


def test_a_dispatch_with_nothing_to_do_only_reads(running_batch):
    """The control worker's tick calls dispatch every second. With every chunk out
    or every window full it must not take the dispatch lock or open a write (on
    SQLite, the database's one write lock, which the workers' flushes need)."""
    running_batch(5, chunk_size=2)  # 3 chunks: all queued, none pending
    with CaptureQueriesContext(connection) as all_out:
        assert dispatch.dispatch(wait=False) == 0
    big = running_batch(20, chunk_size=2)  # the window of 4 is full: 9 pending
    with CaptureQueriesContext(connection) as full:
        assert dispatch.dispatch(wait=False) == 0

    for queries in (all_out, full):
        statements = [q["sql"] for q in queries.captured_queries]
        assert statements and all(sql.lstrip().upper().startswith("SELECT")
                                  for sql in statements), statements
        assert not any("controllock" in sql.lower() for sql in statements), statements

    # Room again (a worker claimed one): the same call dispatches.
    [queued] = Chunk.objects.filter(batch=big, status=ChunkStatus.QUEUED).values_list(
        "id", flat=True)[:1]
    assert chunks.chunk_claim(chunk_id=queued, worker="w1") is not None
    assert dispatch.dispatch(wait=False) == 1
