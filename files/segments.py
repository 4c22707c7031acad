"""The incremental output on an object store, which has no append and no locks:
immutable segment objects, read as one ordered byte stream, composed into the output
file at finalization (docs/architecture.md, "Incremental output on object storage").

A worker that flushes a chunk's finished lines writes them as one new object,
`incremental/{batch_id}/{chunk:06d}-{attempt:04d}-{seq:06d}.jsonl`, named so that no
two writers (two attempts of one chunk after a lost lease included) can ever write the
same name; an object is never rewritten. Whole lines only: a segment is either all
there or not there (a PUT is atomic), so a reader never sees a torn line.

Which segments count is the database's to say: the ledger (the worker's flush) records
a segment in the same transaction that counts its lines, and only while the worker
still holds the chunk's lease; a segment a dead or superseded attempt wrote but never
recorded is not part of the stream, and is deleted at finalization. The counted
segments in the order they were recorded are the stream: `Segment(name, size)` rows
with their running start offsets, which is all a reader needs.

Here: the object-store side of that (naming, the ordered reader, the composition).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from files.backends import S3_PART_BYTES, S3Storage

# S3's rule for a multipart upload: every part but the last is at least 5 MiB.
MIN_PART_BYTES = 5 * 1024 * 1024
# compose reads small segments ahead: GETs at once, and segments waiting at most
READ_AHEAD_THREADS = 4
READ_AHEAD_MAX = 64


@dataclass(frozen=True)
class Segment:
    name: str  # storage name (the backend adds the prefix)
    size: int


def segment_name(batch_id: str, chunk_index: int, attempt: int, seq: int) -> str:
    """Unique per writer: the attempt number comes from the chunk's claim (the database
    increments it), so a re-run after a lost lease never reuses an earlier name."""
    return f"incremental/{batch_id}/{chunk_index:06d}-{attempt:04d}-{seq:06d}.jsonl"


def stream_end(segments: Sequence[Segment]) -> int:
    """The stream's length: where a reader that read everything goes on from
    (`X-Next-Offset`)."""
    return sum(segment.size for segment in segments)


def read_from(store: S3Storage, segments: Sequence[Segment], offset: int, *,
              composed: str | None = None) -> Iterator[bytes]:
    """The counted segments as one byte stream from `offset`, in bounded blocks: the
    segment holding `offset` from there on (a ranged GET), then every later one whole.

    `composed` names the object finalization composes the stream into: the same bytes
    at the same offsets, the reader's segments being a prefix of what it composes.
    Finalization deletes the segments once it has composed them, possibly after the
    reader listed them; a segment found gone is then read, with the rest of the
    stream, from there."""
    position, start, end = offset, 0, stream_end(segments)
    for segment in segments:
        if start + segment.size > position and segment.size:
            try:
                for block in store.get_bytes(segment.name, start=position - start):
                    position += len(block)
                    yield block
            except FileNotFoundError:
                if composed is None:
                    raise
                yield from store.get_bytes(composed, start=position, end=end)
                return
        start += segment.size


def starts_a_line(store: S3Storage, segments: Sequence[Segment], offset: int, *,
                  composed: str | None = None) -> bool:
    """Whether `offset` is where a line starts: a segment's start, or just after a
    newline (one byte read with a ranged GET; from `composed` if the segment is gone,
    as read_from)."""
    start = 0
    for segment in segments:
        if offset == start:
            return True
        if offset < start + segment.size:
            try:
                byte = _one_byte(store, segment.name, offset - start - 1)
            except FileNotFoundError:
                if composed is None:
                    raise
                byte = _one_byte(store, composed, offset - 1)
            return byte == b"\n"
        start += segment.size
    return offset == start


def _one_byte(store: S3Storage, name: str, at: int) -> bytes:
    return b"".join(store.get_bytes(name, start=at, end=at + 1))


@dataclass(frozen=True)
class Composed:
    name: str
    size: int
    copied_parts: int  # parts the store copied server-side (bytes never left it)
    uploaded_parts: int  # parts made of small segments, read and sent again


def compose(store: S3Storage, segments: Sequence[Segment], name: str, *,
            observe: Callable[[bytes], None] | None = None) -> Composed:
    """Write the segments, in order, as one object `name`.

    A segment of at least 5 MiB becomes a part of a multipart upload copied by the
    store itself (UploadPartCopy: its bytes never come back to this process); runs of
    smaller segments are read and sent as parts of S3_PART_BYTES, since S3 refuses a
    part under 5 MiB except the last, a few of them read ahead at once
    (_small_bodies). Memory stays within about two parts. With nothing to compose,
    the object is empty.

    `observe` is given the bytes that pass through this process, in the stream's
    order: all of them when no part was copied (`copied_parts` 0), so that the
    output's checksum needs no second read."""
    if not any(segment.size for segment in segments):
        store._call(name, store.client.put_object, Bucket=store.bucket,
                    Key=store.key(name), Body=b"")
        return Composed(name, 0, 0, 0)
    upload = _MultipartUpload(store, name, observe or (lambda data: None))
    try:
        for segment, body in zip(segments, _small_bodies(store, segments), strict=True):
            if body is not None:
                upload.add(body)
            elif segment.size >= MIN_PART_BYTES and upload.may_copy():
                upload.copy(segment)
            else:
                for data in read_from(store, [segment], 0):
                    upload.add(data)
        upload.complete()
    except BaseException:
        upload.abort()
        raise
    return Composed(name, stream_end(segments), upload.copied, upload.uploaded)


