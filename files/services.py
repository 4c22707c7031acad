"""File services: upload, delete, output registration, purge."""

from __future__ import annotations

import logging
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.errors import BatchGenError, Conflict, NotFound, StorageFull, StorageUnreachable
from core.ids import new_id
from core.outage import OBJECT_STORE, outage_began
from files import backends, storage
from files.models import File, FilePurpose, FileStatus
from files.signals import file_in_use
from files.upload import StreamedUpload

logger = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")


def sanitize_filename(name: str | None) -> str:
    """The name shown back to the user: the last path component, without control
    characters. The bytes are stored under the file id, never under this name."""
    name = unicodedata.normalize("NFC", name or "")
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = _UNSAFE.sub("", name).strip()
    if name in ("", ".", ".."):
        name = "upload.jsonl"
    return name[:255]


def file_upload(*, upload: StreamedUpload, purpose: str, owner=None,
                expires_after_seconds: int | None = None) -> File:
    """Move a fully streamed upload into place and record it. The row is created
    only after the bytes are durable under their final name. `expires_after_seconds`
    (the client's `expires_after`, anchored at creation) replaces the server's
    default expiry."""
    if purpose != FilePurpose.BATCH:
        raise BatchGenError(
            f"Invalid purpose {purpose!r}: uploads must have purpose 'batch'.", param="purpose"
        )
    if upload.size == 0:
        raise BatchGenError("The uploaded file is empty.", param="file", code="empty_file")
    file_id = new_id("file-")
    name = storage.upload_name(file_id)
    store = backends.current()
    try:
        store.put_file(name, upload.path)
    except backends.StorageUnavailable as exc:
        raise storage_unavailable(exc) from None
    now = timezone.now()
    try:
        return File.objects.create(
            id=file_id,
            created_at=now,
            purpose=purpose,
            filename=sanitize_filename(upload.name),
            bytes=upload.size,
            checksum=f"sha256:{upload.sha256}",
            status=FileStatus.UPLOADED,
            storage_name=name,
            expires_at=_expiry(now, expires_after_seconds),
            owner=owner,
        )
    except Exception:
        store.delete(name)
        raise


def storage_unavailable(error: BaseException) -> StorageFull:
    """The object store refused or did not answer: the client may retry later (507,
    as when the storage path is full), and the outage is said once (core.outage)."""
    outage_began(OBJECT_STORE, error)
    return StorageFull(f"The file store is unavailable ({error}); try again shortly.")


def _expiry(created_at, expires_after_seconds: int | None = None):
    """The client's own expiry if it gave one, else the server's default (none if
    BATCHGEN_FILE_EXPIRY_DAYS is 0)."""
    if expires_after_seconds is not None:
        return created_at + timedelta(seconds=expires_after_seconds)
    days = settings.BATCHGEN_FILE_EXPIRY_DAYS
    return created_at + timedelta(days=days) if days > 0 else None


