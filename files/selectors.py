from __future__ import annotations

from pathlib import Path

from django.db.models import QuerySet
from django.utils import timezone

from core.errors import NotFound
from core.ids import issued_at
from core.pagination import invalid_cursor
from files import backends
from files.models import File, OutputSegment
from files.segments import Segment


def visible_files(owner=None) -> QuerySet[File]:
    """The files a client may see: its own when it has an API key, all on an open server."""
    return File.objects.filter(owner=owner) if owner is not None else File.objects.all()


def file_get(*, file_id: str, owner=None) -> File:
    try:
        return visible_files(owner).get(id=file_id)
    except File.DoesNotExist:
        raise NotFound(f"No such file: {file_id}", param="file_id") from None


def file_list(*, purpose: str | None, order: str, after: str | None,
              owner=None) -> QuerySet[File]:
    files = visible_files(owner)
    if after and not _cursor_has_a_place(after, files):
        raise invalid_cursor(after, kind="file")
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


def _cursor_has_a_place(after: str, files: QuerySet[File]) -> bool:
    """Whether `after` is a position in the list: a file the caller sees, or the id of
    one deleted since (listing and deleting page by page is common: the id still sorts
    where the file was). An id that is no file id, or from the future, is none."""
    issued = issued_at(after, prefix="file-")
    if issued is not None and issued <= timezone.now():
        return True
    return files.filter(id=after).exists()


def file_bytes_path(*, file_id: str) -> Path | None:
    """Where a file's bytes are, or None when the file is gone: its row deleted, or
    its bytes removed from the storage path behind the server's back. On a bucket
    the bytes are downloaded once into this process's scratch area."""
    storage_name = File.objects.filter(id=file_id).values_list("storage_name", flat=True).first()
    if storage_name is None:
        return None
    return backends.current().local_path(storage_name)


def output_segments(*, batch_id: str, chunk_id: int | None = None) -> list[Segment]:
    """A batch's counted segments in stream order (or one chunk's): files.segments."""
    rows = OutputSegment.objects.filter(batch_id=batch_id)
    if chunk_id is not None:
        rows = rows.filter(chunk_id=chunk_id)
    return [Segment(name, size) for name, size in rows.order_by("id").values_list("name", "size")]
