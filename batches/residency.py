"""Model multiplexing's decider: the control plane's half of residency.

One decider. The control worker's beat runs `residency_decide` every second (the
`residency.decide` task); it holds the `residency` ControlLock for its transaction (a
second decider finds it taken and skips its turn), and each decision is a conditional
UPDATE of the worker's Residency row on its epoch, so even a decider that raced past
the lock cannot decide a worker twice. It reads the figures (this package's open
chunks, the fleet's records), runs the pure policy (fleet/residency.py:plan, whose
docstring says what it promises) and writes the decisions back. It lives with the
batch machinery because a model's demand is its batches' open chunks; the workers
obey (inference/swap.py).
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Min, Sum
from django.utils import timezone

from batches.chunks import OPEN_CHUNKS
from batches.dispatch import chunk_model
from batches.locks import lock_control
from batches.models import BatchStatus, Chunk
from core.transient import retry_transient
from fleet.models import ModelSwap, Residency
from fleet.residency import Decision, ModelDemand, WorkerState, plan
from fleet.selectors import live_workers, swap_seconds_estimate, worker_rate

logger = logging.getLogger("batchgen.batches")

RESIDENCY_LOCK = "residency"  # a ControlLock row, taken alone (batches/locks.py)


def model_demand(now: datetime) -> list[ModelDemand]:
    """Open requests of each model, and since when each has waited (1. in fleet/residency.py)."""
    rows = (Chunk.objects.filter(status__in=OPEN_CHUNKS, batch__status=BatchStatus.IN_PROGRESS)
            .values("model").annotate(requests=Sum(F("count") - F("completed") - F("failed")),
                                      since=Min("batch__in_progress_at")))
    rows = list(rows)
    oldest = min((row["since"] for row in rows if row["since"]), default=now)
    # Only evictions since the oldest open batch began can move a wait's start.
    evicted = dict(ModelSwap.objects.exclude(from_model="").filter(decided_at__gte=oldest)
                   .values("from_model").annotate(last=Max("decided_at"))
                   .values_list("from_model", "last"))
    merged: dict[str, tuple[int, datetime]] = {}
    for row in rows:
        model = chunk_model(row["model"])
        requests, since = merged.get(model, (0, row["since"] or now))
        merged[model] = (requests + (row["requests"] or 0), min(since, row["since"] or now))
    return [ModelDemand(model, requests,
                        max(since, evicted.get(model) or since).timestamp())
            for model, (requests, since) in merged.items()]


def _workers(live: dict[str, tuple[str, bool]]) -> list[WorkerState]:
    states = []
    for row in Residency.objects.filter(worker__in=list(live)).order_by("worker"):
        holds, ready = live[row.worker]
        states.append(WorkerState(row.worker, row.model, row.assigned_at.timestamp(),
                                  settled=ready and holds == row.model,
                                  cannot=frozenset(row.cannot_start or ())))
    return states


@retry_transient
def residency_decide() -> list[Decision]:
    """One turn of the scheduler: forget workers that are gone, plan, write the
    decisions. Returns those written. Reads only while no worker multiplexes."""
    if not Residency.objects.exists():
        return []
    now = timezone.now()
    with transaction.atomic():
        if not lock_control(RESIDENCY_LOCK, wait=False):
            return []
        live = {name: (model, ready) for name, model, ready
                in live_workers().values_list("name", "model", "ready")}
        # A worker heartbeats before it joins, so a row without a live worker is gone.
        gone = Residency.objects.exclude(worker__in=list(live))
        if gone.exists():
            logger.warning("residency: forgetting gone worker(s) %s",
                           list(gone.values_list("worker", flat=True)))
            gone.delete()
        workers = _workers(live)
        decisions = plan(workers, model_demand(now), now=now.timestamp(),
                         stretch=settings.BATCHGEN_MODEL_STRETCH_SECONDS,
                         max_wait=settings.BATCHGEN_MAX_MODEL_WAIT_SECONDS,
                         swap_seconds=swap_seconds_estimate(), rate=worker_rate(now))
        held = {w.name: w.model for w in workers}
        return [d for d in decisions if _write(d, held[d.worker], now)]


def _write(decision: Decision, previous: str, now: datetime) -> bool:
    row = Residency.objects.get(worker=decision.worker)
    swap = ModelSwap.objects.create(worker=decision.worker, from_model=previous,
                                    to_model=decision.model, reason=decision.reason,
                                    decided_at=now)
    written = Residency.objects.filter(worker=decision.worker, epoch=row.epoch,
                                       model=previous).update(
        model=decision.model, epoch=row.epoch + 1, assigned_at=now, swap=swap.id)
    if not written:
        swap.delete()
        return False
    logger.info("residency: %s to hold %s (was %s): %s", decision.worker, decision.model,
                previous or "nothing", decision.reason)
    return True
