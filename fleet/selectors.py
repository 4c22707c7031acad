"""Reads of the fleet's records: which workers live, what they hold and can hold,
what the swaps cost. What /health, /metrics, /v1/models, the pool figures and the
batch machinery (dispatch, recovery, the model watch, the residency decider) ask
about the workers."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.db.models import Count, Max, QuerySet
from django.utils import timezone

from core.transient import retry_transient
from fleet.models import ModelSwap, Residency, Worker
from fleet.residency import DEFAULT_SWAP_SECONDS
from serving.model_info import served_models


def live_workers() -> QuerySet[Worker]:
    """Workers whose heartbeat is fresh and that did not say they stopped."""
    fresh = timezone.now() - timedelta(seconds=settings.BATCHGEN_WORKER_TTL_SECONDS)
    return Worker.objects.filter(heartbeat_at__gte=fresh, stopped_at__isnull=True)


MAX_CHUNK_THREADS = 512


def chunk_threads(slots_capacity: int) -> int:
    """The chunk threads of an inference worker with these slots: enough chunks to
    fill every slot, and two more (chunks near their end hold few slots; two more
    keep the engine fed). The worker sizes its pool by it
    (inference.signals.inference_concurrency); dispatch and the ETA count by it."""
    return min(MAX_CHUNK_THREADS, math.ceil(slots_capacity / settings.BATCHGEN_CHUNK_SIZE) + 2)


def dispatch_window(model: str) -> int:
    """Chunks of `model` to keep dispatched but unclaimed: what the chunk threads of
    the live workers holding it can hold, plus a little slack."""
    return window_for(chunk_threads(capacity) for capacity in live_workers()
                      .filter(model=model).values_list("slots_capacity", flat=True))


def window_for(threads: Iterable[int]) -> int:
    """dispatch_window for live workers of these chunk threads."""
    return sum(threads) + 2


class WorkerWork(NamedTuple):
    """A live worker as the ETA's refresh reads it: its slots and its engines' work
    so far (Worker.busy_seconds and the counts beside it)."""

    slots: int
    busy: float  # seconds it held at least one request
    requests: int  # done or failed
    prompt: int  # prompt tokens computed
    output: int  # tokens generated
    prompt_weight: float | None = None  # as its engine's steps tell (None: not yet)
    tails: dict[str, list] | None = None  # Worker.chunk_tails


def live_worker_work() -> dict[str, dict[str, WorkerWork]]:
    """Each model's live workers, their slots (their chunk threads are
    `chunk_threads` of it) and their work so far: {model: {worker: WorkerWork}},
    in one query."""
    found: dict[str, dict[str, WorkerWork]] = defaultdict(dict)
    for model, name, capacity, busy, done, failed, prompt, output, *now in (
            live_workers().values_list("model", "name", "slots_capacity", "busy_seconds",
                                       "requests_completed", "requests_failed",
                                       "prompt_tokens_computed", "tokens_computed",
                                       "engine_prompt_weight", "chunk_tails")):
        found[model][name] = WorkerWork(capacity, busy, done + failed, prompt, output, *now)
    return found


def chunks_held_by_live_workers() -> set[int]:
    """The chunks live workers said at their last heartbeat they hold, claimed or
    prefetched (Worker.held_chunks)."""
    held: set[int] = set()
    for chunk_ids in live_workers().values_list("held_chunks", flat=True):
        held.update(chunk_ids or ())
    return held


def models_without_ready_worker() -> list[str]:
    """The served models none of whose live inference workers has its engine ready:
    nothing runs their requests now (/health; batches waiting for them,
    batches/availability.py)."""
    ready = set(live_workers().filter(ready=True).values_list("model", flat=True))
    if multiplexing_workers().filter(ready=True).exists():
        # They hold each model in turn (fleet/residency.py), all but those none
        # of them can start.
        return [model for model in models_that_cannot_start() if model not in ready]
    return [model.id for model in served_models() if model.id not in ready]


def models_that_cannot_start() -> dict[str, str]:
    """Where workers multiplex: the served models whose engine can start on none of
    the live multiplexing workers (Residency.cannot_start), each with why (one
    worker's reason). The scheduler gives them to no worker."""
    rows = list(Residency.objects.filter(worker__in=live_workers().values("name"))
                .values_list("cannot_start", flat=True))
    if not rows:
        return {}
    return {model.id: rows[0][model.id] for model in served_models()
            if all(model.id in (row or {}) for row in rows)}


def models_not_resident() -> list[str]:
    """Where workers multiplex: the served models none of them holds now (loaded or
    loading), but for those none can start (their batches wait as for a model with
    no worker, batches/availability.py). Empty where none multiplexes."""
    held = set(Residency.objects.filter(worker__in=live_workers().values("name"))
               .values_list("model", flat=True))
    if not held:
        return []
    cannot = models_that_cannot_start()
    return [model.id for model in served_models() if model.id not in held | set(cannot)]


def multiplexing_workers() -> QuerySet[Worker]:
    """The live workers that hold whichever model the residency scheduler gives them."""
    return live_workers().filter(name__in=Residency.objects.values("worker"))


def resident_on() -> dict[str, list[str]]:
    """Each model's live workers: those holding it and, where workers multiplex, those
    the residency scheduler gave it (loaded or loading)."""
    held: dict[str, set[str]] = {}
    for name, model in live_workers().exclude(model="").values_list("name", "model"):
        held.setdefault(model, set()).add(name)
    for name, model in (Residency.objects.filter(worker__in=live_workers().values("name"))
                        .exclude(model="").values_list("worker", "model")):
        held.setdefault(model, set()).add(name)
    return {model: sorted(names) for model, names in held.items()}


def live_workers_by_model() -> dict[str, int]:
    """How many live workers hold each model."""
    return dict(live_workers().values("model").annotate(workers=Count("name"))
                .values_list("model", "workers"))


def model_contexts() -> dict[str, int]:
    """Each served model's context: the catalogue's (serving.model_info), else, for a
    remote engine's model whose server this process could not ask yet (`serve`
    starts both at once), the context its live, ready workers started their engines
    with; 0 while none is ready. Only then is the database asked."""
    models = served_models()
    if all(model.max_context_length for model in models):
        return {model.id: model.max_context_length for model in models}
    reported = dict(live_workers().filter(ready=True, max_context_length__gt=0)
                    .values("model").annotate(context=Max("max_context_length"))
                    .values_list("model", "context"))
    return {model.id: model.max_context_length or reported.get(model.id, 0)
            for model in models}


def adaptive_concurrency() -> list[dict]:
    """The live workers whose engine bounds its own requests at a shared server
    (inference/adaptive.py): each one's limit and the signals it read last."""
    return [{"worker": name, "model": model, **admission}
            for name, model, admission in live_workers().filter(admission__isnull=False)
            .order_by("name").values_list("name", "model", "admission")]


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
    rates = [completed / max((now - started).total_seconds(), 1.0) for completed, started
             in live_workers().filter(requests_completed__gt=0)
             .values_list("requests_completed", "started_at")]
    return max(rates, default=None)


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