class _MultipartUpload:
    """The output object's multipart upload: bytes buffered into parts of
    S3_PART_BYTES, or a whole segment copied by the store as one part."""

    def __init__(self, store: S3Storage, name: str, observe: Callable[[bytes], None]) -> None:
        self.store, self.name, self.observe = store, name, observe
        self.key = store.key(name)
        self.id = store._call(name, store.client.create_multipart_upload,
                              Bucket=store.bucket, Key=self.key)["UploadId"]
        self.parts: list[dict] = []
        self.buffer = bytearray()
        self.copied = self.uploaded = 0

    def _part(self, call, **kwargs) -> dict:
        return self.store._call(self.name, call, Bucket=self.store.bucket, Key=self.key,
                                UploadId=self.id, PartNumber=len(self.parts) + 1, **kwargs)

    def add(self, data: bytes) -> None:
        self.observe(data)
        self.buffer += data
        if len(self.buffer) >= S3_PART_BYTES:
            self._send()

    def may_copy(self) -> bool:
        """Whether a copied part may come next: what is buffered can go as a part."""
        return not self.buffer or len(self.buffer) >= MIN_PART_BYTES

    def copy(self, segment: Segment) -> None:
        if self.buffer:
            self._send()
        response = self._part(self.store.client.upload_part_copy, CopySource={
            "Bucket": self.store.bucket, "Key": self.store.key(segment.name)})
        self.parts.append({"PartNumber": len(self.parts) + 1,
                           "ETag": response["CopyPartResult"]["ETag"]})
        self.copied += 1

    def _send(self) -> None:
        response = self._part(self.store.client.upload_part, Body=bytes(self.buffer))
        self.parts.append({"PartNumber": len(self.parts) + 1, "ETag": response["ETag"]})
        self.buffer.clear()
        self.uploaded += 1

    def complete(self) -> None:
        if self.buffer:
            self._send()  # the last part may be small
        self.store._call(self.name, self.store.client.complete_multipart_upload,
                         Bucket=self.store.bucket, Key=self.key, UploadId=self.id,
                         MultipartUpload={"Parts": self.parts})

    def abort(self) -> None:
        self.store.client.abort_multipart_upload(Bucket=self.store.bucket, Key=self.key,
                                                 UploadId=self.id)


def _small_bodies(store: S3Storage, segments: Sequence[Segment]) -> Iterator[bytes | None]:
    """For each segment, in order: its bytes when it is under 5 MiB (never a copied
    part), else None (compose copies it or streams it). The small ones are read
    ahead, READ_AHEAD_THREADS GETs at once, up to about S3_PART_BYTES beyond the one
    being used: one GET costs a round trip and a few ms of the client's CPU, and a
    batch has a segment per chunk or more, so reading them one by one made the
    composition the slowest step of a finalization."""
    window: deque[tuple[Segment, Future | None]] = deque()
    ahead = 0  # bytes being read or waiting in the window
    upcoming = iter(segments)
    pool = ThreadPoolExecutor(READ_AHEAD_THREADS, thread_name_prefix="compose-read")
    try:
        while True:
            while not window or (ahead < S3_PART_BYTES and len(window) < READ_AHEAD_MAX):
                segment = next(upcoming, None)
                if segment is None:
                    break
                small = 0 < segment.size < MIN_PART_BYTES
                window.append((segment, pool.submit(_read_whole, store, segment)
                               if small else None))
                ahead += segment.size if small else 0
            if not window:
                return
            segment, future = window.popleft()
            if future is None:
                yield b"" if not segment.size else None
                continue
            ahead -= segment.size
            yield future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _read_whole(store: S3Storage, segment: Segment) -> bytes:
    return b"".join(read_from(store, [segment], 0))


def orphans(store: S3Storage, batch_id: str, counted: Iterable[Segment]) -> list[str]:
    """Segment objects of the batch that no ledger row counts: written by an attempt
    that died or lost its lease before its flush recorded them. Deleted at
    finalization; never part of the stream."""
    keep = {segment.name for segment in counted}
    return [name for name in store.names(f"incremental/{batch_id}/") if name not in keep]


def scan_segments(store: S3Storage, counted: Sequence[Segment],
                  custom_ids: set[str]) -> dict[str, bool]:
    """As files.incremental.scan_results, over a chunk's counted segments: which of
    `custom_ids` have a line there, and whether it is a success."""
    import orjson

    found: dict[str, bool] = {}
    tail = b""
    for block in read_from(store, counted, 0):
        lines = (tail + block).split(b"\n")
        tail = lines.pop()
        for raw in lines:
            try:
                item = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if item.get("custom_id") in custom_ids:
                found[item["custom_id"]] = item.get("error") is None
    return found
