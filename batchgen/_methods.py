"""The dict methods of the user's guide (docs/client.md), per resource, which
batchgen.batchgen_client.BatchGenHttpClient composes: files, batches (and the wait
for one), results (whole or as they come) and webhook endpoints. Each answers the
server's JSON as a plain dict; the typed resources are in batchgen.resources."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO

import httpx

from batchgen import _clock
from batchgen._base_client import BaseClient, json_of, without_none
from batchgen._jsonl import parse_line, parse_lines, split_lines
from batchgen._progress import BatchProgress
from batchgen.errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    BatchFailedError,
    BatchGenError,
    NoOutputError,
    ServerError,
    WaitTimeoutError,
)

DEFAULT_ENDPOINT = "/v1/chat/completions"
# Statuses after which a batch never changes again.
FAILED_STATUSES = frozenset({"failed", "cancelled", "expired"})
TERMINAL_STATUSES = FAILED_STATUSES | {"completed"}

# How long a wait keeps polling through an unreachable or unavailable server.
_POLL_OUTAGE_S = 120.0
_TRANSIENT_STATUSES = frozenset({502, 503, 504})

PathLike = str | os.PathLike[str]
logger = logging.getLogger("batchgen")


class FileMethods(BaseClient):
    # -- files -------------------------------------------------------------------------

    def upload_file(self, path: PathLike | IO[bytes], purpose: str = "batch", *,
                    expires_after_seconds: int | None = None) -> dict:
        """Upload a JSONL file (streamed from disk) and return the File object.
        `path` may also be an open binary file (sent from where it stands).
        `expires_after_seconds`: the file expires that long after its upload (OpenAI's
        `expires_after` anchored at `created_at`), instead of the server's default."""
        if hasattr(path, "read"):
            return self._upload_stream(path, purpose, expires_after_seconds)
        path = Path(path)
        fields = _upload_fields(purpose, expires_after_seconds)

        def attempt() -> httpx.Response:
            # Reopened on every attempt so a retried upload sends the whole file.
            with path.open("rb") as fh:
                return self._http.post(
                    "/v1/files",
                    data=fields,
                    files={"file": (path.name, fh, "application/jsonl")},
                )

        return json_of(self._send(attempt))

    def _upload_stream(self, fh: IO[bytes], purpose: str,
                       expires_after_seconds: int | None) -> dict:
        fields = _upload_fields(purpose, expires_after_seconds)
        start = fh.tell() if fh.seekable() else None
        name = Path(getattr(fh, "name", None) or "input.jsonl").name

        def attempt() -> httpx.Response:
            if start is not None:  # a retried upload sends the whole file again
                fh.seek(start)
            return self._http.post("/v1/files", data=fields,
                                   files={"file": (name, fh, "application/jsonl")})

        return json_of(self._send(attempt))

    def get_file(self, file_id: str) -> dict:
        return self._json("GET", f"/v1/files/{file_id}")

    def list_files(
        self,
        purpose: str | None = None,
        limit: int | None = None,
        order: str | None = None,
        after: str | None = None,
    ) -> dict:
        params = without_none(purpose=purpose, limit=limit, order=order, after=after)
        return self._json("GET", "/v1/files", params=params)

    def delete_file(self, file_id: str) -> dict:
        return self._json("DELETE", f"/v1/files/{file_id}")

    def download_file_content(self, file_id: str) -> bytes:
        """The whole file in memory; prefer `download_to` or `iter_results` for big ones."""
        return self._send(lambda: self._http.get(f"/v1/files/{file_id}/content")).content

    def download_to(self, file_id: str, path: PathLike) -> Path:
        """Stream a file to `path`. It is written beside the target under a temporary
        name and renamed at the end, so `path` never holds a partial download."""
        target = Path(path)
        with self._stream("GET", f"/v1/files/{file_id}/content") as response:
            partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
            try:
                with partial.open("xb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
                os.replace(partial, target)
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
        return target



class BatchMethods(BaseClient):
    def create_batch(
        self,
        input_file_id: str,
        endpoint: str = DEFAULT_ENDPOINT,
        completion_window: str = "24h",
        metadata: dict[str, str] | None = None,
        max_decoding_length: int | None = None,
        max_context_length: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        *,
        output_expires_after_seconds: int | None = None,
    ) -> dict:
        """Create a batch over an uploaded file. Optional settings left as None are
        not sent, so the server defaults apply. `output_expires_after_seconds`: the
        output and error files expire that long after they are created."""
        body = {
            "input_file_id": input_file_id,
            "endpoint": endpoint,
            "completion_window": completion_window,
            **without_none(
                metadata=metadata,
                max_decoding_length=max_decoding_length,
                max_context_length=max_context_length,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
            ),
        }
        if output_expires_after_seconds is not None:
            body["output_expires_after"] = {"anchor": "created_at",
                                            "seconds": output_expires_after_seconds}
        return self._json("POST", "/v1/batches", json=body)

    def get_batch(self, batch_id: str) -> dict:
        return self._json("GET", f"/v1/batches/{batch_id}")

    def list_batches(self, limit: int = 20, after: str | None = None) -> dict:
        """One page, newest first: `{"object": "list", "data": [...], "has_more": ...}`."""
        return self._json("GET", "/v1/batches", params=without_none(limit=limit, after=after))

    def list_batch_errors(self, batch_id: str, limit: int | None = None,
                          after: int | None = None) -> dict:
        """One page of a failed batch's bad input lines, by line number:
        `{"object": "list", "data": [{code, message, line, param}], "has_more", "total"}`.
        `after` is the `line` of the last error of the page before."""
        return self._json("GET", f"/v1/batches/{batch_id}/errors",
                          params=without_none(limit=limit, after=after))

    def iter_batch_errors(self, batch_id: str) -> Iterator[dict]:
        """Every bad input line the server kept (the batch object shows only the first
        100 in `errors.data`), fetched a page at a time."""
        after = None
        while True:
            page = self.list_batch_errors(batch_id, after=after)
            yield from page["data"]
            if not page["has_more"] or not page["data"]:
                return
            after = page["data"][-1]["line"]

    def cancel_batch(self, batch_id: str) -> dict:
        return self._json("POST", f"/v1/batches/{batch_id}/cancel")

    def wait_for_batch(
        self,
        batch_id: str,
        poll_interval: float = 5.0,
        timeout: float | None = None,
        progress: bool = False,
    ) -> dict:
        """Poll until the batch finishes and return it.

        Raises BatchFailedError (a RuntimeError) if it ends failed, cancelled or
        expired, and WaitTimeoutError (a TimeoutError) after `timeout` seconds; the
        batch keeps running on the server then. `progress=True` shows a tqdm bar on
        stderr.
        """
        with BatchProgress(disable=not progress) as bar:
            for batch in self._poll(batch_id, poll_interval, timeout):
                bar.update(batch)
                if batch.get("status") == "completed":
                    return batch
                if batch.get("status") in FAILED_STATUSES:
                    raise BatchFailedError(batch)
        raise AssertionError("unreachable: _poll only ends by raising")

    def submit_batch(
        self,
        input_file_path: PathLike,
        output_file_path: PathLike | None = None,
        endpoint: str = DEFAULT_ENDPOINT,
        completion_window: str = "24h",
        metadata: dict[str, str] | None = None,
        max_decoding_length: int | None = None,
        max_context_length: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        poll_interval: float = 5.0,
        timeout: float | None = None,
        progress: bool = False,
    ) -> dict:
        """Upload, create, wait, and (if `output_file_path` is given) download the
        output, streamed. Returns the completed batch; raises as `wait_for_batch`."""
        file_obj = self.upload_file(input_file_path, purpose="batch")
        batch = self.create_batch(
            file_obj["id"],
            endpoint=endpoint,
            completion_window=completion_window,
            metadata=metadata,
            max_decoding_length=max_decoding_length,
            max_context_length=max_context_length,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
        )
        batch = self.wait_for_batch(batch["id"], poll_interval, timeout, progress)
        if output_file_path is not None:
            if not batch.get("output_file_id"):
                raise NoOutputError(f"batch {batch['id']} completed without an output file")
            self.download_to(batch["output_file_id"], output_file_path)
        return batch

    def _poll(self, batch_id: str, poll_interval: float, timeout: float | None) -> Iterator[dict]:
        """Batch snapshots, `poll_interval` apart, forever; WaitTimeoutError once
        `timeout` seconds have passed. The consumer stops when it has seen enough.

        A wait may last a day, so it rides out a short outage (a server restart, a
        proxy hiccup): unreachable server or 502/503/504 answers are polled through
        for up to `_POLL_OUTAGE_S`, then the last error is raised.
        """
        if poll_interval < 0:
            raise ValueError("poll_interval must be >= 0")
        deadline = None if timeout is None else _clock.monotonic() + timeout
        batch: dict | None = None
        outage_since: float | None = None
        while True:
            try:
                batch = self.get_batch(batch_id)
            except (APIConnectionError, ServerError) as exc:
                if isinstance(exc, ServerError) and exc.status_code not in _TRANSIENT_STATUSES:
                    raise
                now = _clock.monotonic()
                outage_since = now if outage_since is None else outage_since
                if now - outage_since >= _POLL_OUTAGE_S:
                    raise
                logger.warning("polling %s failed (%s); trying again", batch_id, exc)
            else:
                outage_since = None
                yield batch
            if deadline is None:
                _clock.sleep(poll_interval)
                continue
            remaining = deadline - _clock.monotonic()
            if remaining <= 0:
                status = batch.get("status") if batch else "unknown"
                raise WaitTimeoutError(
                    f"batch {batch_id} still {status} after {timeout} s", batch=batch
                )
            _clock.sleep(min(poll_interval, remaining))



class ResultMethods(BatchMethods):
    def iter_results(
        self, batch_or_file: str | dict, include_errors: bool = True
    ) -> Iterator[dict]:
        """Parsed result lines, streamed (the file is never held in memory).

        `batch_or_file` is a finished batch (its id or object: reads its output file,
        then its error file unless `include_errors=False`) or a file id (`file-...`).
        Raises NoOutputError when the batch has no such file (yet).
        """
        for file_id in self._result_file_ids(batch_or_file, include_errors):
            with self._stream("GET", f"/v1/files/{file_id}/content") as response:
                yield from parse_lines(split_lines(response.iter_bytes()), file_id)

    def follow_results(
        self,
        batch_id: str,
        poll_interval: float = 5.0,
        timeout: float | None = None,
        on_poll: Callable[[dict], None] | None = None,
    ) -> Iterator[dict]:
        """Parsed result lines of a batch as they become available, until it ends.

        Reads `GET /v1/batches/{id}/output?offset=N` (appended bytes of the
        incremental file) when the server answers it with 200; otherwise waits for
        the batch to finish and then reads its output like `iter_results`. Each
        polled batch is passed to `on_poll`. After the last line, raises
        BatchFailedError if the batch did not complete.
        """
        offset = 0
        incremental: bool | None = None  # None until the server's answer is known
        for batch in self._poll(batch_id, poll_interval, timeout):
            if on_poll is not None:
                on_poll(batch)
            finished = batch.get("status") in TERMINAL_STATUSES
            if incremental is not False:
                # The status was read before these bytes: once it is terminal the
                # file is final and its last line may be taken without a newline.
                new_offset = yield from self._read_incremental(
                    batch_id, offset, final=finished, probing=incremental is None
                )
                incremental = new_offset is not None
                offset = new_offset or 0
            if finished:
                if not incremental:
                    if _has_result_files(batch):
                        yield from self.iter_results(batch)
                elif batch.get("error_file_id"):
                    yield from self.iter_results(batch["error_file_id"])
                if batch.get("status") != "completed":
                    raise BatchFailedError(batch)
                return

    def _read_incremental(self, batch_id: str, offset: int, *, final: bool, probing: bool):
        """Yield the result lines appended since byte `offset`; return the new offset.

        While `probing` (first call), a server that does not answer the incremental
        endpoint with 200 makes this return None instead of raising: the caller then
        falls back to the finished output file.
        """
        path = f"/v1/batches/{batch_id}/output"
        request = self._http.build_request("GET", path, params={"offset": offset})
        try:
            response = self._send(lambda: self._http.send(request, stream=True))
        except APIError:
            if probing:
                return None
            raise
        try:
            if response.status_code != 200:
                if probing:
                    return None
                raise BatchGenError(f"GET {path} answered {response.status_code}, expected 200")
            for line in split_lines(response.iter_bytes(), keep_partial=final):
                start, offset = offset, offset + len(line) + 1  # + the newline
                if line.strip():
                    yield parse_line(line, f"{path} at byte {start}")
            return offset
        except httpx.TimeoutException as exc:
            raise APITimeoutError(f"timed out reading {path}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise APIConnectionError(f"reading {path} failed: {exc}") from exc
        finally:
            response.close()

    def _result_file_ids(self, batch_or_file: str | Mapping, include_errors: bool) -> list[str]:
        if isinstance(batch_or_file, str) and batch_or_file.startswith("file-"):
            return [batch_or_file]
        # A dict, or a typed Batch (a Mapping over the same JSON).
        batch = (batch_or_file if isinstance(batch_or_file, Mapping)
                 else self.get_batch(batch_or_file))
        file_ids = [batch.get("output_file_id")]
        if include_errors:
            file_ids.append(batch.get("error_file_id"))
        file_ids = [f for f in dict.fromkeys(file_ids) if f]
        if not file_ids:
            raise NoOutputError(
                f"batch {batch.get('id')} has no output file (status {batch.get('status')})"
            )
        return file_ids


class WebhookMethods(BaseClient):
    def create_webhook_endpoint(self, url: str, *, event_types: list[str] | None = None,
                                name: str | None = None) -> dict:
        """Register a receiver for this key's batches; the answer's `signing_secret`
        is shown only now. Default events: batch.completed, .failed, .cancelled."""
        return self._json("POST", "/v1/webhook_endpoints",
                          json=without_none(url=url, event_types=event_types, name=name))

    def list_webhook_endpoints(self, limit: int | None = None, after: str | None = None) -> dict:
        return self._json("GET", "/v1/webhook_endpoints",
                          params=without_none(limit=limit, after=after))

    def get_webhook_endpoint(self, endpoint_id: str) -> dict:
        return self._json("GET", f"/v1/webhook_endpoints/{endpoint_id}")

    def update_webhook_endpoint(self, endpoint_id: str, *, url: str | None = None,
                                event_types: list[str] | None = None, name: str | None = None,
                                enabled: bool | None = None) -> dict:
        return self._json("POST", f"/v1/webhook_endpoints/{endpoint_id}",
                          json=without_none(url=url, event_types=event_types, name=name,
                                             enabled=enabled))

    def delete_webhook_endpoint(self, endpoint_id: str) -> dict:
        return self._json("DELETE", f"/v1/webhook_endpoints/{endpoint_id}")

    def rotate_webhook_secret(self, endpoint_id: str, *, keep_old_for_24_hours: bool = False
                              ) -> dict:
        return self._json("POST", f"/v1/webhook_endpoints/{endpoint_id}/rotate_secret",
                          json={"keep_old_secret_active_for_24_hours": keep_old_for_24_hours})

    def test_webhook_endpoint(self, endpoint_id: str, event_type: str = "batch.completed"
                              ) -> dict:
        """Have the server send a sample event now; its answer has the receiver's
        `status_code`."""
        return self._json("POST", f"/v1/webhook_endpoints/{endpoint_id}/test",
                          json={"event_type": event_type})


def _upload_fields(purpose: str, expires_after_seconds: int | None) -> dict[str, str]:
    fields = {"purpose": purpose}
    if expires_after_seconds is not None:
        # The form fields the openai SDK sends for a nested object.
        fields["expires_after[anchor]"] = "created_at"
        fields["expires_after[seconds]"] = str(expires_after_seconds)
    return fields


def _has_result_files(batch: dict) -> bool:
    return bool(batch.get("output_file_id") or batch.get("error_file_id"))
