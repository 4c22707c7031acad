from __future__ import annotations

from django.db.models import QuerySet

from batches.models import ACTIVE_STATUSES, Batch, LineError
from batchgen_site.pagination import newest_first


def batch_list(*, after: str | None, owner=None) -> QuerySet[Batch]:
    # Batches are never deleted, so a cursor an earlier page gave stays valid.
    return newest_first(Batch.objects.all(), after=after, owner=owner, kind="batch")


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
