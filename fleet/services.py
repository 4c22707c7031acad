"""What a worker does to its own fleet records: its heartbeat (Worker), and, where
it multiplexes, its Residency row and the swaps it made (ModelSwap). The worker runs
them through its one port to the database (inference/database.py:WorkerDatabase);
each touches the worker's own rows only."""

from __future__ import annotations

import os
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from core.transient import retry_transient
from fleet.models import ModelSwap, Residency, Worker


@retry_transient
def worker_heartbeat(*, name: str, hostname: str, engine: str, model: str, capacity: int,
                     active: int, tokens_active: int, token_budget: int | None, ready: bool,
                     completed: int, failed: int, tokens: int, storage_error: str = "",
                     held_chunks: list[int] | None = None,
                     chunk_tails: dict[str, list] | None = None,
                     admission: dict | None = None, max_context_length: int = 0,
                     work: tuple[float, int, int] = (0.0, 0, 0),
                     prompt_weight: float | None = None) -> None:
    """Record a worker's liveness, slots and counters, the chunks it holds, its
    engine's adaptive concurrency and context, and its engines' `work` (seconds busy,
    prompt tokens computed, tokens generated) and the `prompt_weight` its engine's
    steps tell, and where its engine is in each chunk (`chunk_tails`:
    Worker.chunk_tails) (its own row only)."""
    Worker.objects.update_or_create(
        name=name,
        defaults={"hostname": hostname, "pid": os.getpid(), "engine": engine, "model": model,
                  "slots_capacity": capacity, "slots_active": active, "ready": ready,
                  "tokens_active": tokens_active, "token_budget": token_budget,
                  "requests_completed": completed, "requests_failed": failed,
                  "tokens_generated": tokens, "storage_error": storage_error,
                  "held_chunks": sorted(held_chunks or ()), "admission": admission,
                  "chunk_tails": chunk_tails or {},
                  "max_context_length": max_context_length, "busy_seconds": work[0],
                  "prompt_tokens_computed": work[1], "tokens_computed": work[2],
                  "engine_prompt_weight": prompt_weight,
                  "heartbeat_at": timezone.now(), "stopped_at": None},
    )


@retry_transient
def worker_stopped(*, name: str) -> None:
    Worker.objects.filter(name=name).update(stopped_at=timezone.now(), slots_active=0,
                                            ready=False, storage_error="")



# --- multiplexing: the worker's Residency row and its swaps -----------------------------


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
