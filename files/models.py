from __future__ import annotations

from django.db import models
from django.utils import timezone


class FilePurpose(models.TextChoices):
    BATCH = "batch"
    BATCH_OUTPUT = "batch_output"
    BATCH_ERROR = "batch_error"


class FileStatus(models.TextChoices):
    UPLOADED = "uploaded"
    PROCESSED = "processed"
    ERROR = "error"


class File(models.Model):
    """A file on the storage path. The row exists only once its bytes are complete."""

    id = models.CharField(primary_key=True, max_length=64)
    purpose = models.CharField(max_length=16, choices=FilePurpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.BigIntegerField()
    checksum = models.CharField(max_length=80)  # "sha256:<hex>"
    status = models.CharField(max_length=16, choices=FileStatus.choices,
                              default=FileStatus.UPLOADED)
    # Relative to the storage path, so the storage can move between hosts.
    storage_name = models.CharField(max_length=512)
    # Set by the services (not auto_now_add) so `expires_after` counts from the same instant.
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    # The API key that uploaded it (null on an open server or for the server's own).
    owner = models.ForeignKey("core.ApiKey", on_delete=models.SET_NULL, null=True,
                              blank=True, related_name="+")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["purpose", "id"])]

    def __str__(self) -> str:
        return f"{self.id} ({self.filename})"


class OutputSegment(models.Model):
    """One counted segment of a batch's incremental output on an object store
    (files/segments.py): recorded by the worker's flush in the transaction that
    counts its lines, under the batch row's lock, so the ids of a batch's segments
    are the order of its stream; `start_offset` is where it starts in that stream."""

    batch_id = models.CharField(max_length=64, db_index=True)
    chunk_id = models.BigIntegerField(db_index=True)
    name = models.CharField(max_length=512, unique=True)
    size = models.BigIntegerField()
    start_offset = models.BigIntegerField()

    def __str__(self) -> str:
        return self.name
