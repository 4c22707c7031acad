"""Chunk accounting, next to the Chunk model: claims, progress, close, release,
reconcile and requeue. Inference workers call these; nothing here knows about
engines.

Exactly-once accounting: a chunk's `completed`/`failed` count the lines of it that
are in the incremental file *and* were accounted. A worker accounts results after
it has written them, so after a crash the file may hold more than was accounted,
never less; a redelivered chunk reconciles the difference (`reconcile_counts`).

Bounded traffic: a worker does not write per request or per chunk. It gathers what
all of its chunks did and says it in one `chunks_flush` per interval: a fixed
handful of statements whether it holds one chunk or fifty.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import (
    BigIntegerField,
    Case,
    CharField,
    Exists,
    F,
    IntegerField,
    OuterRef,
    Q,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Greatest
from django.utils import timezone

from batches import intake, quotas
from batches.dispatch import dispatch, publish_chunks, send_finalize
from batches.locks import lock_ids
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from batches.usage import USAGE_COLUMNS, USAGE_FIELDS, Usage
from core.errors import StorageFull
from core.transient import retry_transient
from files import storage
from files.models import OutputSegment
from serving.params import BatchParams

logger = logging.getLogger("batchgen.batches")

OPEN_CHUNKS = (ChunkStatus.PENDING, ChunkStatus.QUEUED, ChunkStatus.RUNNING)


@dataclass(frozen=True, slots=True)
class ChunkWork:
    """What a worker needs to run a chunk it claimed."""

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


def lease_deadline() -> timezone.datetime:
    return timezone.now() + timedelta(seconds=settings.BATCHGEN_CHUNK_LEASE_SECONDS)


@retry_transient
def chunk_claim(*, chunk_id: int, worker: str) -> ChunkWork | None:
    """Take a chunk for this worker if it is queued, or running under a lease that
    expired (its worker died). None when someone else holds it, it is finished, or
    its batch no longer runs (then the chunk is skipped and its capacity returned)."""
    now = timezone.now()
    claimable = Q(status=ChunkStatus.QUEUED) | Q(status=ChunkStatus.RUNNING,
                                                 lease_expires_at__lt=now)
    claimed = Chunk.objects.filter(Q(id=chunk_id) & claimable).update(
        status=ChunkStatus.RUNNING, worker=worker, lease_expires_at=lease_deadline(),
        attempts=F("attempts") + 1, claimed_at=now,
    )
    if not claimed:
        return None
    chunk = Chunk.objects.select_related("batch", "batch__input_file").get(id=chunk_id)
    batch = chunk.batch
    if batch.status != BatchStatus.IN_PROGRESS:
        chunks_flush(worker=worker, closing={chunk_id: (0, 0)})
        return None
    logger.info("chunk claimed batch_id=%s chunk=%s attempt=%s worker=%s", batch.id,
                chunk.index, chunk.attempts, worker)
    return ChunkWork(
        chunk_id=chunk.id, batch_id=batch.id, index=chunk.index, endpoint=batch.endpoint,
        input_path=str(storage.input_path(batch.input_file.storage_name)),
        output_path=str(storage.absolute(storage.incremental_name(batch.id))),
        order_path=(str(storage.input_path(storage.order_name(batch.id))) if batch.grouped
                    else None),
        start_offset=chunk.start_offset, end_offset=chunk.end_offset, count=chunk.count,
        attempts=chunk.attempts, completed=chunk.completed, failed=chunk.failed,
        params=BatchParams(
            max_decoding_length=batch.max_decoding_length,
            max_context_length=batch.max_context_length,
            temperature=batch.temperature, top_p=batch.top_p, top_k=batch.top_k,
        ),
    )


def reconcile_counts(work: ChunkWork, written: dict[str, bool]) -> tuple[int, int]:
    """After a redelivery: the results an earlier attempt wrote but did not get to
    account before it died, as (completed, failed) still to account."""
    successes = sum(written.values())
    errors = len(written) - successes
    return max(0, successes - work.completed), max(0, errors - work.failed)


@dataclass
class FlushResult:
    lost: set[int] = field(default_factory=set)  # chunks this worker no longer holds
    stop_batches: set[str] = field(default_factory=set)  # held chunks' batches not running
    closed: dict[int, str] = field(default_factory=dict)  # chunk id -> done or skipped


Counts = tuple[int, int]  # (completed, failed) results written since the last flush


def _by_id(values: dict, default=0, field_type=IntegerField):
    """A CASE over primary keys, for one UPDATE that sets a different value per row."""
    return Case(*[When(pk=pk, then=Value(value)) for pk, value in values.items()],
                default=Value(default), output_field=field_type())


@retry_transient
def chunks_flush(*, worker: str, progress: dict[int, Counts] | None = None,
                 closing: dict[int, Counts] | None = None,
                 releasing: dict[int, Counts] | None = None,
                 holding: Iterable[int] = (),
                 usage: dict[int, Usage] | None = None,
                 segments: dict[int, list[tuple[str, int]]] | None = None) -> FlushResult:
    """Everything a worker has to say about its chunks since the last flush, in one
    transaction: results written (`progress`), chunks finished (`closing`: done, or
    skipped when their batch stopped) and chunks handed back (`releasing`: the worker
    is stopping), with the lease of every chunk it holds renewed, and the token
    `usage` of the results written added to their batches. Capacity of the
    results and of requests never to run goes back to the batch rows; a batch whose
    last chunk closed is finalized; released chunks are published again.

    Locks: the chunk rows, then the batch rows, each in ascending id (batches.locks).
    A chunk the worker no longer holds (its lease expired and recovery requeued it)
    is reported in `lost` and none of its counts are kept: the next attempt finds
    the written lines and accounts them itself (its usage is counted at finalization,
    which recomputes it from the output file). On an object store the chunk's
    `segments` (name, size) written since the last flush are recorded with its
    counts, and like them only while the worker holds the chunk (files.segments)."""
    progress, closing, releasing = progress or {}, closing or {}, releasing or {}
    usage = usage or {}
    result = FlushResult()
    wanted = set(progress) | set(closing) | set(releasing) | set(holding)
    if not wanted:
        return result
    with transaction.atomic():
        rows = _lock_held_chunks(worker, wanted)
        result.lost = wanted - set(rows)
        counts = _held_counts(rows, progress, closing, releasing)
        if rows:
            Chunk.objects.filter(id__in=list(rows)).update(
                completed=F("completed") + _by_id({k: v[0] for k, v in counts.items()}),
                failed=F("failed") + _by_id({k: v[1] for k, v in counts.items()}),
                lease_expires_at=lease_deadline())
        figures = _BatchFigures.of(rows, counts, usage)
        closed_batches = _close_chunks(rows, counts, closing, figures, result)
        released = _release_chunks(rows, releasing)
        _account_batches(figures, closed_batches)
        _record_segments(rows, segments or {})
        result.stop_batches = _stopped_batches(rows, result.closed, released)
        settled = batches_without_open_chunks(closed_batches)
        refs = [(rows[c][0], c, rows[c][4]) for c in released]
        # robust: once committed, the flush must not look failed to the worker (it
        # would send its figures again); what fails here recovery and the tick cover.
        transaction.on_commit(lambda: _after_flush(settled, refs, bool(result.closed)),
                              robust=True)
    for chunk_id, status in result.closed.items():
        batch_id, count, *_, index = rows[chunk_id]
        logger.info("chunk closed batch_id=%s chunk=%s status=%s count=%s worker=%s",
                    batch_id, index, status, count, worker)
    for batch_id, _, index in refs:
        logger.info("chunk released batch_id=%s chunk=%s worker=%s", batch_id, index, worker)
    return result


# chunk id -> (batch id, count, completed, failed, index), as locked by a flush
HeldRows = dict[int, tuple[str, int, int, int, int]]


def _lock_held_chunks(worker: str, wanted: set[int]) -> HeldRows:
    """The chunks of `wanted` this worker still runs, locked in ascending id."""
    return {chunk_id: (batch_id, count, completed, failed, index)
            for chunk_id, batch_id, count, completed, failed, index in
            Chunk.objects.select_for_update().filter(
                id__in=wanted, worker=worker, status=ChunkStatus.RUNNING)
            .order_by("id").values_list("id", "batch_id", "count", "completed", "failed",
                                        "index")}


def _held_counts(rows: HeldRows, *sources: dict[int, Counts]) -> dict[int, Counts]:
    """The results reported for each held chunk, summed over the kinds of report."""
    counts: dict[int, Counts] = {}
    for source in sources:
        for chunk_id, (done, failed) in source.items():
            if chunk_id in rows:
                was = counts.get(chunk_id, (0, 0))
                counts[chunk_id] = (was[0] + done, was[1] + failed)
    return counts


@dataclass
class _BatchFigures:
    """One flush's figures per batch: results accounted, capacity going back (results
    and requests never to run) and tokens."""

    done: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    failed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    release: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    usage: dict[str, Usage] = field(default_factory=lambda: defaultdict(Usage))

    @classmethod
    def of(cls, rows: HeldRows, counts: dict[int, Counts],
           usage: dict[int, Usage]) -> _BatchFigures:
        figures = cls()
        for chunk_id, (done, failed) in counts.items():
            batch_id = rows[chunk_id][0]
            figures.done[batch_id] += done
            figures.failed[batch_id] += failed
            figures.release[batch_id] += done + failed
        for chunk_id, tokens in usage.items():
            if chunk_id in rows:
                figures.usage[rows[chunk_id][0]] += tokens
        return figures


def _close_chunks(rows: HeldRows, counts: dict[int, Counts], closing: dict[int, Counts],
                  figures: _BatchFigures, result: FlushResult) -> set[str]:
    """Close the held chunks of `closing`: done when every request has a result,
    else skipped, and the capacity of the requests never run goes back. Returns their
    batches."""
    closed_batches = set()
    for chunk_id in closing.keys() & rows.keys():
        batch_id, count, completed, failed, _ = rows[chunk_id]
        done, failed_now = counts.get(chunk_id, (0, 0))
        finished = completed + failed + done + failed_now
        result.closed[chunk_id] = (ChunkStatus.DONE if finished >= count
                                   else ChunkStatus.SKIPPED)
        figures.release[batch_id] += max(count - finished, 0)
        closed_batches.add(batch_id)
    if result.closed:
        Chunk.objects.filter(id__in=list(result.closed)).update(
            status=_by_id(result.closed, default=ChunkStatus.DONE, field_type=CharField),
            finished_at=timezone.now(), lease_expires_at=None)
    return closed_batches


def _release_chunks(rows: HeldRows, releasing: dict[int, Counts]) -> list[int]:
    """Queue the held chunks of `releasing` again, for any worker; their ids."""
    released = sorted(releasing.keys() & rows.keys())
    if released:
        Chunk.objects.filter(id__in=released).update(
            status=ChunkStatus.QUEUED, worker="", lease_expires_at=None, published_at=None)
    return released


def _record_segments(rows: HeldRows, segments: dict[int, list[tuple[str, int]]]) -> None:
    """The held chunks' new segments, appended to their batches' streams under the
    batch rows' locks, so a batch's segment ids are its stream's order."""
    held = {chunk_id: written for chunk_id, written in segments.items()
            if chunk_id in rows and written}
    if not held:
        return
    batch_ids = sorted({rows[chunk_id][0] for chunk_id in held})
    lock_ids(Batch.objects.filter(id__in=batch_ids))
    ends = dict(OutputSegment.objects.filter(batch_id__in=batch_ids).values("batch_id")
                .annotate(end=Sum("size")).values_list("batch_id", "end"))
    new = []
    for chunk_id in sorted(held):
        batch_id = rows[chunk_id][0]
        for name, size in held[chunk_id]:
            start = ends.get(batch_id) or 0
            new.append(OutputSegment(batch_id=batch_id, chunk_id=chunk_id, name=name,
                                     size=size, start_offset=start))
            ends[batch_id] = start + size
    OutputSegment.objects.bulk_create(new)


