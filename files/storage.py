"""Where file bytes live on the storage path, and the few file-system operations
every process needs (fsync'd renames, streamed hashing)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from django.conf import settings

READ_BLOCK = 1024 * 1024


def absolute(storage_name: str) -> Path:
    return settings.STORAGE_PATH / storage_name


def upload_name(file_id: str) -> str:
    return f"uploads/{file_id}.jsonl"


def incremental_name(batch_id: str) -> str:
    return f"incremental/{batch_id}.jsonl"


def order_name(batch_id: str) -> str:
    """The order file of a batch whose chunks are prefix-grouped (batches/chunking.py)."""
    return f"chunks/{batch_id}.order"


def input_path(storage_name: str) -> Path:
    """Where a worker reads an input file: the storage path itself, or on a bucket
    this host's own copy, downloaded once (files.backends). A file gone from either
    is the storage path's name, which the reader then finds missing."""
    from files import backends

    store = backends.current()
    if isinstance(store, backends.PathStorage):
        return absolute(storage_name)
    return store.local_path(storage_name) or absolute(storage_name)


def ensure_dirs() -> None:
    for path in (settings.UPLOADS_DIR, settings.INCREMENTAL_DIR, settings.RUN_DIR):
        path.mkdir(parents=True, exist_ok=True)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_of(path: Path) -> tuple[int, str]:
    """Size and sha256 of a file, read in bounded blocks."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while block := fh.read(READ_BLOCK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()
