"""`client.batches`: OpenAI's /v1/batches, with BatchGen's batch options, the list of
bad input lines, and the waits of the guide (`wait`, `results`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from batchgen.errors import BatchFailedError, WaitTimeoutError
from batchgen.pagination import BatchErrorPage, CursorPage
from batchgen.resources._base import Resource
from batchgen.types import Batch, BatchError


class Batches(Resource):
    def create(
        self,
        *,
        input_file_id: str,
        endpoint: str = "/v1/chat/completions",
        completion_window: str = "24h",
        metadata: dict[str, str] | None = None,
        output_expires_after: Mapping[str, Any] | None = None,
        max_decoding_length: int | None = None,
        max_context_length: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
    ) -> Batch:
        """Create a batch over an uploaded file; options left None take the server's
        defaults. `output_expires_after`: `{"anchor": "created_at", "seconds": N}`."""
        seconds = None
        if output_expires_after is not None:
            if output_expires_after.get("anchor", "created_at") != "created_at":
                raise ValueError("output_expires_after's only anchor is 'created_at'")
            seconds = int(output_expires_after["seconds"])
        return Batch.construct(self._client.create_batch(
            input_file_id, endpoint=endpoint, completion_window=completion_window,
            metadata=metadata, max_decoding_length=max_decoding_length,
            max_context_length=max_context_length, temperature=temperature, top_p=top_p,
            top_k=top_k, output_expires_after_seconds=seconds,
        ))

    def retrieve(self, batch_id: str) -> Batch:
        return Batch.construct(self._client.get_batch(batch_id))

    def list(self, *, limit: int | None = None, after: str | None = None) -> CursorPage[Batch]:
        """Newest first; iterating the page walks every later page too."""
        def fetch(cursor: str | None) -> CursorPage[Batch]:
            return CursorPage.build(self._client.list_batches(limit=limit, after=cursor),
                                    Batch, fetch)

        return fetch(after)

    def cancel(self, batch_id: str) -> Batch:
        return Batch.construct(self._client.cancel_batch(batch_id))

    def errors(self, batch_id: str, *, limit: int | None = None,
               after: int | None = None) -> BatchErrorPage[BatchError]:
        """A failed batch's bad input lines by line number (`after`: a line number);
        iterating the page walks all of them (the batch shows only the first 100)."""
        def fetch(cursor: int | None) -> BatchErrorPage[BatchError]:
            page = self._client.list_batch_errors(batch_id, limit=limit, after=cursor)
            return BatchErrorPage.build(page, BatchError, fetch)

        return fetch(after)

    def wait(self, batch_id: str, *, poll_interval: float = 5.0, timeout: float | None = None,
             progress: bool = False) -> Batch:
        """Poll until the batch finishes; raises as `client.wait_for_batch`
        (BatchFailedError, WaitTimeoutError), whose `batch` is then a `Batch` too."""
        try:
            return Batch.construct(
                self._client.wait_for_batch(batch_id, poll_interval, timeout, progress))
        except (BatchFailedError, WaitTimeoutError) as exc:
            if isinstance(exc.batch, dict):
                exc.batch = Batch.construct(exc.batch)
            raise

    def results(self, batch: str | Mapping[str, Any], *,
                include_errors: bool = True) -> Iterator[dict]:
        """A finished batch's result lines (its id or object), streamed: output file,
        then error file unless `include_errors=False`."""
        return self._client.iter_results(batch, include_errors)
