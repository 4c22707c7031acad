"""Batch services: create, validate and enqueue, transitions, cancel, finalize,
expire. Every status change goes through `batch_transition`."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from batches import intake, quotas
from batches.chunks import OPEN_CHUNKS, batches_without_open_chunks, chunks_skip_queued
from batches.dispatch import dispatch, send_refresh, send_validate, starting_pass
from batches.estimates import admission_eta, requests_estimate
from batches.locks import lock_control
from batches.models import (
    ACTIVE_STATUSES,
    ERRORS_SHOWN,
    TERMINAL_STATUSES,
    Batch,
    BatchStatus,
    Chunk,
    ControlLock,
    LineError,
)
from batches.signals import batch_finished
from batches.usage import USAGE_COLUMNS, OutputFigures, Usage, batch_usage, output_digest_and_usage
from batches.validation import ValidationReport, validate_file
from batches.windows import window_seconds
from core.errors import BatchGenError, CapacityFull, NotFound, is_storage_full
from core.ids import new_id
from core.transient import retry_transient
from files import backends, segments, storage
from files.incremental import repair_tail
from files.models import File, FilePurpose, OutputSegment
from files.selectors import file_bytes_path, output_segments
from files.services import file_lock, file_register_output
from serving.model_info import model_routes, served_models

logger = logging.getLogger("batchgen.batches")

S = BatchStatus
LEGAL_TRANSITIONS: dict[str, set[str]] = {
    S.VALIDATING: {S.IN_PROGRESS, S.FAILED, S.CANCELLING, S.CANCELLED},
    S.IN_PROGRESS: {S.FINALIZING, S.FAILED, S.CANCELLING},
    S.FINALIZING: {S.COMPLETED, S.FAILED},
    S.CANCELLING: {S.CANCELLED},
}
TIMESTAMP_FIELD = {
    S.IN_PROGRESS: "in_progress_at",
    S.FINALIZING: "finalizing_at",
    S.COMPLETED: "completed_at",
    S.FAILED: "failed_at",
    S.CANCELLING: "cancelling_at",
    S.CANCELLED: "cancelled_at",
}


class IllegalTransition(BatchGenError):
    pass


def batch_transition(*, batch_id: str, to: str, **fields: Any) -> bool:
    """Move a batch to `to` if its current status allows it, atomically across
    processes (a conditional UPDATE). Returns False when the batch was elsewhere.

    A move to a terminal status sends `batch_finished` in the same transaction, so
    what its receivers write (the webhooks outbox) exists exactly when the move does."""
    sources = [s for s, targets in LEGAL_TRANSITIONS.items() if to in targets]
    fields[TIMESTAMP_FIELD[to]] = timezone.now()
    with transaction.atomic():
        moved = Batch.objects.filter(id=batch_id, status__in=sources).update(status=to,
                                                                              **fields)
        if moved and to in TERMINAL_STATUSES:
            batch_finished.send(sender=Batch, batch_id=batch_id, status=to)
    if moved and "error" not in fields:
        batch_wait_ended(batch_id=batch_id)  # a wait's error ends with the wait
    if moved:
        logger.info("batch transition batch_id=%s status=%s%s", batch_id, to,
                    f" error={fields['error']['code']}" if fields.get("error") else "")
    return bool(moved)


def batch_get(*, batch_id: str, owner=None) -> Batch:
    """A batch by id; with an owner (an API key), only that key's batches exist.

    This is the query every poll of GET /v1/batches/{id} makes, so it is a raw()
    primary-key lookup: the ORM's query compiler costs more CPU than the query itself
    (about half of a poll; benchmarks/load.py)."""
    quote, meta = connection.ops.quote_name, Batch._meta
    sql = f"SELECT * FROM {quote(meta.db_table)} WHERE {quote(meta.pk.column)} = %s"
    params: list = [batch_id]
    if owner is not None:
        sql += f" AND {quote(meta.get_field('owner').column)} = %s"
        params.append(owner.pk)
    found = list(Batch.objects.raw(sql, params))
    if not found:
        raise NotFound(f"No such batch: {batch_id}", param="batch_id")
    return found[0]


# --- create and validate ------------------------------------------------------------


@retry_transient
def batch_create(*, input_file_id: str, endpoint: str, completion_window: str = "24h",
                 metadata: dict[str, str] | None = None, model: str,
                 max_decoding_length: int | None = None, max_context_length: int | None = None,
                 temperature: float | None = None, top_p: float | None = None,
                 top_k: int | None = None, priority: int = 1, owner=None,
                 output_expires_after_seconds: int | None = None) -> Batch:
    """Check what is cheap, record the batch as `validating` and queue its
    validation after commit. Never reads the input file here (but for its head,
    under strict admission)."""
    input_file = _batch_input_file(input_file_id=input_file_id, owner=owner)
    quotas.quota_check_create(owner=owner)
    if settings.BATCHGEN_STRICT_COMPLETION_WINDOW:
        window_feasible_check(input_file=input_file, endpoint=endpoint,
                              window=completion_window, priority=priority, owner=owner)
    if intake.intake_is_full():
        raise CapacityFull("The intake pool is full; retry later.",
                           retry_after=settings.BATCHGEN_RETRY_AFTER_SECONDS)
    with transaction.atomic():
        # The input file's row serialises concurrent creates on the same file (at
        # most one becomes active) and a delete of it (files.services.file_lock;
        # batches.locks: File, then Batch).
        if file_lock(file_id=input_file_id) is None:
            raise BatchGenError(f"No such file: {input_file_id}", param="input_file_id",
                                code="invalid_input_file")
        if Batch.objects.filter(input_file_id=input_file_id, status__in=ACTIVE_STATUSES).exists():
            raise BatchGenError(
                f"File {input_file_id} already has an active batch; wait for it to finish "
                "or cancel it.", param="input_file_id", code="duplicate_batch")
        now = timezone.now()
        batch = Batch.objects.create(
            id=new_id("batch_"),
            created_at=now,
            endpoint=endpoint,
            model=model,
            input_file=input_file,
            completion_window=completion_window,
            # Each batch's own window (checked by the serializer against the bounds).
            expires_at=now + timedelta(seconds=window_seconds(completion_window)),
            metadata=metadata,
            max_decoding_length=max_decoding_length,
            max_context_length=max_context_length,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            priority=priority,
            owner=owner,
            output_expires_after_seconds=output_expires_after_seconds,
        )
        # A broker that is down must not turn a committed batch into a 500: the
        # validation is published as soon as it answers (core.publishing).
        transaction.on_commit(lambda: send_validate(batch.id), robust=True)
    logger.info("batch created batch_id=%s input_file_id=%s endpoint=%s", batch.id,
                input_file_id, endpoint)
    return batch


def _batch_input_file(*, input_file_id: str, owner) -> File:
    """The input file a batch may be created on: the owner's, of purpose batch."""
    files = File.objects.filter(owner=owner) if owner is not None else File.objects
    try:
        input_file = files.get(id=input_file_id)
    except File.DoesNotExist:
        raise BatchGenError(f"No such file: {input_file_id}", param="input_file_id",
                            code="invalid_input_file") from None
    if input_file.purpose != FilePurpose.BATCH:
        raise BatchGenError(
            f"File {input_file_id} has purpose {input_file.purpose!r}; a batch needs an "
            "input file uploaded with purpose 'batch'.", param="input_file_id",
            code="invalid_input_file")
    return input_file


