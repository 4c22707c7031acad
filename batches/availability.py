"""Batches waiting for a model that nothing runs: said on the batch, then failed.

A model none of whose inference workers has its engine ready (an engine that cannot
start with its settings, a GPU host that is down) leaves the chunks of its batches
queued. Without this a batch sat `in_progress` at 0/N for its whole 24 h window with
nothing telling its user why. The control worker's beat runs
`batches_watch_models` every few seconds: a running batch with open chunks of such a
model shows `error: {code: "model_unavailable", ...}` while it waits (as a batch held
up by a full storage volume shows `storage_full`), the error clears when a worker of
the model is ready again, and once the model has been unavailable to the batch for
BATCHGEN_MODEL_UNAVAILABLE_SECONDS the batch fails with `model_unavailable` through
`batch_fail`: queued chunks skipped and their intake capacity returned, what was
written kept as its output, as when its window passes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from django.conf import settings

from batches.chunks import OPEN_CHUNKS
from batches.dispatch import chunk_model
from batches.models import Batch, BatchStatus, Chunk
from batches.services import batch_fail
from core.transient import retry_transient
from fleet import selectors as fleet_selectors

logger = logging.getLogger("batchgen.batches")

MODEL_UNAVAILABLE = "model_unavailable"


def _waiting_message(models: list[str], since: float) -> str:
    bound = settings.BATCHGEN_MODEL_UNAVAILABLE_SECONDS
    names = ", ".join(models)
    deadline = datetime.fromtimestamp(since + bound, UTC).strftime("%Y-%m-%d %H:%M:%S")
    then = (f" If none is ready by {deadline} UTC, the batch fails with {MODEL_UNAVAILABLE}, "
            "keeping the results written so far." if bound > 0 else "")
    return (f"No inference worker of model {names} is running with its engine ready, so "
            f"this batch's requests for it wait.{then} The server's log and /health say why.")


def _failed_message(models: list[str]) -> str:
    return (f"No inference worker of model {', '.join(models)} was ready for "
            f"{settings.BATCHGEN_MODEL_UNAVAILABLE_SECONDS:g} s "
            "(BATCHGEN_MODEL_UNAVAILABLE_SECONDS), so the batch failed; the results written "
            "so far are kept. The server's log and /health say why the model does not run.")


# Where workers multiplex (fleet/residency.py), a batch whose model is resident on no
# worker now waits for the scheduler, within its bound, and never fails for it.
NOT_RESIDENT = "model_not_resident"


def _not_resident_message(models: list[str]) -> str:
    return (f"Model {', '.join(models)} is not loaded on an inference worker now: the "
            "workers serve the models by turns, and this batch's requests for it wait "
            f"until one loads it, within {settings.BATCHGEN_MAX_MODEL_WAIT_SECONDS:g} s "
            "(BATCHGEN_MAX_MODEL_WAIT_SECONDS).")


def batches_waiting_for_models(source: Callable[[], list[str]] | None = None
                               ) -> dict[str, list[str]]:
    """Running batches with open chunks of a model that has no ready worker (or, with
    `source`, of the models it names): batch id -> those models."""
    unavailable = (source or fleet_selectors.models_without_ready_worker)()
    if not unavailable:
        return {}
    names = set(unavailable) | {""}  # blank: chunks of the default model
    waiting: dict[str, set[str]] = {}
    for batch_id, model in (Chunk.objects.filter(
            status__in=OPEN_CHUNKS, model__in=names, batch__status=BatchStatus.IN_PROGRESS)
            .values_list("batch_id", "model").distinct()):
        if chunk_model(model) in unavailable:
            waiting.setdefault(batch_id, set()).add(chunk_model(model))
    return {batch_id: sorted(models) for batch_id, models in waiting.items()}


def _show_not_resident() -> None:
    """Say on each running batch that waits for its model to be loaded that it does,
    and clear it once the model is resident (or the batch waits for nothing)."""
    waiting = batches_waiting_for_models(fleet_selectors.models_not_resident)
    Batch.objects.filter(status=BatchStatus.IN_PROGRESS, error__code=NOT_RESIDENT).exclude(
        id__in=list(waiting)).update(error=None)
    for batch_id, models in waiting.items():
        Batch.objects.filter(id=batch_id, status=BatchStatus.IN_PROGRESS,
                             error__isnull=True).update(
            error={"code": NOT_RESIDENT, "message": _not_resident_message(models)})


@retry_transient
def batches_watch_models() -> int:
    """Show, clear, or (after the bound) fail the wait of each running batch for a
    model nothing runs. Returns how many batches failed. Reads only, when no model
    is unavailable and no batch shows the wait."""
    _show_not_resident()
    waiting = batches_waiting_for_models()
    shown = Batch.objects.filter(status=BatchStatus.IN_PROGRESS, error__code=MODEL_UNAVAILABLE)
    resumed = shown.exclude(id__in=list(waiting))
    if resumed.exists():
        for batch_id in resumed.values_list("id", flat=True):
            logger.info("batch %s: its model has a ready inference worker again", batch_id)
        resumed.update(error=None)
    now, bound, failed = time.time(), settings.BATCHGEN_MODEL_UNAVAILABLE_SECONDS, 0
    for batch in Batch.objects.filter(id__in=list(waiting)).only("id", "status", "error"):
        models = waiting[batch.id]
        error = batch.error or {}
        if not error:
            # The wait's start rides in the error (the API shows its code and message
            # only): when it began is what bounds it.
            updated = Batch.objects.filter(id=batch.id, status=BatchStatus.IN_PROGRESS,
                                           error__isnull=True).update(error={
                "code": MODEL_UNAVAILABLE, "message": _waiting_message(models, now),
                "since": now})
            if updated:
                logger.warning("batch %s waits for model %s: no inference worker of it is "
                               "ready", batch.id, ", ".join(models))
        elif error.get("code") == MODEL_UNAVAILABLE and bound > 0 and (
                now - error.get("since", now) >= bound):
            if batch_fail(batch_id=batch.id, code=MODEL_UNAVAILABLE,
                          message=_failed_message(models)):
                failed += 1
    return failed
