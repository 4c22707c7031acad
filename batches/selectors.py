from __future__ import annotations

from django.conf import settings
from django.core.cache import caches
from django.db.models import Max, QuerySet, Sum

from batches.intake import intake_reserved
from batches.models import ACTIVE_STATUSES, Batch, LineError
from batchgen_site.pagination import invalid_cursor
from inference.selectors import live_workers


def batch_list(*, after: str | None, owner=None) -> QuerySet[Batch]:
    batches = Batch.objects.order_by("-id")
    if owner is not None:
        batches = batches.filter(owner=owner)
    if after:
        # Batches are never deleted, so a cursor an earlier page gave stays valid.
        if not batches.filter(id=after).exists():
            raise invalid_cursor(after, kind="batch")
        batches = batches.filter(id__lt=after)
    return batches


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
    return {
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
    }