def window_feasible_check(*, input_file: File, endpoint: str, window: str, priority: int,
                          owner) -> None:
    """Strict admission (BATCHGEN_STRICT_COMPLETION_WINDOW): refuse a batch whose ETA,
    played among the running batches (batches/estimates.py), lies past its window.
    Its requests are estimated from the head of its input file; a model with no
    measured rate yet lets every batch in."""
    served = [model.id for model in served_models() if endpoint in model.endpoints]
    path = file_bytes_path(file_id=input_file.id)
    if not served or path is None:
        return
    seconds = window_seconds(window)
    estimate = admission_eta(
        model=served[0], requests=requests_estimate(path=path, size=input_file.bytes),
        window_seconds=seconds, priority=priority, owner_id=getattr(owner, "pk", None),
        weight=getattr(owner, "weight", None))
    if estimate is not None and estimate > seconds:
        when = timezone.now() + timedelta(seconds=estimate)
        raise BatchGenError(
            f"This batch cannot finish within its {window} completion window: its "
            f"estimated completion is {when.isoformat(timespec='seconds')} (Unix "
            f"{int(when.timestamp())}, in {int(estimate)} seconds) behind the work already "
            "running. Ask for a longer window or retry later.",
            param="completion_window", code="completion_window_infeasible")


@retry_transient
def batch_validate(*, batch_id: str) -> Batch:
    """Validate the input in one streaming pass, then enqueue the whole batch or fail
    it. Nothing is queued unless every line is valid and all of it fits."""
    # Not select_related: a join finds no batch when its input file is gone.
    batch = Batch.objects.get(id=batch_id)
    if batch.status != S.VALIDATING:
        return batch
    Batch.objects.filter(id=batch_id).update(validation_started_at=timezone.now())
    input_path = file_bytes_path(file_id=batch.input_file_id)
    if input_path is None:
        batch_transition(batch_id=batch_id, to=S.FAILED, error={
            "code": "input_file_missing",
            "message": f"The input file {batch.input_file_id} is gone (deleted, or its bytes "
                       "removed from storage), so the batch cannot be validated; nothing was "
                       "queued. Upload the file again and create a new batch."})
        return batch_get(batch_id=batch_id)
    order_path = (storage.absolute(storage.order_name(batch_id))
                  if settings.BATCHGEN_PREFIX_GROUPING else None)
    try:
        report = validate_file(
            input_path,
            endpoint=batch.endpoint,
            chunk_size=settings.BATCHGEN_CHUNK_SIZE,
            max_line_bytes=settings.BATCHGEN_MAX_LINE_BYTES,
            max_requests=settings.BATCHGEN_MAX_REQUESTS_PER_BATCH,
            order_path=order_path,
            models=model_routes(batch.endpoint),
        )
    except OSError as exc:
        if not is_storage_full(exc):
            raise
        # Only a prefix-grouped batch writes here (its order file); nothing is queued.
        logger.error("storage full while validating batch %s: %s", batch_id, exc)
        if order_path is not None:
            order_path.unlink(missing_ok=True)
        batch_transition(batch_id=batch_id, to=S.FAILED, error={
            "code": STORAGE_FULL,
            "message": "The server's storage volume is full, so the batch could not be "
                       "prepared; nothing was queued. Create it again once space is freed."})
        return batch_get(batch_id=batch_id)
    if report.invalid:
        batch_fail_invalid_input(batch_id=batch_id, report=report)
        return batch_get(batch_id=batch_id)
    if report.total == 0:
        batch_transition(batch_id=batch_id, to=S.FAILED,
                         error={"code": "empty_batch",
                                "message": "The input file holds no requests."})
        return batch_get(batch_id=batch_id)

    if order_path is not None and order_path.exists():
        _share_order_file(batch_id, order_path)
    _admit(batch_id=batch_id, report=report)
    return batch_get(batch_id=batch_id)


