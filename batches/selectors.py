from __future__ import annotations

from datetime import date

from django.conf import settings
from django.core.cache import caches
from django.db.models import Count, Max, Q, QuerySet, Sum
from django.utils import timezone

from batches.intake import intake_reserved
from batches.models import ACTIVE_STATUSES, Batch, Chunk, ChunkStatus, LineError
from batches.residency import model_demand
from core.models import KeyUsage
from core.pagination import newest_first
from files.segments import Segment
from files.selectors import output_segments
from fleet.models import ModelSwap, Residency
from fleet.selectors import adaptive_concurrency, live_workers, resident_on
from serving.model_info import served_models


def output_stream(*, batch: Batch) -> list[Segment]:
    """On an object store, the batch's incremental output as segments read in order
    (files.segments): the counted ones while it runs, the composed output file once
    it is final (one segment)."""
    if batch.output_file_id is not None:
        return [Segment(batch.output_file.storage_name, batch.output_file.bytes)]
    return output_segments(batch_id=batch.id)


def batch_list(*, after: str | None, owner=None) -> QuerySet[Batch]:
    # Batches are never deleted, so a cursor an earlier page gave stays valid.
    return newest_first(Batch.objects.all(), after=after, owner=owner, kind="batch")


def batch_line_errors(*, batch: Batch, limit: int, after: int | None = None) -> dict:
    """One page of a batch's bad input lines, by line number: every one validation
    kept, where the batch object shows only the first few."""
    errors = LineError.objects.filter(batch_id=batch.id).order_by("line")
    if after is not None:
        errors = errors.filter(line__gt=after)
    rows = list(errors.values("code", "message", "line", "param")[:limit + 1])
    return {"object": "list", "data": rows[:limit], "has_more": len(rows) > limit,
            "total": batch.line_errors_total}


def file_in_active_use(*, file_id: str) -> bool:
    return Batch.objects.filter(status__in=ACTIVE_STATUSES, input_file_id=file_id).exists() or \
        Batch.objects.filter(status__in=ACTIVE_STATUSES, output_file_id=file_id).exists()


def key_usage_report(*, since: date, until: date | None = None,
                     key_name: str | None = None) -> list[dict]:
    """Per UTC day and API key name (keys sharing a name are summed), from `since` to
    `until` inclusive: requests completed and failed, and tokens. Ordered by day,
    then name."""
    rows = KeyUsage.objects.filter(day__gte=since)
    if until is not None:
        rows = rows.filter(day__lte=until)
    if key_name is not None:
        rows = rows.filter(key__name=key_name)
    figures = ("requests_completed", "requests_failed", "input_tokens", "cached_tokens",
               "output_tokens")
    report = []
    for row in (rows.order_by().values("day", "key__name")
                .annotate(**{f"sum_{f}": Sum(f) for f in figures})
                .order_by("day", "key__name")):
        entry = {"day": row["day"].isoformat(), "key": row["key__name"]}
        entry.update({f: row[f"sum_{f}"] or 0 for f in figures})
        entry["requests"] = entry["requests_completed"] + entry["requests_failed"]
        entry["total_tokens"] = entry["input_tokens"] + entry["output_tokens"]
        report.append(entry)
    return report


# --- the pool figures (/v1/pool/status, /metrics, the admin's dashboard) ---------------------


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


def residency_figures() -> dict:
    """Model multiplexing's figures (fleet/residency.py): the workers that
    multiplex, the swaps they made and what those cost, and for each model the workers
    it is resident on, its open requests and, while it is resident nowhere, how long
    it has waited."""
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
