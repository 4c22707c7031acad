"""Recovery: everything a crash can leave half-way, put right. Idempotent; run
periodically by the control worker and by `manage.py recover`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from batches.chunks import OPEN_CHUNKS, chunks_requeue_expired
from batches.dispatch import chunk_model, publish_chunks, send_validate
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from batches.services import batch_fail, batch_finalize
from core.outage import BROKER, dependency_down, outage_began, outage_ended
from core.transient import retry_transient
from files import storage
from files.incremental import repair_tail
from fleet import selectors as fleet_selectors

logger = logging.getLogger("batchgen.batches")


def validation_timeout() -> timedelta:
    """A validation that has not finished after this long is assumed lost with its
    worker and is run again (validation is idempotent: only one run can enqueue)."""
    return timedelta(seconds=settings.BATCHGEN_VALIDATION_TIMEOUT_SECONDS)


@dataclass
class RecoveryReport:
    chunks_requeued: int = 0
    validations_restarted: int = 0
    validations_failed: int = 0  # lost once too often: failed, not run again
    batches_finalized: int = 0
    torn_lines_repaired: int = 0

    def __str__(self) -> str:
        return (f"{self.chunks_requeued} chunk(s) requeued, {self.validations_restarted} "
                f"validation(s) restarted, {self.validations_failed} failed for good, "
                f"{self.batches_finalized} batch(es) finalized, "
                f"{self.torn_lines_repaired} torn line(s) repaired")


@retry_transient
def recover() -> RecoveryReport:
    report = RecoveryReport()
    refs = chunks_requeue_expired()
    refs += chunks_lost_by_broker(refs)
    if refs:
        publish_chunks(refs)
    report.chunks_requeued = len(refs)

    overdue = timezone.now() - validation_timeout()
    stuck = (
        Batch.objects.filter(status=BatchStatus.VALIDATING, validation_started_at__lt=overdue)
        # Never started: its task was lost before a worker took it (broker down).
        | Batch.objects.filter(status=BatchStatus.VALIDATING,
                               validation_started_at__isnull=True, created_at__lt=overdue)
    ).values_list("id", flat=True)
    for batch_id in stuck:
        if validation_restart(batch_id=batch_id):
            report.validations_restarted += 1
        else:
            report.validations_failed += 1

    open_chunks = Chunk.objects.filter(batch=OuterRef("pk"), status__in=OPEN_CHUNKS)
    unsettled = (
        Batch.objects.filter(status__in=[BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING,
                                         BatchStatus.CANCELLING])
        | Batch.objects.filter(status=BatchStatus.FAILED, in_progress_at__isnull=False,
                               output_file__isnull=True)
    ).exclude(Exists(open_chunks)).values_list("id", flat=True)
    for batch_id in unsettled:
        batch_finalize(batch_id=batch_id)
        report.batches_finalized += 1

    active = Batch.objects.filter(status__in=[BatchStatus.IN_PROGRESS,
                                              BatchStatus.CANCELLING]).values_list("id", flat=True)
    for batch_id in active:
        if not Chunk.objects.filter(batch_id=batch_id, status=ChunkStatus.RUNNING).exists():
            if repair_tail(storage.absolute(storage.incremental_name(batch_id))):
                report.torn_lines_repaired += 1
    if (report.chunks_requeued or report.validations_restarted or report.validations_failed
            or report.batches_finalized):
        logger.info("recovery: %s", report)
    return report


def validation_restart(*, batch_id: str) -> bool:
    """Run a lost validation again, or, once it was restarted
    BATCHGEN_VALIDATION_MAX_RESTARTS times, fail the batch: a validation that can never
    finish (a bug, an input the validator chokes on) must not be retried for good
    while the batch shows `validating` and counts as active. Returns whether it was
    restarted."""
    limit = settings.BATCHGEN_VALIDATION_MAX_RESTARTS
    restarted = Batch.objects.filter(
        id=batch_id, status=BatchStatus.VALIDATING, validation_restarts__lt=limit,
    ).update(validation_started_at=None, validation_restarts=F("validation_restarts") + 1)
    if restarted:
        send_validate(batch_id)
        return True
    batch_fail(batch_id=batch_id, code="validation_failed",
               message=f"Validation did not finish, though it was run {limit + 1} times "
                       "(BATCHGEN_VALIDATION_MAX_RESTARTS); nothing was queued. The server "
                       "log says why; create the batch again.")
    return False


# A dispatched chunk still unclaimed this long after its publish may have been lost.
LOST_AFTER = timedelta(seconds=30)


def inference_queue_length(model: str) -> int | None:
    """Messages waiting in the broker's queue of `model` (None if it cannot tell)."""
    from amqp.exceptions import ChannelError

    from core.celery import app, inference_queue

    try:
        with app.connection_for_write() as connection:
            length = connection.default_channel.queue_declare(
                queue=inference_queue(model), passive=True).message_count
    except ChannelError:
        return 0  # the queue itself is gone: a broker that came back empty
    except Exception as exc:
        if isinstance(exc, OSError) or dependency_down(exc) == BROKER:
            outage_began(BROKER, exc)  # said once; recovery's next run asks again
        else:
            logger.exception("cannot read the inference queue's length")
        return None
    outage_ended(BROKER)
    return length


def chunks_lost_by_broker(already: list) -> list:
    """Queued chunks published a while ago that the broker no longer holds (it lost
    them in a restart without persistence). Published again; a duplicate message is
    harmless because a claim is a conditional update.

    A chunk a busy worker has prefetched (taken from the broker, not yet started) is
    not in the broker's queue either, but it is not lost: the worker's heartbeat
    names it (Worker.held_chunks), so it is counted as present and not published
    again."""
    ids = {ref[1] for ref in already}
    held = None
    by_model: dict[str, list] = {}
    for batch_id, chunk_id, index, model in Chunk.objects.filter(
            status=ChunkStatus.QUEUED, published_at__lt=timezone.now() - LOST_AFTER,
    ).exclude(id__in=ids).values_list("batch_id", "id", "index", "model"):
        if held is None:  # read only when some chunk waits long enough to ask
            held = fleet_selectors.chunks_held_by_live_workers()
        if chunk_id not in held:
            by_model.setdefault(chunk_model(model), []).append((batch_id, chunk_id, index))
    lost = []
    for model, stale in by_model.items():  # each model's queue holds its own chunks
        length = inference_queue_length(model)
        if length is None or length >= len(stale):
            continue
        logger.warning("the broker holds %s message(s) for %s queued chunk(s) of %s; "
                       "publishing them again", length, len(stale), model)
        lost += stale
    return lost
