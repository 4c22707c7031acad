"""Model multiplexing: which model each multiplexing inference worker holds.

One decider. The control worker's beat runs `residency_decide` every second; it holds
the `residency` ControlLock for its transaction (a second decider finds it taken and
skips its turn), and each decision is a conditional UPDATE of the worker's Residency
row on its epoch, so even a decider that raced past the lock cannot decide a worker
twice. Workers obey (inference/swap.py): they never choose a model themselves.

The policy (`plan`, a pure function of the figures, also run by
benchmarks/multiplex.py), in order:

1. A model with open requests and no worker assigned *waits*; its wait began when its
   oldest open batch started running, or when the model was last taken off a worker,
   whichever is later. Waiting models are served longest wait first.
2. A worker that holds nothing, or a model that ran dry (no open request), takes the
   longest-waiting model. A worker whose model ran dry and for which nothing waits
   keeps its model loaded: a later batch of it costs no swap.
3. A waiting model takes a busy worker when that worker's stretch has ended
   (BATCHGEN_MODEL_STRETCH_SECONDS since its model became resident, but never less
   than MIN_STRETCH_SWAPS swaps' time, so swapping takes at most about a tenth of a
   worker's time however costly a swap is here) or when the
   model's wait reaches its deadline (BATCHGEN_MAX_MODEL_WAIT_SECONDS less what a
   swap takes), whatever the stretch. Of the candidates it takes first a worker whose
   model another worker also holds (that model stays resident), then the longest
   stretch.
4. A worker left idle joins the model with the most open requests per worker when
   that pays for its swap: the time the model's queue takes drops by more than a
   swap costs (measured from the workers' rate; SPREAD_MIN_REQUESTS before any rate
   is known). A second worker on a large batch, not on its last few chunks.

A worker is never given a model whose engine it found can never start with its
settings (Residency.cannot_start, written by the worker: inference/swap.py); a model
no live worker can start is given to none, and its batches fail with
`model_unavailable` at BATCHGEN_MODEL_UNAVAILABLE_SECONDS (batches/availability.py).

What it promises: with one worker and every batch submitted together, each model with
work becomes resident once (as many loads as models, one swap fewer), as long as each
model's work fits in a stretch; and no model waits longer than the bound for a worker,
as long as the bound exceeds what the swaps ahead of it take (docs/architecture.md).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
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
from inference.models import ModelSwap, Residency

logger = logging.getLogger("batchgen.inference")

RESIDENCY_LOCK = "residency"  # a ControlLock row, taken alone (batches/locks.py)
# An idle worker joins a model already resident elsewhere only for this much work per
# worker: a swap for a few requests' worth would cost more than it gains.
SPREAD_MIN_REQUESTS = 400
# A stretch lasts at least this many swaps' time: swaps then cost at most 1/11 of a
# busy worker's time (benchmarks/multiplex.py: >= 0.9x the ideal).
MIN_STRETCH_SWAPS = 10
# A swap's cost before any has been measured (a CPU vLLM stop and start, measured).
DEFAULT_SWAP_SECONDS = 40.0


class Reason(enum.StrEnum):
    IDLE = "idle"  # the worker held nothing, or a model with no open request
    STRETCH = "stretch"  # the resident model's stretch ended while another waited
    DEADLINE = "deadline"  # the waiting model reached its wait bound
    SPREAD = "spread"  # an idle worker joins a large queue


@dataclass(frozen=True, slots=True)
class WorkerState:
    name: str
    model: str  # assigned ("" none)
    since: float  # when the assignment was made (seconds, epoch)
    settled: bool  # it holds its assigned model with its engine ready
    # Models whose engine can never start on it (Residency.cannot_start): never given it.
    cannot: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ModelDemand:
    model: str
    requests: int  # open requests (pending, queued or running)
    waiting_since: float  # see the module docstring, 1.


@dataclass(frozen=True, slots=True)
class Decision:
    worker: str
    model: str
    reason: Reason


def plan(workers: list[WorkerState], demand: list[ModelDemand], *, now: float,
         stretch: float, max_wait: float, swap_seconds: float,
         rate: float | None = None) -> list[Decision]:
    """What each worker that must change model is to hold next (the policy above)."""
    open_requests = {d.model: d.requests for d in demand if d.requests > 0}
    assigned = {w.name: w.model for w in workers}
    stretch = max(stretch, MIN_STRETCH_SWAPS * swap_seconds)
    waiting = sorted((d for d in demand if d.requests > 0 and d.model not in assigned.values()),
                     key=lambda d: (d.waiting_since, d.model))
    decisions: list[Decision] = []

    def assign(worker: WorkerState, model: str, reason: Reason) -> None:
        assigned[worker.name] = model
        decisions.append(Decision(worker.name, model, reason))

    idle = sorted((w for w in workers if w.model not in open_requests),
                  key=lambda w: (w.model != "", w.since, w.name))
    for worker in idle:
        model = next((d for d in waiting if d.model not in worker.cannot), None)
        if model is not None:
            waiting.remove(model)
            assign(worker, model.model, Reason.IDLE)
    for model in waiting:
        deadline = now - model.waiting_since >= max(max_wait - swap_seconds, 0)
        worker = _preemptible([w for w in workers if model.model not in w.cannot], assigned,
                              open_requests, now=now, stretch=stretch, deadline=deadline)
        if worker is not None:
            assign(worker, model.model, Reason.DEADLINE if deadline and
                   now - worker.since < stretch else Reason.STRETCH)
    for worker in idle:
        if assigned[worker.name] != worker.model:
            continue
        target = _worth_joining(open_requests, assigned, swap_seconds=swap_seconds, rate=rate)
        if target is not None and target != worker.model and target not in worker.cannot:
            assign(worker, target, Reason.SPREAD)
    return decisions


def _preemptible(workers: list[WorkerState], assigned: dict[str, str],
                 open_requests: dict[str, int], *, now: float, stretch: float,
                 deadline: bool) -> WorkerState | None:
    """The busy worker a waiting model may take (3. above), or None."""
    holders: dict[str, int] = {}
    for model in assigned.values():
        holders[model] = holders.get(model, 0) + 1
    candidates = [w for w in workers
                  if w.settled and assigned[w.name] == w.model and w.model in open_requests
                  and (deadline or now - w.since >= stretch)]
    if not candidates:
        return None
    return min(candidates, key=lambda w: (holders[w.model] < 2, w.since, w.name))


def _worth_joining(open_requests: dict[str, int], assigned: dict[str, str], *,
                   swap_seconds: float, rate: float | None) -> str | None:
    """The model with the most open requests per worker, if one more worker on it
    saves more time than its swap costs (`rate`: requests a second one worker runs):
    with h workers, N requests take N/(h·rate) s, with h+1 a swap plus N/((h+1)·rate)."""
    holders: dict[str, int] = {}
    for model in assigned.values():
        holders[model] = holders.get(model, 0) + 1
    best = max(open_requests, default=None,
               key=lambda m: (open_requests[m] / (holders.get(m, 0) + 1), m))
    if best is None:
        return None
    held = holders.get(best, 0)
    if rate and held:
        saved = open_requests[best] / rate * (1 / held - 1 / (held + 1))
        return best if saved > swap_seconds else None
    return best if open_requests[best] / (held + 1) >= SPREAD_MIN_REQUESTS else None


# --- the decider: the figures from the database, the decisions written back -----------------


def model_demand(now: datetime) -> list[ModelDemand]:
    """Open requests of each model, and since when each has waited (1. above)."""
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


def swap_seconds_estimate() -> float:
    """What a swap has taken here lately (the last ten measured), or the default."""
    recent = list(ModelSwap.objects.filter(seconds__isnull=False).order_by("-id")
                  .values_list("seconds", "drain_seconds")[:10])
    if not recent:
        return DEFAULT_SWAP_SECONDS
    return max(seconds + (drain or 0) for seconds, drain in recent)


def worker_rate(now: datetime) -> float | None:
    """Requests a second one live worker has run since it started (the fastest's), or
    None before any has run one."""
    from inference.selectors import live_workers

    rates = [completed / max((now - started).total_seconds(), 1.0) for completed, started
             in live_workers().filter(requests_completed__gt=0)
             .values_list("requests_completed", "started_at")]
    return max(rates, default=None)


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
    from inference.selectors import live_workers

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


# --- the worker's side of the rows -----------------------------------------------------------


@retry_transient
def residency_join(*, worker: str, cannot_start: dict[str, str] | None = None) -> None:
    """A multiplexing worker starts holding nothing (`cannot_start`: what it found it
    cannot start before the scheduler forgot it, see residency_cannot_start)."""
    Residency.objects.update_or_create(worker=worker, defaults={
        "model": "", "swap": None, "cannot_start": cannot_start or {}})


@retry_transient
def residency_assigned(*, worker: str) -> tuple[str, int | None] | None:
    """The model this worker is to hold and the swap that decided it (None: the
    scheduler forgot the worker, which then joins again)."""
    row = Residency.objects.filter(worker=worker).values_list("model", "swap").first()
    return row


@retry_transient
def swap_record(*, swap_id: int, started_at: datetime, finished_at: datetime,
                drain_seconds: float, seconds: float | None, error: str = "") -> None:
    """What a swap cost (`seconds` None and `error` said: its new engine did not start)."""
    ModelSwap.objects.filter(id=swap_id).update(started_at=started_at, finished_at=finished_at,
                                                drain_seconds=drain_seconds, seconds=seconds,
                                                error=error)


@retry_transient
def swap_outcome(swap_id: int) -> dict | None:
    """What a swap did, as the `residency.swap` task shows it in Flower (None: no such
    swap, its decision undone)."""
    swap = ModelSwap.objects.filter(id=swap_id).first()
    if swap is None:
        return None
    outcome = "failed" if swap.error else "done" if swap.seconds is not None else "under way"
    return {"swap": swap.id, "worker": swap.worker, "from": swap.from_model, "to": swap.to_model,
            "reason": swap.reason, "outcome": outcome, "seconds": swap.seconds,
            "hand_back_seconds": swap.drain_seconds, "error": swap.error or None}


@retry_transient
def residency_cannot_start(*, worker: str, model: str, error: str) -> None:
    """`model`'s engine can never start on this worker with its settings: the worker
    holds nothing again and the scheduler never gives it `model` again (its row goes
    when the worker does, so a restart with new settings tries it again)."""
    with transaction.atomic():
        row = Residency.objects.select_for_update().filter(worker=worker).first()
        if row is None:
            return  # forgotten meanwhile: the worker joins again, and fails it again
        row.cannot_start = {**(row.cannot_start or {}), model: error}
        fields = ["cannot_start"]
        if row.model == model:  # not reassigned meanwhile
            row.model, row.epoch, row.swap = "", row.epoch + 1, None
            fields += ["model", "epoch", "swap"]
        row.save(update_fields=fields)