def _share_order_file(batch_id: str, order_path) -> None:
    """On an object store the workers have no path in common with this process: the
    order file of a grouped batch goes to the bucket, where each worker fetches it
    (files.storage.input_path)."""
    store = backends.current()
    if not isinstance(store, backends.PathStorage):
        store.put_file(storage.order_name(batch_id), order_path)


@retry_transient
def _admit(*, batch_id: str, report: ValidationReport) -> None:
    """The whole batch enters the IntakePool at once, as pending chunks, or fails
    with capacity_exceeded; the dispatcher then feeds its chunks to the inference
    queue fairly (batches.dispatch). Locks: admission, then the batch row, so a
    cancel meanwhile either comes first (nothing is admitted) or sees in_progress."""
    with transaction.atomic():
        lock_control(ControlLock.ADMISSION)
        batch = Batch.objects.select_for_update().get(id=batch_id)
        if batch.status != S.VALIDATING:  # cancelled while we read the file
            return
        # The key's quota first (under the same lock, so two admissions of one key
        # see each other's reservations); refused, the batch fails whole.
        refusal = quotas.quota_check_admission(owner_id=batch.owner_id, requests=report.total)
        if refusal is not None:
            batch_transition(batch_id=batch_id, to=S.FAILED, total=report.total,
                             error=refusal.batch_error())
            return
        if not intake.intake_reserve(batch_id=batch_id, requests=report.total):
            batch_transition(
                batch_id=batch_id, to=S.FAILED, total=report.total,
                error={"code": "capacity_exceeded",
                       "message": f"The batch's {report.total} requests do not fit in the "
                                  "intake pool now; retry later."})
            return
        Chunk.objects.bulk_create(
            [Chunk(batch_id=batch_id, index=i, start_offset=span.start_offset,
                   end_offset=span.end_offset, first_line=span.first_line, count=span.count,
                   model=span.model)
             for i, span in enumerate(report.chunks)],
            batch_size=1000,
        )
        batch_transition(batch_id=batch_id, to=S.IN_PROGRESS, total=report.total,
                         dispatch_pass=starting_pass(), grouped=report.grouped,
                         output_limit_mean=report.output_limit_mean(batch.max_decoding_length))
        # robust: the admission is committed; a dispatch that fails now is covered by
        # the control worker's tick, and must not fail (and retry) the validation.
        transaction.on_commit(dispatch, robust=True)
        # Every batch of its model shares the model with it from now: their ETAs and
        # its own, now rather than at the next tick.
        transaction.on_commit(send_refresh, robust=True)
    return batch_get(batch_id=batch_id)