def _account_batches(figures: _BatchFigures, closed_batches: set[str]) -> None:
    """Add the flush's figures to the batch rows and their keys' usage of the day."""
    changed = ({b for b, n in figures.release.items() if n} | closed_batches
               | {b for b, tokens in figures.usage.items() if tokens})
    if changed:
        # lock_ids' statement, also reading whose the batches are (for KeyUsage).
        owners = dict(Batch.objects.filter(id__in=changed).select_for_update()
                      .order_by("pk").values_list("pk", "owner_id"))
        # Token sums ride in the same UPDATE: no statement per request or per figure.
        tokens = {USAGE_COLUMNS[name]: F(USAGE_COLUMNS[name]) + _by_id(
            {b: getattr(u, name) for b, u in figures.usage.items()}, field_type=BigIntegerField)
            for name in USAGE_FIELDS}
        tokens["output_limit_done"] = F("output_limit_done") + _by_id(
            {b: u.output_limit for b, u in figures.usage.items()}, field_type=BigIntegerField)
        Batch.objects.filter(id__in=changed).update(
            completed=F("completed") + _by_id(figures.done),
            failed=F("failed") + _by_id(figures.failed),
            intake_reserved=Greatest(F("intake_reserved") - _by_id(figures.release), 0),
            **tokens)
        # Last in the lock order: the keys' rows for today, one statement.
        quotas.key_usage_add(_key_usage(owners, figures.done, figures.failed, figures.usage))
    if closed_batches:
        # Results were written, so a wait on a full volume is over for these batches.
        Batch.objects.filter(id__in=closed_batches,
                             error__code=StorageFull.code).update(error=None)


