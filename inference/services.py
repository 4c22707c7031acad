"""Reaping dead workers at start-up: their Worker rows (fleet) and their chunks'
leases (batches.chunks) in one transaction. A worker's heartbeat, its own row, is
fleet.services.worker_heartbeat."""

from __future__ import annotations

import logging
import os

from django.db import transaction
from django.utils import timezone

from batches.chunks import chunks_expire_leases
from core.transient import retry_transient
from fleet.models import Worker

logger = logging.getLogger("batchgen.inference")


@retry_transient
def worker_reap_host(*, hostname: str, current: str, pid_alive) -> int:
    """At start-up: earlier workers of this host whose process is gone (a crash, a
    SIGKILL) are marked stopped and their chunks' leases expire now, so recovery
    requeues them at once instead of waiting out the lease."""
    dead = [
        w.name for w in Worker.objects.filter(hostname=hostname, stopped_at__isnull=True)
        .exclude(name=current)
        if w.pid == os.getpid() or not pid_alive(w.pid)
    ]
    if not dead:
        return 0
    with transaction.atomic():  # batches.locks: Worker rows, then Chunk rows
        Worker.objects.filter(name__in=dead).update(stopped_at=timezone.now(), slots_active=0,
                                                    ready=False)
        chunks_expire_leases(workers=dead)
    logger.warning("reaped %s dead worker(s) on %s: %s", len(dead), hostname, dead)
    return len(dead)
