from __future__ import annotations

from django.db.models import QuerySet

from batchgen_site.errors import NotFound
from files.models import File


def file_get(*, file_id: str) -> File:
    try:
        return File.objects.get(id=file_id)
    except File.DoesNotExist:
        raise NotFound(f"No such file: {file_id}", param="file_id") from None


def file_list(*, purpose: str | None, order: str, after: str | None) -> QuerySet[File]:
    files = File.objects.all()
    if purpose:
        files = files.filter(purpose=purpose)
    if order == "asc":
        files = files.order_by("id")
        if after:
            files = files.filter(id__gt=after)
    else:
        files = files.order_by("-id")
        if after:
            files = files.filter(id__lt=after)
    return files
