from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from inference.models import Worker


def live_workers() -> QuerySet[Worker]:
    """Workers whose heartbeat is fresh and that did not say they stopped."""
    fresh = timezone.now() - timedelta(seconds=settings.BATCHGEN_WORKER_TTL_SECONDS)
    return Worker.objects.filter(heartbeat_at__gte=fresh, stopped_at__isnull=True)