def _stopped_batches(rows: HeldRows, closed: dict[int, str], released: list[int]) -> set[str]:
    """The batches of the chunks the worker still holds that no longer run."""
    held_batches = {rows[c][0] for c in rows if c not in closed and c not in released}
    if not held_batches:
        return set()
    return set(Batch.objects.filter(id__in=held_batches)
               .exclude(status=BatchStatus.IN_PROGRESS).values_list("id", flat=True))


def _key_usage(owners: dict[str, int | None], done: dict[str, int], failed: dict[str, int],
               usage: dict[str, Usage]) -> dict:
    """This flush's figures per (API key, UTC day): the day is the flush's."""
    today = quotas.utc_today()
    additions: dict = defaultdict(quotas.KeyDayUsage)
    for batch_id, owner_id in owners.items():
        if owner_id is None:
            continue
        add = additions[owner_id, today]
        add.requests_completed += done.get(batch_id, 0)
        add.requests_failed += failed.get(batch_id, 0)
        if batch_id in usage:
            add.tokens += usage[batch_id]
    return additions


def _after_flush(settled: list[str], released: list[tuple[str, int, int]],
                 closed: bool) -> None:
    for batch_id in settled:
        send_finalize(batch_id)
    if released:
        publish_chunks(released)
    if closed or released:
        # A chunk thread is free: feed the next chunk, unless a dispatch runs already
        # (it, the next flush or the control worker's tick covers this one).
        dispatch(wait=False)