def file_register_output(*, batch_id: str, owner=None, size: int | None = None,
                         digest: str | None = None,
                         expires_after_seconds: int | None = None) -> File:
    """Register a batch's incremental file as its output file (it is the same file).
    A caller that read the file already passes its size and sha256; the batch's
    `output_expires_after` counts from now, when the file is registered."""
    name = storage.incremental_name(batch_id)
    if isinstance(backends.current(), backends.PathStorage):
        path = storage.absolute(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
        if size is None or digest is None:
            size, digest = storage.sha256_of(path)
    elif size is None or digest is None:  # composed by batches' finalization
        with backends.current().open(name) as stream:
            size, digest = backends.sha256_of_stream(stream)
    now = timezone.now()
    return File.objects.create(
        id=new_id("file-"),
        created_at=now,
        purpose=FilePurpose.BATCH_OUTPUT,
        filename=f"{batch_id}_output.jsonl",
        bytes=size,
        checksum=f"sha256:{digest}",
        status=FileStatus.PROCESSED,
        storage_name=name,
        expires_at=_expiry(now, expires_after_seconds),
        owner=owner,
    )


def file_download_url(*, file: File) -> str | None:
    """Where to redirect a download (BATCHGEN_S3_PRESIGNED_DOWNLOADS on a bucket): a
    presigned URL of the object; None to stream it through this process."""
    store = backends.current()
    if not (settings.BATCHGEN_S3_PRESIGNED_DOWNLOADS and isinstance(store, backends.S3Storage)):
        return None
    try:
        return store.presigned_url(file.storage_name, filename=file.filename)
    except backends.StorageUnavailable as exc:  # signing is local: credentials missing
        outage_began(OBJECT_STORE, exc)
        raise StorageUnreachable(f"The file store is unavailable ({exc}); try again "
                                 "shortly.") from None


def file_open(*, file: File):
    """A readable stream of the file's bytes, wherever they are kept."""
    try:
        return backends.current().open(file.storage_name)
    except FileNotFoundError:
        raise NotFound(f"The bytes of file {file.id} are gone from storage.",
                       param="file_id") from None
    except backends.StorageUnavailable as exc:
        outage_began(OBJECT_STORE, exc)
        raise StorageUnreachable(f"The file store is unavailable ({exc}); try again "
                                 "shortly.") from None


def file_lock(*, file_id: str) -> File | None:
    """The file's row, locked until the caller's transaction ends, or None when the
    file is gone. Batch creation and file deletion both take this lock first, so the
    two are serialised on one file: whichever comes second sees the other's result
    (the file deleted, or an active batch using it). Select-for-update is a no-op on
    SQLite, where every transaction takes the database's write lock up front
    (`transaction_mode: IMMEDIATE`) and serialises the two all the same."""
    assert transaction.get_connection().in_atomic_block
    return File.objects.select_for_update().filter(id=file_id).first()


def file_delete(*, file: File) -> None:
    """Delete a file and its bytes; refused while an active batch reads or writes it.
    A file deleted by a concurrent call is a 404, as if it had never been there."""
    name = file.storage_name
    with transaction.atomic():
        if file_lock(file_id=file.id) is None:
            raise NotFound(f"No such file: {file.id}", param="file_id")
        if file_in_use(file_id=file.id):  # asks the batches app (files.signals)
            raise Conflict(
                f"File {file.id} is used by an active batch; cancel or wait for it first.",
                param="file_id", code="file_in_use",
            )
        file.delete()
        transaction.on_commit(lambda: _delete_bytes(name))
    logger.info("file deleted file_id=%s", file.id)


def _delete_bytes(name: str) -> None:
    """After the row is gone: an object store that is down leaves an orphan object,
    which `manage.py storage_sweep`-style cleanup may find later; the user's delete
    has succeeded either way."""
    try:
        backends.current().delete(name)
    except backends.StorageUnavailable as exc:
        outage_began(OBJECT_STORE, exc)
        logger.warning("file bytes not deleted name=%s: %s", name, exc)


def files_purge(*, older_than: timedelta | None = None) -> int:
    """Delete files past their expiry (or older than `older_than`) that no active
    batch uses, plus partial uploads a crashed web process left behind."""
    now = timezone.now()
    if older_than is None:
        candidates = File.objects.filter(expires_at__lt=now)
    else:
        candidates = File.objects.filter(created_at__lt=now - older_than)
    deleted = 0
    for file in candidates.iterator():
        try:
            file_delete(file=file)
            deleted += 1
        except (Conflict, NotFound):  # in use, or deleted meanwhile by someone else
            continue
    cutoff = now.timestamp() - 24 * 3600
    if settings.UPLOADS_DIR.exists():
        for partial in settings.UPLOADS_DIR.glob(".partial-*"):
            if partial.stat().st_mtime < cutoff:
                partial.unlink(missing_ok=True)
    return deleted


@dataclass
class MoveReport:
    moved: int = 0
    moved_bytes: int = 0
    already_there: int = 0
    missing: list[str] = field(default_factory=list)  # file ids whose bytes are gone


def files_move_to_store(*, url: str, dry_run: bool = False) -> MoveReport:
    """Move every file's bytes from the storage path to the store `url` names
    (`s3://bucket/prefix`), under the same storage names, so the File rows stay as
    they are. Each file is uploaded (multipart, streamed) before its local copy is
    removed, so an interrupted move loses nothing: run it again and it goes on. Run
    it with the server stopped, then start the server with BATCHGEN_STORAGE_URL=url."""
    source = backends.PathStorage(settings.STORAGE_PATH)
    target = backends.backend_for(url)
    report = MoveReport()
    for file_id, name, size in File.objects.order_by("id").values_list(
            "id", "storage_name", "bytes").iterator():
        local = source.local_path(name)
        if local is None:
            if target.exists(name):
                report.already_there += 1
            else:
                report.missing.append(file_id)
            continue
        if not dry_run:
            target.put_file(name, local)
        report.moved += 1
        report.moved_bytes += size
    return report
