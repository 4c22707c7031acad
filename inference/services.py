"""Chunk claims, progress and completion, and worker heartbeats: the database side
of the SchedulingPool. The worker runtime calls these on its small DB executor.

Exactly-once accounting: a chunk's `completed`/`failed` count the lines of it that
are in the incremental file *and* were accounted. Progress is flushed after the
lines are written, so after a crash the file may hold more than was accounted,
never less; a redelivered chunk reconciles the difference (see `chunk_reconcile`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from batches import intake
from batches.dispatch import dispatch
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from batches.params import BatchParams
from batches.services import STORAGE_FULL, batch_settle, batch_storage_resumed
from files import storage
from inference.models import Worker

logger = logging.getLogger("batchgen.inference")


@dataclass(frozen=True, slots=True)
class ChunkWork:
    chunk_id: int
    batch_id: str
    index: int
    endpoint: str
    input_path: str
    output_path: str
    order_path: str | None  # prefix-grouped chunks: a range of this file
    start_offset: int
    end_offset: int
    count: int
    attempts: int
    completed: int
    failed: int
    params: BatchParams


def _lease() -> timezone.datetime:
    return timezone.now() + timedelta(seconds=settings.BATCHGEN_CHUNK_LEASE_SECONDS)


def chunk_claim(*, chunk_id: int, worker: str) -> ChunkWork | None:
    """Take a chunk for this worker if it is queued, or running under a lease that
    expired (its worker died). None when someone else holds it, it is finished, or
    its batch no longer runs (then the chunk is skipped and its capacity returned)."""
    now = timezone.now()
    claimable = Q(status=ChunkStatus.QUEUED) | Q(status=ChunkStatus.RUNNING,
                                                 lease_expires_at__lt=now)
    claimed = Chunk.objects.filter(Q(id=chunk_id) & claimable).update(
        status=ChunkStatus.RUNNING, worker=worker, lease_expires_at=_lease(),
        attempts=F("attempts") + 1,
    )
    if not claimed:
        return None
    chunk = Chunk.objects.select_related("batch", "batch__input_file").get(id=chunk_id)
    batch = chunk.batch
    if batch.status != BatchStatus.IN_PROGRESS:
        chunk_close(chunk_id=chunk_id, worker=worker, completed=0, failed=0)
        return None
    logger.info("chunk claimed batch_id=%s chunk=%s attempt=%s worker=%s", batch.id,
                chunk.index, chunk.attempts, worker)
    return ChunkWork(
        chunk_id=chunk.id, batch_id=batch.id, index=chunk.index, endpoint=batch.endpoint,
        input_path=str(storage.absolute(batch.input_file.storage_name)),
        output_path=str(storage.absolute(storage.incremental_name(batch.id))),
        order_path=(str(storage.absolute(storage.order_name(batch.id))) if batch.grouped
                    else None),
        start_offset=chunk.start_offset, end_offset=chunk.end_offset, count=chunk.count,
        attempts=chunk.attempts, completed=chunk.completed, failed=chunk.failed,
        params=BatchParams(
            max_decoding_length=batch.max_decoding_length,
            max_context_length=batch.max_context_length,
            temperature=batch.temperature, top_p=batch.top_p, top_k=batch.top_k,
        ),
    )


def chunk_progress(*, chunk_id: int, worker: str, completed: int, failed: int) -> bool:
    """Account `completed`/`failed` more written results of a chunk this worker holds,
    renew its lease and return their intake capacity. False if the lease was lost."""
    with transaction.atomic():
        owned = Chunk.objects.filter(id=chunk_id, worker=worker, status=ChunkStatus.RUNNING)
        if not owned.update(completed=F("completed") + completed, failed=F("failed") + failed,
                            lease_expires_at=_lease()):
            return False
        if completed or failed:
            batch_id = Chunk.objects.filter(id=chunk_id).values_list("batch_id", flat=True)[0]
            Batch.objects.filter(id=batch_id).update(completed=F("completed") + completed,
                                                     failed=F("failed") + failed)
            intake.intake_release(batch_id=batch_id, requests=completed + failed)
    return True


def chunk_close(*, chunk_id: int, worker: str, completed: int, failed: int) -> bool:
    """Account the last results and close the chunk: done if its batch still runs,
    skipped otherwise. Requests never run (batch cancelled or failed) give their
    capacity back. Settles the batch once its last chunk closes."""
    with transaction.atomic():
        if not chunk_progress(chunk_id=chunk_id, worker=worker, completed=completed,
                              failed=failed):
            return False
        chunk = Chunk.objects.select_related("batch").get(id=chunk_id)
        finished_all = chunk.completed + chunk.failed >= chunk.count
        status = ChunkStatus.DONE if finished_all else ChunkStatus.SKIPPED
        Chunk.objects.filter(id=chunk_id).update(status=status, finished_at=timezone.now(),
                                                 lease_expires_at=None)
        intake.intake_release(batch_id=chunk.batch_id,
                              requests=chunk.count - chunk.completed - chunk.failed)
        if (chunk.batch.error or {}).get("code") == STORAGE_FULL:
            batch_storage_resumed(batch_id=chunk.batch_id)  # its results were written
        batch_settle(batch_id=chunk.batch_id)
        transaction.on_commit(dispatch)  # a worker thread is free: feed the next chunk
    logger.info("chunk closed batch_id=%s chunk=%s status=%s completed=%s failed=%s",
                chunk.batch_id, chunk.index, status, chunk.completed, chunk.failed)
    return True


def chunk_release(*, chunk_id: int, worker: str, completed: int, failed: int) -> bool:
    """Account what was written and put the rest of the chunk back in the queue
    (its worker is shutting down). A redelivery skips the lines already written."""
    from batches.services import publish_chunks

    with transaction.atomic():
        if not chunk_progress(chunk_id=chunk_id, worker=worker, completed=completed,
                              failed=failed):
            return False
        Chunk.objects.filter(id=chunk_id).update(status=ChunkStatus.QUEUED, worker="",
                                                 lease_expires_at=None, published_at=None)
        ref = Chunk.objects.filter(id=chunk_id).values_list("batch_id", "id", "index")[0]
        transaction.on_commit(lambda: publish_chunks([ref]))
    logger.info("chunk released batch_id=%s chunk=%s worker=%s", ref[0], ref[2], worker)
    return True


def chunk_reconcile(*, work: ChunkWork, worker: str, written: dict[str, bool]) -> None:
    """After a redelivery: account results a previous attempt wrote but did not get
    to account before it died."""
    successes = sum(written.values())
    errors = len(written) - successes
    chunk_progress(chunk_id=work.chunk_id, worker=worker,
                   completed=max(0, successes - work.completed),
                   failed=max(0, errors - work.failed))


# --- recovery -------------------------------------------------------------------------


def chunks_requeue_expired() -> list[tuple[str, int, int]]:
    """Chunks whose worker stopped renewing the lease, and queued chunks whose
    message was never published (or was lost with a broker), go back to the queue.
    Returns what must be published again."""
    now = timezone.now()
    stale = timezone.now() - timedelta(seconds=settings.BATCHGEN_CHUNK_LEASE_SECONDS)
    expired = Chunk.objects.filter(status=ChunkStatus.RUNNING, lease_expires_at__lt=now)
    refs = list(expired.values_list("batch_id", "id", "index"))
    if refs:
        Chunk.objects.filter(id__in=[r[1] for r in refs], status=ChunkStatus.RUNNING,
                             lease_expires_at__lt=now).update(
            status=ChunkStatus.QUEUED, worker="", lease_expires_at=None, published_at=None)
        logger.warning("requeued %s chunk(s) whose worker stopped renewing its lease",
                       len(refs))
    unpublished = Chunk.objects.filter(status=ChunkStatus.QUEUED).filter(
        Q(published_at__isnull=True) | Q(published_at__lt=stale - timedelta(hours=6)))
    refs = list(unpublished.values_list("batch_id", "id", "index"))
    return refs


# --- workers ----------------------------------------------------------------------------


def worker_heartbeat(*, name: str, hostname: str, engine: str, model: str, capacity: int,
                     active: int, tokens_active: int, token_budget: int | None, ready: bool,
                     completed: int, failed: int, tokens: int,
                     chunk_ids: list[int], storage_error: str = "") -> set[str]:
    """Record a worker's liveness and slots, renew the leases of the chunks it runs,
    and return the ids of their batches that must stop (no longer in progress)."""
    now = timezone.now()
    Worker.objects.update_or_create(
        name=name,
        defaults={"hostname": hostname, "pid": os.getpid(), "engine": engine, "model": model,
                  "slots_capacity": capacity, "slots_active": active, "ready": ready,
                  "tokens_active": tokens_active, "token_budget": token_budget,
                  "requests_completed": completed, "requests_failed": failed,
                  "tokens_generated": tokens, "storage_error": storage_error,
                  "heartbeat_at": now, "stopped_at": None},
    )
    if not chunk_ids:
        return set()
    Chunk.objects.filter(id__in=chunk_ids, worker=name, status=ChunkStatus.RUNNING).update(
        lease_expires_at=_lease())
    return set(
        Batch.objects.filter(chunks__id__in=chunk_ids)
        .exclude(status=BatchStatus.IN_PROGRESS).values_list("id", flat=True).distinct()
    )


def worker_stopped(*, name: str) -> None:
    Worker.objects.filter(name=name).update(stopped_at=timezone.now(), slots_active=0,
                                            ready=False, storage_error="")


def worker_reap_host(*, hostname: str, current: str, pid_alive) -> int:
    """At start-up: earlier workers of this host whose process is gone (a crash, a
    SIGKILL) are marked stopped and their chunks' leases expire now, so recovery
    requeues them at once instead of waiting out the lease."""
    dead = [
        w.name for w in Worker.objects.filter(hostname=hostname, stopped_at__isnull=True)
        .exclude(name=current)
        if w.pid == os.getpid() or not pid_alive(w.pid)
    ]
    if not dead:
        return 0
    Worker.objects.filter(name__in=dead).update(stopped_at=timezone.now(), slots_active=0,
                                                ready=False)
    Chunk.objects.filter(worker__in=dead, status=ChunkStatus.RUNNING).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    logger.warning("reaped %s dead worker(s) on %s: %s", len(dead), hostname, dead)
    return len(dead)
