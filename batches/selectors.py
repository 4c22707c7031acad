from __future__ import annotations

from django.db.models import QuerySet

from batches.models import ACTIVE_STATUSES, Batch


def batch_list(*, after: str | None, owner=None) -> QuerySet[Batch]:
    batches = Batch.objects.order_by("-id")
    if owner is not None:
        batches = batches.filter(owner=owner)
    if after:
        batches = batches.filter(id__lt=after)
    return batches


def file_in_active_use(*, file_id: str) -> bool:
    return Batch.objects.filter(status__in=ACTIVE_STATUSES, input_file_id=file_id).exists() or \
        Batch.objects.filter(status__in=ACTIVE_STATUSES, output_file_id=file_id).exists()
