"""The IntakePool's capacity: requests admitted and not yet finished.

A batch reserves capacity for all of its requests at once, under a lock on the
single IntakePool row, or not at all; as requests finish, fail or are skipped the
capacity returns. The batch row mirrors what it still holds (`intake_reserved`) so a
cancelled or expired batch can give back exactly its remainder.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Greatest

from batches.models import Batch, IntakePool


def _locked_pool() -> IntakePool:
    pool, _ = IntakePool.objects.select_for_update().get_or_create(id=1)
    return pool


def intake_reserved() -> int:
    pool = IntakePool.objects.filter(id=1).values_list("reserved", flat=True).first()
    return pool or 0


def intake_is_full() -> bool:
    return intake_reserved() >= settings.BATCHGEN_MAX_INTAKE_CAPACITY


def intake_reserve(*, batch_id: str, requests: int) -> bool:
    """Reserve capacity for `requests` more requests of a batch, all or none.
    Must run inside the caller's transaction."""
    assert transaction.get_connection().in_atomic_block
    pool = _locked_pool()
    if pool.reserved + requests > settings.BATCHGEN_MAX_INTAKE_CAPACITY:
        return False
    IntakePool.objects.filter(id=1).update(reserved=F("reserved") + requests)
    Batch.objects.filter(id=batch_id).update(intake_reserved=F("intake_reserved") + requests)
    return True


def intake_release(*, batch_id: str, requests: int | None = None) -> int:
    """Return capacity as requests of a batch finish, fail or are skipped; None
    returns all the batch still holds (it was cancelled, failed or expired). Never
    returns more than the batch holds, so late releases cannot double-count."""
    with transaction.atomic():
        _locked_pool()
        held = Batch.objects.filter(id=batch_id).values_list("intake_reserved", flat=True).first()
        take = min(held or 0, held or 0 if requests is None else requests)
        if take > 0:
            IntakePool.objects.filter(id=1).update(reserved=Greatest(F("reserved") - take, 0))
            Batch.objects.filter(id=batch_id).update(intake_reserved=F("intake_reserved") - take)
        return take