@retry_transient
def batch_fail_invalid_input(*, batch_id: str, report: ValidationReport) -> None:
    """Fail a batch whose input has bad lines. The batch object carries the first
    ERRORS_SHOWN (polls stay small); every error kept is a LineError row, paged by
    GET /v1/batches/{id}/errors."""
    shown, kept = report.errors[:ERRORS_SHOWN], len(report.errors)
    where = "" if kept == len(shown) else (
        f"; errors.data shows the first {len(shown)}, GET /v1/batches/{batch_id}/errors "
        f"lists {'all' if kept == report.invalid else f'the first {kept}'}")
    with transaction.atomic():
        failed = batch_transition(
            batch_id=batch_id, to=S.FAILED, errors=shown, line_errors_total=report.invalid,
            error={"code": "invalid_input",
                   "message": f"{report.invalid} input line(s) failed validation{where}."})
        if failed:
            LineError.objects.bulk_create(
                [LineError(batch_id=batch_id, **error) for error in report.errors],
                batch_size=1000)



# --- cancel, settle, finalize, expire -------------------------------------------------


@retry_transient
def batch_cancel(*, batch_id: str) -> Batch:
    """Cancel a validating or in-progress batch. Queued chunks are skipped and their
    capacity returned at once; running ones are aborted by their workers, after which
    the batch becomes `cancelled` with its partial output."""
    batch = batch_get(batch_id=batch_id)
    if batch.status == S.CANCELLING:
        return batch  # a repeated request while the running chunks stop
    if batch.status == S.VALIDATING:
        # Nothing is queued yet: the validator sees the status and stops.
        if batch_transition(batch_id=batch_id, to=S.CANCELLED):
            return batch_get(batch_id=batch_id)
        batch.refresh_from_db()
    if batch.status != S.IN_PROGRESS:
        raise IllegalTransition(
            f"Batch {batch_id} is {batch.status} and can no longer be cancelled.",
            param="batch_id", code="batch_not_cancellable")
    if not batch_transition(batch_id=batch_id, to=S.CANCELLING):
        return batch_cancel(batch_id=batch_id)  # it moved meanwhile: decide again
    chunks_skip_queued(batch_id=batch_id)
    batch_settle(batch_id=batch_id)
    transaction.on_commit(send_refresh, robust=True)  # its share goes to the others
    return batch_get(batch_id=batch_id)


def batch_has_open_chunks(*, batch_id: str) -> bool:
    return Chunk.objects.filter(batch_id=batch_id, status__in=OPEN_CHUNKS).exists()


def batch_settle(*, batch_id: str) -> None:
    """Once none of its chunks is open, finalize the batch (completed, cancelled, or
    failed with its partial output). Workers' flushes do this for the chunks they
    close (batches.chunks); cancel and fail do it here."""
    if batches_without_open_chunks([batch_id]):
        batch_finalize(batch_id=batch_id)


class _StoredOutput:
    """An output object opened as output_digest_and_usage opens a path."""

    def __init__(self, store, name: str) -> None:
        self.store, self.name = store, name

    def open(self, mode: str = "rb"):
        return self.store.open(self.name)


def _compose_segments(store, batch_id: str) -> tuple[int, str, Usage]:
    """On an object store: the counted segments composed into the output object, then
    their rows dropped and, once committed, the segment objects (orphans a dead
    attempt left included) deleted (files.segments). Returns the output's size,
    checksum and usage, taken as it was composed, or read back when the store copied
    some of it."""
    name = storage.incremental_name(batch_id)
    counted = output_segments(batch_id=batch_id)
    figures = OutputFigures()
    composed = segments.compose(store, counted, name, observe=figures.update)
    OutputSegment.objects.filter(batch_id=batch_id).delete()
    logger.info("output composed batch_id=%s segments=%s bytes=%s copied_parts=%s",
                batch_id, len(counted), composed.size, composed.copied_parts)

    def delete_segments() -> None:
        store.delete_many(list(store.names(f"incremental/{batch_id}/")))

    transaction.on_commit(delete_segments, robust=True)
    if composed.copied_parts:
        return output_digest_and_usage(_StoredOutput(store, name))
    return figures.result()


