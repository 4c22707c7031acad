"""Where file bytes are kept: the storage path (the embedded default, the seed's
layout) or an S3-compatible bucket (`BATCHGEN_STORAGE_URL=s3://bucket/prefix`).

Both backends speak in storage names (`uploads/{file_id}.jsonl`,
`incremental/{batch_id}.jsonl`): the File row keeps the name, never a path or a URL,
so a deployment can move from a path to a bucket (`manage.py storage_move`) without
touching its rows. Every call streams in bounded blocks: an upload goes up as a
multipart upload of `S3_PART_BYTES` parts read from the local partial file, a
download is read from the response body block by block, so a 1 GiB file never sits in
a process's memory.

On a bucket the storage path is only a local scratch area of the process (partial
uploads, the copy of an input a worker reads, the incremental file of a batch): no
two hosts need to share it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import urlparse

from django.conf import settings

from core.outage import OBJECT_STORE, ObjectStoreUnavailable, is_down, outage_ended

logger = logging.getLogger("batchgen.files")

READ_BLOCK = 1024 * 1024
# S3's smallest part is 5 MiB (but the last); 8 MiB parts put a 1 GiB upload in 128
# parts, far below the 10,000 a multipart upload may have, and two in flight keep a
# process's memory for an upload near 16 MiB whatever the file's size.
S3_PART_BYTES = 8 * 1024 * 1024
S3_CONCURRENCY = 2
DELETE_BATCH = 1000  # keys in one DeleteObjects request: S3's limit
PRESIGNED_SECONDS = 300  # how long a redirected download's URL is valid


StorageUnavailable = ObjectStoreUnavailable  # the object store's outage, not a bug


class StorageBackend(Protocol):
    """What the rest of the server asks of the place the bytes live."""

    url: str

    def put_file(self, name: str, source: Path) -> None:
        """Store the finished local file `source` under `name` and remove `source`."""

    def open(self, name: str) -> BinaryIO:
        """A readable binary stream of the bytes; FileNotFoundError when missing."""

    def delete(self, name: str) -> None:
        """Remove the bytes (no-op when already gone): nothing stays behind."""

    def exists(self, name: str) -> bool: ...

    def local_path(self, name: str) -> Path | None:
        """A local file with the bytes (a download into the process's own scratch
        area on a bucket), or None when they are gone."""

    def names(self, prefix: str) -> Iterator[str]:
        """Every stored name under `prefix` (`uploads/`)."""

    def probe(self) -> None:
        """Raise StorageUnavailable unless the store answers now (/health)."""


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PathStorage:
    """The bytes under the storage path: `{storage}/{name}` (the seed's layout)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)

    def _path(self, name: str) -> Path:
        return self.root / name

    def put_file(self, name: str, source: Path) -> None:
        final = self._path(name)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, final)
        fsync_dir(final.parent)

    def open(self, name: str) -> BinaryIO:
        return self._path(name).open("rb")

    def delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    def exists(self, name: str) -> bool:
        return self._path(name).exists()

    def local_path(self, name: str) -> Path | None:
        path = self._path(name)
        return path if path.exists() else None

    def probe(self) -> None:
        """The storage path is a local or mounted folder: a full one is the workers'
        storage error, said by /health from their rows."""

    def names(self, prefix: str) -> Iterator[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return
        for path in sorted(base.rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                yield str(path.relative_to(self.root))


class _BodyReader:
    """An S3 response body as a file object FileResponse can stream (read, close)."""

    def __init__(self, body) -> None:
        self._body = body

    def read(self, size: int = -1) -> bytes:
        try:
            return self._body.read(None if size is None or size < 0 else size)
        except Exception as exc:  # noqa: BLE001 - a dropped connection mid-stream
            raise StorageUnavailable(f"reading from the object store failed: {exc}") from exc

    def __iter__(self) -> Iterator[bytes]:
        while block := self.read(READ_BLOCK):
            yield block

    def close(self) -> None:
        self._body.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class S3Storage:
    """The bytes in a bucket under `{prefix}/{name}`, through boto3 with the usual
    AWS settings: the credentials chain (variables, profile, instance role),
    AWS_REGION / AWS_DEFAULT_REGION, AWS_ENDPOINT_URL for a non-AWS store, and
    `BATCHGEN_S3_ADDRESSING_STYLE=path` for stores that want path-style requests."""

    def __init__(self, url: str, *, scratch: Path, addressing_style: str = "auto") -> None:
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"not an s3://bucket/prefix URL: {url!r}")
        self.url = url
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.scratch = scratch
        self._addressing_style = addressing_style

    @property
    def client(self):
        return _client(self._addressing_style)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    @property
    def objects(self):
        """The bucket through obstore, for the incremental output's small objects."""
        return _object_store(self.bucket, self._addressing_style)

    def _call(self, what: str, call, *args, **kwargs):
        """`call` (boto3's or obstore's), with a missing object as FileNotFoundError and
        any other failure as the store's outage; an answer ends a noted outage."""
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError
        from obstore.exceptions import BaseError as ObstoreError
        from obstore.exceptions import NotFoundError

        try:
            result = call(*args, **kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(what) from None
            raise StorageUnavailable(f"{what}: {code or exc}") from exc
        except NotFoundError:
            raise FileNotFoundError(what) from None
        except (BotoCoreError, Boto3Error, ObstoreError) as exc:
            raise StorageUnavailable(f"{what}: {exc}") from exc
        if is_down(OBJECT_STORE):
            outage_ended(OBJECT_STORE)
        return result

    def put_file(self, name: str, source: Path) -> None:
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(multipart_threshold=S3_PART_BYTES,
                                multipart_chunksize=S3_PART_BYTES,
                                max_concurrency=S3_CONCURRENCY, use_threads=True)
        self._call(f"upload of {name}", self.client.upload_file, str(source), self.bucket,
                   self.key(name), Config=config)
        source.unlink(missing_ok=True)

    def put_bytes(self, name: str, data: bytes) -> None:
        """One small immutable object (a segment of the incremental output), in one PUT."""
        import obstore

        self._call(f"upload of {name}", obstore.put, self.objects, self.key(name), data,
                   use_multipart=False)

    def get_bytes(self, name: str, *, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """A small object's bytes from `start` (to `end`, exclusive), in blocks of at
        least READ_BLOCK (a segment of the incremental output)."""
        import obstore

        options = ({"range": (start, end)} if end is not None
                   else {"range": {"offset": start}} if start else None)
        result = self._call(name, obstore.get, self.objects, self.key(name), options=options)
        stream = result.stream(min_chunk_size=READ_BLOCK)
        while True:
            try:
                block = self._call(name, next, stream)
            except StopIteration:
                return
            yield bytes(block)

    def open(self, name: str) -> BinaryIO:
        response = self._call(name, self.client.get_object, Bucket=self.bucket,
                              Key=self.key(name))
        return _BodyReader(response["Body"])  # type: ignore[return-value]

    def delete(self, name: str) -> None:
        self._call(f"delete of {name}", self.client.delete_object, Bucket=self.bucket,
                   Key=self.key(name))
        (self.scratch / name).unlink(missing_ok=True)  # the local copy, if any

    def presigned_url(self, name: str, *, filename: str, seconds: int = PRESIGNED_SECONDS) -> str:
        """A URL that GETs the object without credentials for `seconds`, answered as
        an attachment named `filename` (a download redirected to the store)."""
        return self._call(f"presigned URL of {name}", self.client.generate_presigned_url,
                          "get_object", ExpiresIn=seconds, Params={
                              "Bucket": self.bucket, "Key": self.key(name),
                              "ResponseContentType": "application/jsonl",
                              "ResponseContentDisposition":
                                  f'attachment; filename="{filename}"'})

    def delete_many(self, names: list[str]) -> None:
        """Remove many objects with one DeleteObjects request per 1,000 (S3's most per
        request) rather than a request each: a batch's segments go in one or two."""
        for start in range(0, len(names), DELETE_BATCH):
            keys = [{"Key": self.key(name)} for name in names[start:start + DELETE_BATCH]]
            response = self._call(f"delete of {len(keys)} objects", self.client.delete_objects,
                                  Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
            if response.get("Errors"):
                first = response["Errors"][0]
                raise StorageUnavailable(f"delete of {first.get('Key')}: {first.get('Code')} "
                                         f"({len(response['Errors'])} not deleted)")

    def exists(self, name: str) -> bool:
        try:
            self._call(name, self.client.head_object, Bucket=self.bucket, Key=self.key(name))
        except FileNotFoundError:
            return False
        return True

    def probe(self) -> None:
        """One quick request, no retries: a load balancer's probe must not hang."""
        self._call("probe", _client(self._addressing_style, probe=True).head_bucket,
                   Bucket=self.bucket)

    def local_path(self, name: str) -> Path | None:
        """Download once into the scratch area (a rename makes it appear whole), then
        reuse: stored objects never change under a name."""
        local = self.scratch / name
        if local.exists():
            return local
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.with_name(f".download-{uuid.uuid4().hex}")
        try:
            self._call(f"download of {name}", self.client.download_file, self.bucket,
                       self.key(name), str(partial))
        except FileNotFoundError:
            partial.unlink(missing_ok=True)
            return None
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, local)
        return local

    def names(self, prefix: str) -> Iterator[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        strip = len(self.key(""))
        pages = paginator.paginate(Bucket=self.bucket, Prefix=self.key(prefix))
        for page in self._call(f"list of {prefix}", list, pages):
            for item in page.get("Contents", ()):
                yield item["Key"][strip:]


@lru_cache(maxsize=1)
def _session():
    """The AWS settings of the environment. AWS_REGION, the variable the AWS SDKs
    share, comes before botocore's own AWS_DEFAULT_REGION (boto3 reads only the
    latter); requests are signed for that region."""
    import boto3

    return boto3.session.Session(region_name=os.environ.get("AWS_REGION") or None)


@lru_cache(maxsize=4)
def _client(addressing_style: str, probe: bool = False):
    """One client per process (boto3 clients are thread-safe; building one costs
    tens of milliseconds). Retries are botocore's standard mode: a store that blinks
    is retried a few times before its outage is said."""
    from botocore.config import Config

    return _session().client("s3", config=Config(
        s3={"addressing_style": addressing_style},
        # CRC checksums on every request and response only where the API requires them
        # (botocore's default before 1.36): they cost about 1 ms of CPU a call here,
        # a third of a segment's PUT or GET (benchmarks/storage.py).
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        signature_version="s3v4",  # presigned URLs too (boto presigns with SigV2 otherwise)
        retries={"mode": "standard", "max_attempts": 1 if probe else 3},
        connect_timeout=2 if probe else 5, read_timeout=5 if probe else 30,
    ))


@lru_cache(maxsize=4)
def _object_store(bucket: str, addressing_style: str):
    """The bucket through obstore (Rust's object_store), for the incremental output's
    many small objects: the segment PUTs of the inference workers and the GETs that
    read and compose them (files/segments.py). A call there costs about 0.3 ms of CPU,
    mostly outside the GIL, where boto3's costs 2 ms inside it (112 KB objects against
    SeaweedFS), and a fast engine's worker writes a segment per chunk: boto3 took
    some 2 s of an inference worker's interpreter per 1,000 segments. boto3 keeps
    the rest (multipart uploads and copies, presigned URLs, bulk deletes, listings).

    It follows the boto3 client: the same credentials chain (boto3's session, renewed
    through it), region, endpoint and addressing style (read off a URL that boto3
    builds for the bucket, so `auto` resolves as boto3 resolves it). Retries are few
    and short, as botocore's: a store that is down must be said down in seconds."""
    from datetime import timedelta

    from botocore.exceptions import NoCredentialsError
    from obstore.auth.boto3 import Boto3CredentialProvider
    from obstore.store import S3Store

    client = _client(addressing_style)
    try:
        built = urlparse(client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=60))
        credentials = {"credential_provider": Boto3CredentialProvider(_session())}
    except NoCredentialsError:
        built = urlparse(f"{client.meta.endpoint_url}/{bucket}/k")
        credentials = {"skip_signature": True}
    virtual = built.hostname is not None and built.hostname.startswith(f"{bucket}.")
    endpoint = urlparse(client.meta.endpoint_url)  # the region's, or AWS_ENDPOINT_URL
    return S3Store(
        bucket, virtual_hosted_style_request=virtual,
        endpoint=f"{endpoint.scheme}://{bucket + '.' if virtual else ''}{endpoint.netloc}",
        region=client.meta.region_name or "us-east-1", **credentials,
        client_options={"allow_http": endpoint.scheme == "http",
                        "connect_timeout": timedelta(seconds=5),
                        "timeout": timedelta(seconds=30)},
        retry_config={"max_retries": 2, "retry_timeout": timedelta(seconds=10),
                      "backoff": {"init_backoff": timedelta(milliseconds=100),
                                  "max_backoff": timedelta(seconds=2), "base": 2}})


def clear_clients() -> None:
    """Forget the clients built from the environment (tests change it)."""
    for cached in (_session, _client, _object_store):
        cached.cache_clear()


def backend_for(url: str) -> StorageBackend:
    """The backend `url` names: `s3://bucket/prefix`, or empty for the storage path."""
    if url:
        return S3Storage(url, scratch=settings.STORAGE_PATH,
                         addressing_style=settings.BATCHGEN_S3_ADDRESSING_STYLE)
    return PathStorage(settings.STORAGE_PATH)


def current() -> StorageBackend:
    """The backend of this process's settings (read each call: tests override them)."""
    return backend_for(settings.BATCHGEN_STORAGE_URL)


def sha256_of_stream(stream: BinaryIO) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    while block := stream.read(READ_BLOCK):
        digest.update(block)
        size += len(block)
    return size, digest.hexdigest()
