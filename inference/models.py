from __future__ import annotations

from django.db import models


class Worker(models.Model):
    """An inference worker's heartbeat: its slots feed /v1/pool/status, its
    liveness /health. One row per worker process, refreshed every few seconds."""

    name = models.CharField(primary_key=True, max_length=255)  # Celery node name + pid
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    engine = models.CharField(max_length=32)
    model = models.CharField(max_length=255)
    slots_capacity = models.IntegerField()
    slots_active = models.IntegerField(default=0)
    # Length-aware admission: estimated tokens inside the engine, and the cap.
    tokens_active = models.BigIntegerField(default=0)
    token_budget = models.BigIntegerField(null=True, blank=True)
    ready = models.BooleanField(default=False)  # engine started
    requests_completed = models.BigIntegerField(default=0)
    requests_failed = models.BigIntegerField(default=0)
    tokens_generated = models.BigIntegerField(default=0)
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField(db_index=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    # Why it cannot write results now (the storage volume full), or empty: shown
    # by /health and /v1/pool/status while its chunks wait for room.
    storage_error = models.TextField(blank=True, default="")
    # The chunks it holds, as of its heartbeat: claimed and running, and queued ones
    # whose message it has taken from the broker but not started (prefetched).
    # Recovery counts these as present, not lost by the broker (batches.recovery).
    held_chunks = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return self.name
