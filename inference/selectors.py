from __future__ import annotations

import math
from datetime import timedelta

from django.conf import settings
from django.core.cache import caches
from django.db.models import Max, QuerySet, Sum
from django.utils import timezone

from batches.intake import intake_reserved
from batches.models import ACTIVE_STATUSES, Batch
from inference.models import Worker


def live_workers() -> QuerySet[Worker]:
    """Workers whose heartbeat is fresh and that did not say they stopped."""
    fresh = timezone.now() - timedelta(seconds=settings.BATCHGEN_WORKER_TTL_SECONDS)
    return Worker.objects.filter(heartbeat_at__gte=fresh, stopped_at__isnull=True)


def dispatch_window() -> int:
    """Chunks to keep dispatched but unclaimed: what the live workers' chunk threads
    can hold (see inference.signals.inference_concurrency), plus a little slack."""
    window = 0
    for capacity in live_workers().values_list("slots_capacity", flat=True):
        window += math.ceil(capacity / settings.BATCHGEN_CHUNK_SIZE) + 2
    return window + 2


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