@retry_transient
def batch_finalize(*, batch_id: str) -> Batch:
    """Register the incremental file as the output and close the batch, exactly once
    however many callers race here: the status moves by conditional updates and the
    output file is created under the batch's row lock only if it is still missing."""
    batch = batch_get(batch_id=batch_id)
    if batch_has_open_chunks(batch_id=batch_id):
        return batch
    if batch.status == S.IN_PROGRESS:
        batch_transition(batch_id=batch_id, to=S.FINALIZING)
        batch.refresh_from_db()
    if batch.status not in (S.FINALIZING, S.CANCELLING, S.FAILED):
        return batch
    with transaction.atomic():
        batch = Batch.objects.select_for_update().get(id=batch_id)
        if batch.output_file_id is None and batch.in_progress_at is not None:
            store = backends.current()
            if isinstance(store, backends.PathStorage):
                # No chunk is open, so a torn last line is a dead writer's, never a result.
                output = storage.absolute(storage.incremental_name(batch_id))
                repair_tail(output)
                output.parent.mkdir(parents=True, exist_ok=True)
                output.touch(exist_ok=True)
                # One read for the checksum and the exact usage (the running figures
                # may miss results a dead worker wrote but never flushed).
                size, digest, usage = output_digest_and_usage(output)
            else:
                size, digest, usage = _compose_segments(store, batch_id)
            batch.output_file = file_register_output(
                batch_id=batch_id, owner=batch.owner, size=size, digest=digest,
                expires_after_seconds=batch.output_expires_after_seconds)
            quotas.key_usage_correct(owner_id=batch.owner_id, running=batch_usage(batch),
                                     final=usage)
            for name, column in USAGE_COLUMNS.items():
                setattr(batch, column, getattr(usage, name))
            batch.save(update_fields=["output_file", *USAGE_COLUMNS.values()])
    if batch.status == S.FINALIZING:
        batch_transition(batch_id=batch_id, to=S.COMPLETED)
    elif batch.status == S.CANCELLING:
        batch_transition(batch_id=batch_id, to=S.CANCELLED)
    intake.intake_release(batch_id=batch_id)
    # No chunk will be read again: the order file of a grouped batch can go.
    storage.absolute(storage.order_name(batch_id)).unlink(missing_ok=True)
    if not isinstance(backends.current(), backends.PathStorage):
        backends.current().delete(storage.order_name(batch_id))
    return batch_get(batch_id=batch_id)


@retry_transient
def batch_fail(*, batch_id: str, code: str, message: str) -> bool:
    """Fail a validating or running batch (worker error, window passed); queued
    chunks are skipped, running ones stop, and what was written stays as output."""
    if not batch_transition(batch_id=batch_id, to=S.FAILED,
                            error={"code": code, "message": message}):
        return False
    chunks_skip_queued(batch_id=batch_id)
    batch_settle(batch_id=batch_id)
    return True


@retry_transient
def batches_expire() -> int:
    """Fail every active batch whose completion window has passed."""
    expired = 0
    overdue = Batch.objects.filter(
        status__in=[S.VALIDATING, S.IN_PROGRESS], expires_at__lt=timezone.now()
    ).values_list("id", "completion_window")
    for batch_id, window in overdue:
        if batch_fail(batch_id=batch_id, code="batch_failed",
                      message=f"The batch did not finish within its {window} completion "
                              "window; the results written so far are kept."):
            expired += 1
    if expired:
        transaction.on_commit(send_refresh, robust=True)  # their shares go to the others
    return expired


# --- a full storage volume ---------------------------------------------------------------

STORAGE_FULL = "storage_full"
STORAGE_FULL_MESSAGE = (
    "The server's storage volume is full, so finished results cannot be written. "
    "The batch waits and resumes by itself once space is freed; nothing written so "
    "far is lost.")


def batch_storage_full(*, batch_id: str) -> None:
    """Show on a running batch why it makes no progress (its `error`, until it resumes)."""
    Batch.objects.filter(id=batch_id, status=S.IN_PROGRESS,
                         error__isnull=True).update(
        error={"code": STORAGE_FULL, "message": STORAGE_FULL_MESSAGE})


def batch_storage_resumed(*, batch_id: str) -> None:
    Batch.objects.filter(id=batch_id, error__code=STORAGE_FULL).update(error=None)


# The errors a running batch shows while it waits, which end with the wait: the
# storage volume full, its model with no ready worker (batches/availability.py).
WAIT_CODES = (STORAGE_FULL, "model_unavailable", "model_not_resident")


def batch_wait_ended(*, batch_id: str) -> None:
    Batch.objects.filter(id=batch_id, error__code__in=WAIT_CODES).update(error=None)
