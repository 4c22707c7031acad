"""`client.files`: OpenAI's /v1/files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from batchgen.pagination import CursorPage
from batchgen.resources._base import Resource
from batchgen.types import FileDeleted, FileObject


@dataclass(frozen=True)
class BinaryContent:
    """A file's bytes (`files.content`); `files.download` streams a big one to disk."""

    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8")

    def write_to_file(self, path: str | Path) -> None:
        Path(path).write_bytes(self.content)


class Files(Resource):
    def create(self, file: str | Path | IO[bytes], purpose: str = "batch", *,
               expires_after: Mapping[str, Any] | None = None) -> FileObject:
        """Upload a JSONL file: a path (streamed from disk) or a binary file object.
        `expires_after`: `{"anchor": "created_at", "seconds": N}`, as OpenAI's."""
        seconds = None
        if expires_after is not None:
            if expires_after.get("anchor", "created_at") != "created_at":
                raise ValueError("expires_after's only anchor is 'created_at'")
            seconds = int(expires_after["seconds"])
        return FileObject.construct(
            self._client.upload_file(file, purpose, expires_after_seconds=seconds))

    def retrieve(self, file_id: str) -> FileObject:
        return FileObject.construct(self._client.get_file(file_id))

    def list(self, *, purpose: str | None = None, limit: int | None = None,
             order: str | None = None, after: str | None = None) -> CursorPage[FileObject]:
        def fetch(cursor: str | None) -> CursorPage[FileObject]:
            page = self._client.list_files(purpose=purpose, limit=limit, order=order, after=cursor)
            return CursorPage.build(page, FileObject, fetch)

        return fetch(after)

    def delete(self, file_id: str) -> FileDeleted:
        return FileDeleted.construct(self._client.delete_file(file_id))

    def content(self, file_id: str) -> BinaryContent:
        """The whole file in memory; prefer `download` for a big one."""
        return BinaryContent(self._client.download_file_content(file_id))

    def download(self, file_id: str, path: str | Path) -> Path:
        """Stream the file to `path` (never left holding a partial download)."""
        return self._client.download_to(file_id, path)
