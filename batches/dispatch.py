"""The dispatcher: moves chunks from the IntakePool (pending rows in the database)
to the inference queue, a few at a time, fairly across batches.

Why not publish a whole batch at once: a broker queue is first in, first out, so a
50-request batch submitted behind a million-request one would wait for all of it.
Instead the broker holds only a short window (enough chunks to keep every worker's
chunk threads busy) and each time a chunk closes the next one is chosen by stride
scheduling: every in-progress batch with pending chunks has a pass value that grows
by requests/share as it is served, and the lowest pass goes next, the older batch
where two are level (first come, first served; `batch_shares`: API keys share by
their `weight`, a key's batches split its share by priority).
Equal shares give round-robin by requests; priority 3 gets three times the share of
a priority 1 batch of the same key. A batch joining the race starts at the lowest
pass of those already running, so it neither starves them nor waits behind them.

Per model: each served model has its own queue and its own workers (docs/models.md),
so each has its own window, the chunks its live workers can hold; a model with no
live worker keeps its MIN_WINDOW and never takes the room of the others. Batches
race for each model's window by the same passes.

Where it runs: the control worker's tick (every second) and, after a flush that
closed or released chunks, the inference worker that flushed. Dispatchers serialise
on the `dispatch` ControlLock and do not queue for it: one that finds it held skips,
since the holder, the next flush or the next tick covers its turn. So closing
chunks never makes a queue of dispatch transactions, however many workers close
them at once.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import F, Min
from django.utils import timezone

from batches.deadlines import deadline_shares
from batches.eta import Load, request_cost
from batches.locks import lock_control, lock_ids
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus, ControlLock, ModelThroughput
from core.celery import ESTIMATES_SECONDS, QueueName, inference_queue
from core.publishing import Message, publish, publisher
from core.transient import retry_transient
from fleet import selectors as fleet_selectors
from serving.model_info import served_models

MIN_WINDOW = 4


def dispatch_window(model: str) -> int:
    """Chunks of `model` to keep dispatched but unclaimed: what its live workers'
    chunk threads can hold (the fleet's Worker rows), never below MIN_WINDOW."""
    return max(MIN_WINDOW, fleet_selectors.dispatch_window(model))


def served_model_ids() -> list[str]:
    """The served models' ids, the default first."""
    return [model.id for model in served_models()]


def chunk_model(model: str) -> str:
    """The model a chunk goes to: its own, or, for chunks made before chunks named
    their model (blank), the default one."""
    return model or served_model_ids()[0]


def _model_filter(model: str) -> list[str]:
    return [model, ""] if model == served_model_ids()[0] else [model]


def starting_pass() -> float:
    """The pass a batch starts at: the lowest of the batches still being dispatched."""
    low = (Batch.objects.filter(status=BatchStatus.IN_PROGRESS, chunks__status=ChunkStatus.PENDING)
           .aggregate(low=Min("dispatch_pass"))["low"])
    return low or 0.0


@retry_transient
def dispatch(*, wait: bool = True) -> int:
    """Dispatch chunks until the window is full; returns how many. Safe to call from
    any process at any time. With wait=False, returns 0 at once when another
    dispatch holds the lock.

    Locks (batches.locks): the dispatch ControlLock, the chosen pending chunk rows,
    then the batch rows whose pass moved, each in ascending id.

    Most calls find nothing to do (the tick on an idle server, every chunk out
    already, or every window full): they answer from indexed reads, without a write
    transaction, which on SQLite would take the database's one write lock every
    second from the workers' flushes. What changes after the reads is covered as
    it would be under the lock: admission dispatches after it commits new chunks, a
    flush that frees a chunk thread after it, and the next tick whatever else."""
    if (not Chunk.objects.filter(status=ChunkStatus.PENDING).exists()
            or not any(_room(model) > 0 for model in served_model_ids())):
        return 0
    refs: list[tuple[str, int, int]] = []
    with transaction.atomic():
        if not lock_control(ControlLock.DISPATCH, wait=wait):
            return 0
        advanced: dict[str, float] = {}
        # One model after another, all in this transaction: the rows are locked
        # below in one go, chunks then batches, each in ascending id.
        for model in served_model_ids():
            refs += _choose(model, advanced)
        if not refs:
            return 0
        # A cancel may have skipped some meanwhile: only the still-pending ones go.
        still = set(lock_ids(Chunk.objects.filter(id__in=[r[1] for r in refs],
                                                  status=ChunkStatus.PENDING)))
        refs = [ref for ref in refs if ref[1] in still]
        Chunk.objects.filter(id__in=still).update(status=ChunkStatus.QUEUED, published_at=None)
        for batch_id in lock_ids(Batch.objects.filter(id__in=advanced)):
            Batch.objects.filter(id=batch_id).update(dispatch_pass=advanced[batch_id])
        # robust: the dispatch is committed whatever happens after; chunks the broker
        # does not take now are published as soon as it does (publish_chunks).
        transaction.on_commit(lambda: publish_chunks(refs), robust=True)
    return len(refs)


def _room(model: str) -> int:
    """How many more chunks of `model` its window takes now."""
    return dispatch_window(model) - Chunk.objects.filter(
        status=ChunkStatus.QUEUED, model__in=_model_filter(model)).count()


def _choose(model: str, advanced: dict[str, float]) -> list[tuple[str, int, int]]:
    """Pending chunks of `model` to fill its window, by stride scheduling; `advanced`
    holds the batches' passes as they grow (shared by the models)."""
    models = _model_filter(model)
    room = _room(model)  # again, under the lock: dispatch()'s first read was without it
    if room <= 0:
        return []
    candidates = list(Batch.objects.filter(status=BatchStatus.IN_PROGRESS,
                                           chunks__status=ChunkStatus.PENDING,
                                           chunks__model__in=models)
                      .distinct().values_list("dispatch_pass", "id", "priority", "owner_id",
                                              "owner__weight", "expires_at", "total",
                                              "completed", "failed", "usage_output_tokens",
                                              F("usage_input_tokens") - F("usage_cached_tokens"),
                                              "created_at"))
    shares = batch_shares([(batch_id, priority, owner_id, weight)
                           for _, batch_id, priority, owner_id, weight, *_ in candidates])
    if settings.BATCHGEN_DEADLINE_POLICY and len(candidates) > 1:
        shares = deadline_adjusted(model, candidates, shares)
    # Level passes go to the older batch (a new batch starts level with the lowest),
    # then by id: the order repeats from run to run, and the ETA's play follows it.
    heap = [(advanced.get(batch_id, passed), created, batch_id, shares[batch_id])
            for passed, batch_id, *_, created in candidates]
    heapq.heapify(heap)
    pending: dict[str, deque] = {}
    refs: list[tuple[str, int, int]] = []
    while heap and len(refs) < room:
        passed, created, batch_id, share = heapq.heappop(heap)
        if batch_id not in pending:
            pending[batch_id] = deque(
                Chunk.objects.filter(batch_id=batch_id, status=ChunkStatus.PENDING,
                                     model__in=models)
                .order_by("index").values_list("id", "index", "count")[:room])
        if not pending[batch_id]:
            continue
        chunk_id, index, count = pending[batch_id].popleft()
        refs.append((batch_id, chunk_id, index))
        passed += count / share
        advanced[batch_id] = passed
        heapq.heappush(heap, (passed, created, batch_id, share))
    return refs


def deadline_adjusted(model: str, candidates: list[tuple], shares: dict[str, float]
                      ) -> dict[str, float]:
    """The shares under the deadline policy (batches/deadlines.py): fair share while
    every batch keeps its window, else more for those that would miss one, least
    slack first. The model's rate is the one the estimate refresh measured
    (batches/estimates.py); unmeasured, fair share decides. One primary-key read."""
    measured = ModelThroughput.objects.filter(model=model).first()
    if measured is None or measured.rate <= 0:
        return shares
    now = timezone.now()
    loads = []
    for _, batch_id, priority, owner_id, weight, expires_at, total, completed, failed, \
            tokens, prompt, _ in candidates:
        cost = request_cost(completed + failed, tokens, measured.cost_per_request, prompt,
                            measured.prompt_weight)
        loads.append(Load(batch_id=batch_id, priority=priority, owner=owner_id, weight=weight,
                          remaining=max(total - completed - failed, 0) * cost, cost=cost,
                          time_left=(expires_at - now).total_seconds()))
    return deadline_shares(loads, measured.rate)


def batch_shares(batches: list[tuple[str, int, int | None, int | None]]) -> dict[str, float]:
    """Each batch's share of the workers, from (batch id, priority, owner key id, key
    weight): keys share in proportion to their weights, and a key's share is split
    among its batches waiting for the same model in proportion to their priorities.
    So a key gains nothing by splitting its work into many batches, and batches of
    one key (or of an open server, which has none) share exactly as their
    priorities say. A key's weight of 2 against 1 gets twice the requests."""
    per_key: dict[int | None, int] = {}
    for _, priority, owner_id, _ in batches:
        per_key[owner_id] = per_key.get(owner_id, 0) + max(priority, 1)
    return {batch_id: (weight or 1) * max(priority, 1) / per_key[owner_id]
            for batch_id, priority, owner_id, weight in batches}


def publish_chunks(refs: list[tuple[str, int, int]]) -> None:
    """Publish one message per chunk to its model's inference queue, by reference
    and by task name (only tasks.py modules import tasks), and mark what the broker
    took published. What it does not take (an outage) this process publishes again
    as soon as it does (core.publishing), and marks then."""
    models: dict[int, str] = {}
    ids = [ref[1] for ref in refs]
    for start in range(0, len(ids), 1000):
        models.update(Chunk.objects.filter(id__in=ids[start:start + 1000])
                      .values_list("id", "model"))
    messages = [Message("inference.run_chunk", (batch_id, chunk_id),
                        {"queue": inference_queue(chunk_model(models.get(chunk_id, ""))),
                         "shadow": f"chunk {batch_id}#{index}"},
                        after=partial(_mark_published, [chunk_id]))
                for batch_id, chunk_id, index in refs]
    _mark_published(ids[:publisher.publish_all(messages)])


def _mark_published(chunk_ids: list[int]) -> None:
    now = timezone.now()
    for start in range(0, len(chunk_ids), 1000):
        Chunk.objects.filter(id__in=chunk_ids[start:start + 1000]).update(published_at=now)


def send_finalize(batch_id: str) -> None:
    """Ask the control worker to finalize a batch whose last chunk closed."""
    publish("batches.finalize_batch", (batch_id,), queue=QueueName.CONTROL.value)


def send_validate(batch_id: str) -> None:
    publish("batches.validate_batch", (batch_id,), queue=QueueName.CONTROL.value)


def send_refresh() -> None:
    """Ask the control worker to refresh the ETAs now (batches.estimates.
    estimates_refresh_after), for an event the play cannot foresee: a batch
    admitted, whose work every other batch shares the model with, or one cancelled
    or expired, whose share goes back to them. A message the broker holds past its
    tick is dropped: the tick covers it."""
    publish("batches.refresh_estimates", (time.time(),), queue=QueueName.CONTROL.value,
            expires=2 * ESTIMATES_SECONDS)
