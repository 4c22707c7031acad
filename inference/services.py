"""Worker heartbeats and reaping: the database side of the SchedulingPool's
membership. The chunk accounting the workers do lives with the Chunk model
(batches.chunks); this app depends on it, never the reverse."""

from __future__ import annotations

import logging
import os

from django.db import transaction
from django.utils import timezone

from batches.chunks import chunks_expire_leases
from core.transient import retry_transient
from inference.models import Worker

logger = logging.getLogger("batchgen.inference")


@retry_transient
def worker_heartbeat(*, name: str, hostname: str, engine: str, model: str, capacity: int,
                     active: int, tokens_active: int, token_budget: int | None, ready: bool,
                     completed: int, failed: int, tokens: int, storage_error: str = "",
                     held_chunks: list[int] | None = None,
                     admission: dict | None = None) -> None:
    """Record a worker's liveness, slots and counters, the chunks it holds and its
    engine's adaptive concurrency (its own row only)."""
    Worker.objects.update_or_create(
        name=name,
        defaults={"hostname": hostname, "pid": os.getpid(), "engine": engine, "model": model,
                  "slots_capacity": capacity, "slots_active": active, "ready": ready,
                  "tokens_active": tokens_active, "token_budget": token_budget,
                  "requests_completed": completed, "requests_failed": failed,
                  "tokens_generated": tokens, "storage_error": storage_error,
                  "held_chunks": sorted(held_chunks or ()), "admission": admission,
                  "heartbeat_at": timezone.now(), "stopped_at": None},
    )


@retry_transient
def worker_stopped(*, name: str) -> None:
    Worker.objects.filter(name=name).update(stopped_at=timezone.now(), slots_active=0,
                                            ready=False, storage_error="")


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
