"""A Django upload handler that streams the multipart `file` part straight into the
storage path, computing its size and sha256 as the bytes pass.

Memory stays flat whatever the upload size: Django hands us 64 KiB pieces and we
keep none of them. The bytes land in `uploads/.partial-*`; `files.services.file_upload`
renames them into place and only then writes the File row. Whatever happens
(too large, compressed, client gone, bad form), `discard()` removes an unclaimed
partial file. A compressed file is refused by its first bytes, before the rest is
read (files.formats).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler

from core.errors import PayloadTooLarge
from files.formats import MAGIC_BYTES, check_not_compressed
from files.storage import ensure_dirs


def too_large_error() -> PayloadTooLarge:
    limit = settings.BATCHGEN_MAX_UPLOAD_BYTES
    return PayloadTooLarge(
        f"File is larger than the server's limit of {limit} bytes "
        "(BATCHGEN_MAX_UPLOAD_BYTES).",
        param="file",
    )


class StreamedUpload(UploadedFile):
    """The upload as it sits on disk: path, size and checksum already known."""

    def __init__(self, *, path: Path, name: str, size: int, sha256: str, content_type: str):
        super().__init__(file=None, name=name, content_type=content_type, size=size)
        self.path = path
        self.sha256 = sha256

    def open(self, mode="rb"):  # noqa: D102 - only used by tools that want the bytes
        self.file = self.path.open(mode)
        return self

    def close(self):
        if self.file is not None:
            self.file.close()


class StreamingUploadHandler(FileUploadHandler):
    chunk_size = 1024 * 1024

    def __init__(self, request=None):
        super().__init__(request)
        self.partials: list[Path] = []
        self.claimed: set[Path] = set()
        self.file = None

    def new_file(self, *args, **kwargs):
        super().new_file(*args, **kwargs)
        ensure_dirs()
        path = settings.UPLOADS_DIR / f".partial-{uuid.uuid4().hex}"
        self.partials.append(path)
        self.file = path.open("wb")
        self._hash = hashlib.sha256()
        self._size = 0
        self._head = b""

    def receive_data_chunk(self, raw_data, start):
        self._size += len(raw_data)
        if self._size > settings.BATCHGEN_MAX_UPLOAD_BYTES:
            raise too_large_error()
        if len(self._head) < MAGIC_BYTES:  # the first piece, or the few after a tiny one
            self._head += raw_data[:MAGIC_BYTES - len(self._head)]
            check_not_compressed(self._head)
        self._hash.update(raw_data)
        self.file.write(raw_data)
        return None

    def file_complete(self, file_size):
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        return StreamedUpload(
            path=self.partials[-1],
            name=self.file_name,
            size=self._size,
            sha256=self._hash.hexdigest(),
            content_type=self.content_type,
        )

    def upload_interrupted(self):
        self.discard()

    def claim(self, path: Path) -> None:
        """The service moved this partial into place: do not delete it."""
        self.claimed.add(path)

    def discard(self) -> None:
        if self.file is not None and not self.file.closed:
            try:
                self.file.close()
            except OSError:
                # A full volume: closing fails to flush what the file still buffers
                # (it is closed all the same). Those bytes are being thrown away.
                pass
        for path in self.partials:
            if path not in self.claimed:
                path.unlink(missing_ok=True)