def batches_without_open_chunks(batch_ids: Iterable[str]) -> list[str]:
    """Of these batches, those whose every chunk is closed: ready to finalize."""
    batch_ids = list(batch_ids)
    if not batch_ids:
        return []
    open_chunks = Chunk.objects.filter(batch=OuterRef("pk"), status__in=OPEN_CHUNKS)
    return list(Batch.objects.filter(id__in=batch_ids).exclude(Exists(open_chunks))
                .values_list("id", flat=True))


@retry_transient
def chunks_skip_queued(*, batch_id: str) -> int:
    """Skip the chunks of a batch that no worker runs yet, returning their capacity."""
    with transaction.atomic():
        ids = lock_ids(Chunk.objects.filter(
            batch_id=batch_id, status__in=[ChunkStatus.PENDING, ChunkStatus.QUEUED]))
        if not ids:
            return 0
        skipped = Chunk.objects.filter(id__in=ids)
        requests = sum(skipped.values_list("count", flat=True))
        skipped.update(status=ChunkStatus.SKIPPED, finished_at=timezone.now())
        intake.intake_release(batch_id=batch_id, requests=requests)
    return len(ids)


@retry_transient
def chunks_requeue_expired() -> list[tuple[str, int, int]]:
    """Chunks whose worker stopped renewing the lease, and queued chunks whose
    message was never published (or was lost with a broker), go back to the queue.
    Returns what must be published again."""
    now = timezone.now()
    stale = now - timedelta(seconds=settings.BATCHGEN_CHUNK_LEASE_SECONDS)
    with transaction.atomic():
        expired = lock_ids(Chunk.objects.filter(status=ChunkStatus.RUNNING,
                                                lease_expires_at__lt=now))
        if expired:
            Chunk.objects.filter(id__in=expired).update(
                status=ChunkStatus.QUEUED, worker="", lease_expires_at=None, published_at=None)
            logger.warning("requeued %s chunk(s) whose worker stopped renewing its lease",
                           len(expired))
    unpublished = Chunk.objects.filter(status=ChunkStatus.QUEUED).filter(
        Q(published_at__isnull=True) | Q(published_at__lt=stale - timedelta(hours=6)))
    return list(unpublished.values_list("batch_id", "id", "index"))


@retry_transient
def chunks_expire_leases(*, workers: list[str]) -> int:
    """The leases of these (dead) workers' chunks end now, so recovery requeues
    them at once instead of waiting the lease out."""
    with transaction.atomic():
        ids = lock_ids(Chunk.objects.filter(worker__in=workers, status=ChunkStatus.RUNNING))
        return Chunk.objects.filter(id__in=ids).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1))
