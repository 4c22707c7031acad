"""The IntakePool's capacity: requests admitted and not yet finished.

A batch reserves capacity for all of its requests at once, or not at all; as its
requests finish, fail or are skipped, its own row's `intake_reserved` goes down. The
pool's size is the sum of `intake_reserved` over the batches, so giving capacity
back touches only the batch row a worker's progress flush updates anyway: there is
no global counter row for every worker to queue on.

Admissions serialise on the `admission` ControlLock. Releases take no lock and only
ever lower the sum, so a sum read under the lock may be a little high, never low:
admission can refuse a batch that would just fit, but never over-admits.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.db.models import F, Sum
from django.db.models.functions import Greatest

from batches.locks import lock_control
from batches.models import Batch, ControlLock


def intake_reserved() -> int:
    # A failed batch may still hold capacity for its running chunks: every holder
    # counts, found through a partial index of the few batches that hold any.
    held = (Batch.objects.filter(intake_reserved__gt=0)
            .aggregate(total=Sum("intake_reserved"))["total"])
    return held or 0


def intake_is_full() -> bool:
    return intake_reserved() >= settings.BATCHGEN_MAX_INTAKE_CAPACITY


def intake_reserve(*, batch_id: str, requests: int) -> bool:
    """Reserve capacity for `requests` more requests of a batch, all or none.
    Must run inside the caller's transaction, which holds the admission lock until
    it commits (the reservation is visible to the next admission only then)."""
    assert transaction.get_connection().in_atomic_block
    lock_control(ControlLock.ADMISSION)
    if intake_reserved() + requests > settings.BATCHGEN_MAX_INTAKE_CAPACITY:
        return False
    Batch.objects.filter(id=batch_id).update(intake_reserved=F("intake_reserved") + requests)
    return True


def intake_release(*, batch_id: str, requests: int | None = None) -> None:
    """Give back capacity of a batch: `requests` of it, or all it holds (None: it was
    cancelled, failed or expired). Never below zero, so a late release cannot
    double-count."""
    held = F("intake_reserved") - requests if requests is not None else 0
    Batch.objects.filter(id=batch_id, intake_reserved__gt=0).update(
        intake_reserved=Greatest(held, 0))
