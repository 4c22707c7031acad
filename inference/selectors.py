from __future__ import annotations

import math
from datetime import timedelta

from django.conf import settings
from django.core.cache import caches
from django.db.models import Count, Max, Q, QuerySet, Sum
from django.utils import timezone

from batches.intake import intake_reserved
from batches.models import ACTIVE_STATUSES, Batch, Chunk, ChunkStatus
from inference.models import ModelSwap, Residency, Worker
from serving.model_info import served_models


def live_workers() -> QuerySet[Worker]:
    """Workers whose heartbeat is fresh and that did not say they stopped."""
    fresh = timezone.now() - timedelta(seconds=settings.BATCHGEN_WORKER_TTL_SECONDS)
    return Worker.objects.filter(heartbeat_at__gte=fresh, stopped_at__isnull=True)


def dispatch_window(model: str) -> int:
    """Chunks of `model` to keep dispatched but unclaimed: what the chunk threads of
    the live workers holding it can hold (see inference.signals.inference_concurrency),
    plus a little slack."""
    window = 0
    for capacity in live_workers().filter(model=model).values_list("slots_capacity",
                                                                   flat=True):
        window += math.ceil(capacity / settings.BATCHGEN_CHUNK_SIZE) + 2
    return window + 2


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
        # They hold each model in turn (inference/residency.py), all but those none
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


POOL_STATUS_CACHE_KEY = "batchgen:pool_status"


def pool_status_cached() -> dict:
    """pool_status(), from the process's cache (BATCHGEN_POOL_STATUS_CACHE_SECONDS)."""
    ttl = settings.BATCHGEN_POOL_STATUS_CACHE_SECONDS
    if ttl <= 0:
        return pool_status()
    return caches["default"].get_or_set(POOL_STATUS_CACHE_KEY, pool_status, timeout=ttl)


def pool_status() -> dict:
    """The IntakePool and SchedulingPool figures of /v1/pool/status.

    intake_pool_size counts requests admitted and not yet inside an engine: the
    reservation (admitted, not finished) less what the live workers run now."""
    slots = live_workers().aggregate(active=Sum("slots_active"), capacity=Sum("slots_capacity"),
                                     tokens=Sum("tokens_active"), budget=Sum("token_budget"),
                                     storage_error=Max("storage_error"))
    active = slots["active"] or 0
    capacity = slots["capacity"] or 0
    multiplexing = _multiplexing()
    return {
        **_model_figures(multiplexing),
        "multiplexing": multiplexing,
        "intake_pool_size": max(intake_reserved() - active, 0),
        "intake_pool_capacity": settings.BATCHGEN_MAX_INTAKE_CAPACITY,
        "scheduling_pool_active": active,
        "scheduling_pool_free": max(capacity - active, 0),
        "scheduling_pool_capacity": capacity,
        "active_batches": Batch.objects.filter(status__in=ACTIVE_STATUSES).count(),
        "pool_mode": True,
        # Length-aware admission (estimated tokens inside engines, and their budget).
        "scheduling_pool_tokens_active": slots["tokens"] or 0,
        "scheduling_pool_token_budget": slots["budget"],
        # Why results cannot be written now (the storage volume full), or null.
        "storage_error": slots["storage_error"] or None,
        "adaptive_concurrency": adaptive_concurrency(),
    }


def adaptive_concurrency() -> list[dict]:
    """The live workers whose engine bounds its own requests at a shared server
    (inference/adaptive.py): each one's limit and the signals it read last."""
    return [{"worker": name, "model": model, **admission}
            for name, model, admission in live_workers().filter(admission__isnull=False)
            .order_by("name").values_list("name", "model", "admission")]


def residency_figures() -> dict:
    """Model multiplexing's figures (inference/residency.py): the workers that
    multiplex, the swaps they made and what those cost, and for each model the workers
    it is resident on, its open requests and, while it is resident nowhere, how long
    it has waited."""
    from inference.residency import model_demand

    now = timezone.now()
    rows = list(Residency.objects.filter(worker__in=live_workers().values("name"))
                .values_list("worker", "model"))
    resident: dict[str, list[str]] = {}
    for worker, model in rows:
        if model:
            resident.setdefault(model, []).append(worker)
    swaps = ModelSwap.objects.aggregate(
        decided=Count("id", filter=Q(from_model__gt="")),
        loads=Count("id", filter=Q(from_model="")),
        done=Count("id", filter=Q(from_model__gt="", seconds__isnull=False)),
        seconds=Sum("seconds"), drain=Sum("drain_seconds"))
    demand = {d.model: d for d in model_demand(now)}
    models = {}
    for model in served_models():
        wanted = demand.get(model.id)
        waiting = (round(now.timestamp() - wanted.waiting_since, 1)
                   if wanted and wanted.requests and model.id not in resident else None)
        models[model.id] = {"resident_on": sorted(resident.get(model.id, [])),
                            "requests_open": wanted.requests if wanted else 0,
                            "waiting_seconds": waiting}
    return {"workers": len(rows), "swaps": swaps["decided"], "swaps_done": swaps["done"],
            "loads": swaps["loads"], "swap_seconds": round(swaps["seconds"] or 0.0, 1),
            "swap_hand_back_seconds": round(swaps["drain"] or 0.0, 1), "models": models}


def _multiplexing() -> dict | None:
    """residency_figures(), or None while no worker multiplexes and none ever swapped."""
    if not Residency.objects.exists() and not ModelSwap.objects.exists():
        return None
    return residency_figures()


def _model_figures(multiplexing: dict | None = None) -> dict:
    """Each served model's part of the figures (the top-level ones are the totals):
    its live workers, its SchedulingPool and its chunks waiting to run, and where
    workers multiplex, where it is resident and how long it has waited for a worker
    (`multiplexing`: residency_figures(), whose per-model part moves here)."""
    residency = multiplexing.pop("models") if multiplexing else {}
    holders = resident_on()
    by_model = {row["model"]: row for row in live_workers().values("model").annotate(
        workers=Count("name"), active=Sum("slots_active"), capacity=Sum("slots_capacity"),
        tokens=Sum("tokens_active"), budget=Sum("token_budget"))}
    waiting = dict(Chunk.objects.filter(status__in=[ChunkStatus.PENDING, ChunkStatus.QUEUED])
                   .values("model").annotate(requests=Sum("count"))
                   .values_list("model", "requests"))
    models = served_models()
    waiting[models[0].id] = waiting.get(models[0].id, 0) + waiting.pop("", 0)
    figures = []
    for model in models:
        row = by_model.get(model.id, {})
        active, capacity = row.get("active") or 0, row.get("capacity") or 0
        figures.append({
            "model": model.id,
            "workers": row.get("workers", 0),
            "requests_waiting": waiting.get(model.id) or 0,
            "scheduling_pool_active": active,
            "scheduling_pool_free": max(capacity - active, 0),
            "scheduling_pool_capacity": capacity,
            "scheduling_pool_tokens_active": row.get("tokens") or 0,
            "scheduling_pool_token_budget": row.get("budget"),
            "resident_on": holders.get(model.id, []),
            "waiting_seconds": residency.get(model.id, {}).get("waiting_seconds"),
        })
    return {"models": figures}
