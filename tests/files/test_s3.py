"""Files on an S3-compatible store (BATCHGEN_STORAGE_URL=s3://bucket/prefix), against
a real SeaweedFS server the suite starts (tests/s3.py): what a user sees stays as on
the storage path, the bytes live in the bucket and nowhere else, uploads go up in
parts, and a store that does not answer is an error in the OpenAI envelope."""

from __future__ import annotations

import hashlib
import os
from io import BytesIO

import orjson
import pytest

from batches import services
from batches.models import BatchStatus, Chunk
from files import backends
from files.models import File
from tests.conftest import chat_line, jsonl
from tests.files.test_api import assert_envelope

pytestmark = pytest.mark.django_db

CONTENT = jsonl([chat_line("a"), chat_line("b"), chat_line("c")])


def prefix_of(url: str) -> str:
    return url.split("/", 3)[3]


def test_an_upload_is_an_object_that_streams_back_and_a_delete_leaves_none(
        api, upload, s3_storage, s3_server, storage, django_capture_on_commit_callbacks):
    file = upload(CONTENT)
    key = f"{prefix_of(s3_storage)}/uploads/{file['id']}.jsonl"
    assert s3_server.keys(prefix_of(s3_storage)) == [key]
    assert not (storage / "uploads" / f"{file['id']}.jsonl").exists()  # nothing local
    assert list((storage / "uploads").iterdir()) == []  # the partial went too

    response = api.get(f"/v1/files/{file['id']}/content")
    assert response.status_code == 200
    assert response["Content-Length"] == str(len(CONTENT))
    assert b"".join(response.streaming_content) == CONTENT

    with django_capture_on_commit_callbacks(execute=True):
        assert api.delete(f"/v1/files/{file['id']}").status_code == 200
    assert s3_server.keys(prefix_of(s3_storage)) == []


def test_a_large_file_goes_up_as_a_multipart_upload_and_comes_back_whole(
        s3_storage, s3_server, tmp_path):
    # 20 MiB: three parts of S3_PART_BYTES, so the store's ETag is a multipart one
    source = tmp_path / "big.jsonl"
    line = b'{"custom_id": "x", "body": "' + b"y" * 1000 + b'"}\n'
    with source.open("wb") as fh:
        for _ in range(20 * 1024 * 1024 // len(line) + 1):
            fh.write(line)
    size = source.stat().st_size
    expected = hashlib.sha256(source.read_bytes()).hexdigest()
    store = backends.current()

    store.put_file("uploads/big.jsonl", source)

    assert not source.exists()
    head = s3_server.client().head_object(Bucket="batchgen-test",
                                          Key=f"{prefix_of(s3_storage)}/uploads/big.jsonl")
    assert head["ContentLength"] == size
    assert head["ETag"].strip('"').endswith(f"-{-(-size // backends.S3_PART_BYTES)}")
    with store.open("uploads/big.jsonl") as stream:
        assert backends.sha256_of_stream(stream) == (size, expected)
    store.delete("uploads/big.jsonl")
    assert not store.exists("uploads/big.jsonl")


@pytest.mark.django_db(transaction=True)  # the runtime's threads write the database too
def test_a_batch_reads_its_input_from_the_bucket_and_its_output_file_is_an_object(
        api, upload, runtime_factory, s3_storage, s3_server, storage, settings):
    settings.BATCHGEN_CHUNK_SIZE = 2
    file = upload(CONTENT)
    batch = services.batch_create(input_file_id=file["id"], endpoint="/v1/chat/completions",
                                  model="sim")
    assert services.batch_validate(batch_id=batch.id).status == BatchStatus.IN_PROGRESS
    (storage / "uploads" / f"{file['id']}.jsonl").unlink()  # another host: no local copy
    runtime = runtime_factory()
    for chunk in Chunk.objects.filter(batch=batch):
        runtime.run_chunk(chunk.id)
    batch = services.batch_finalize(batch_id=batch.id)

    assert batch.status == BatchStatus.COMPLETED
    output = batch.output_file
    assert s3_server.keys(f"{prefix_of(s3_storage)}/incremental/") == [
        f"{prefix_of(s3_storage)}/incremental/{batch.id}.jsonl"]
    body = b"".join(api.get(f"/v1/files/{output.id}/content").streaming_content)
    assert sorted(line.split(b'"custom_id":"')[1][:1] for line in body.splitlines()) == [
        b"a", b"b", b"c"]
    assert len(body) == output.bytes
    assert f"sha256:{hashlib.sha256(body).hexdigest()}" == output.checksum


def test_a_store_that_does_not_answer_is_a_507_on_upload_and_a_503_on_download(
        api, upload, s3_storage, s3_server, monkeypatch, storage):
    file = upload(CONTENT)
    closed = s3_server.endpoint.rsplit(":", 1)[0] + ":1"  # nothing listens on port 1
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    backends.clear_clients()

    handle = BytesIO(CONTENT)
    handle.name = "input.jsonl"
    response = api.post("/v1/files", {"file": handle, "purpose": "batch"}, format="multipart")
    assert_envelope(response, 507, code="storage_full")
    assert File.objects.count() == 1
    assert os.listdir(storage / "uploads") == []  # the partial is not left behind

    assert_envelope(api.get(f"/v1/files/{file['id']}/content"), 503,
                    code="storage_unavailable")
    health = api.get("/health")
    assert health.status_code == 503
    assert health.json()["reason"].startswith("object store unreachable")


def test_storage_move_puts_a_paths_files_in_the_bucket_and_says_what_it_moved(
        api, upload, s3_server, s3_storage, settings, storage):
    from io import StringIO

    from django.core.management import call_command

    # Given: a deployment on a path with two files
    settings.BATCHGEN_STORAGE_URL = ""
    files = [upload(CONTENT), upload(CONTENT + CONTENT)]
    assert len(list((storage / "uploads").glob("file-*"))) == 2

    # When: moved to the bucket, twice (the second run has nothing left to do)
    out = StringIO()
    call_command("storage_move", s3_storage, stdout=out)
    again = StringIO()
    call_command("storage_move", s3_storage, stdout=again)

    # Then: the bytes are objects, none stays on the path, and the server on the bucket
    # serves them under the same rows
    assert out.getvalue().startswith("moved 2 file(s), ")
    assert "moved 0 file(s)" in again.getvalue()
    assert "2 file(s) were in the bucket already" in again.getvalue()
    assert list((storage / "uploads").glob("file-*")) == []
    assert len(s3_server.keys(prefix_of(s3_storage))) == 2
    settings.BATCHGEN_STORAGE_URL = s3_storage
    body = b"".join(api.get(f"/v1/files/{files[1]['id']}/content").streaming_content)
    assert body == CONTENT + CONTENT


@pytest.mark.django_db(transaction=True)  # the runtime's threads write the database too
def test_a_chunk_rerun_after_a_lost_lease_counts_once_and_the_view_shows_only_counted_lines(
        api, runtime_factory, batch_in_progress, s3_storage, s3_server):
    from batches.models import Batch, ChunkStatus
    from files.models import OutputSegment
    from files.segments import segment_name
    from inference.output import format_line
    from serving.engines.base import EngineResult

    # Given: attempt 1 of the only chunk flushed one segment (req-0, counted), then
    # wrote another (req-1, req-2) and lost its lease before its flush recorded it
    batch = batch_in_progress(4, chunk_size=4)
    chunk = Chunk.objects.get(batch=batch)
    store = backends.current()
    counted = format_line("req-0", EngineResult(body={"earlier": True}))
    store.put_bytes(segment_name(batch.id, 0, 1, 0), counted)
    store.put_bytes(segment_name(batch.id, 0, 1, 1),
                    format_line("req-1", EngineResult(body={"orphan": True}))
                    + format_line("req-2", EngineResult(body={"orphan": True})))
    OutputSegment.objects.create(batch_id=batch.id, chunk_id=chunk.id,
                                 name=segment_name(batch.id, 0, 1, 0), size=len(counted),
                                 start_offset=0)
    Chunk.objects.filter(id=chunk.id).update(status=ChunkStatus.RUNNING, attempts=1,
                                             completed=1, worker="dead-worker",
                                             lease_expires_at="2000-01-01T00:00:00Z")
    Batch.objects.filter(id=batch.id).update(completed=1)
    before = api.get(f"/v1/batches/{batch.id}/output?offset=0")
    assert b"".join(before.streaming_content) == counted  # the orphan is not in it
    assert before["X-Next-Offset"] == str(len(counted))

    # When: recovery hands the chunk to a live worker, which runs it again
    runtime_factory().run_chunk(chunk.id)

    # Then: the view shows every custom_id once, whole lines, resumable at its offsets
    response = api.get(f"/v1/batches/{batch.id}/output?offset={len(counted)}")
    rest = b"".join(response.streaming_content)
    stream = counted + rest
    assert response["X-Next-Offset"] == str(len(stream))
    ids = [orjson.loads(line)["custom_id"] for line in stream.splitlines()]
    assert sorted(ids) == ["req-0", "req-1", "req-2", "req-3"]
    assert b'"orphan"' not in stream
    assert_envelope(api.get(f"/v1/batches/{batch.id}/output?offset={len(counted) + 3}"), 400,
                    code="offset_not_at_line_start")
    done = api.get(f"/v1/batches/{batch.id}/output?offset={len(stream)}")
    assert b"".join(done.streaming_content) == b""

    # and finalization composes exactly that, leaving no segment object behind
    batch = services.batch_finalize(batch_id=batch.id)
    assert (batch.completed, batch.failed) == (4, 0)
    body = b"".join(api.get(f"/v1/files/{batch.output_file_id}/content").streaming_content)
    assert body == stream
    assert s3_server.keys(f"{prefix_of(s3_storage)}/incremental/") == [
        f"{prefix_of(s3_storage)}/incremental/{batch.id}.jsonl"]


@pytest.mark.django_db(transaction=True)  # the runtime's threads write the database too
@pytest.mark.parametrize("interval", [0.0, 60.0])
def test_a_chunks_results_go_up_as_one_segment_per_interval_and_count_once(
        api, runtime_factory, batch_in_progress, s3_storage, interval, monkeypatch):
    from files.models import OutputSegment
    from inference import held_results

    monkeypatch.setattr(held_results, "SEGMENT_SECONDS", interval)
    # Four slots and 20 ms a request: the chunk's results come back in many drains.
    runtime = runtime_factory(capacity=4, latency_ms=20)
    batch = batch_in_progress(24, chunk_size=24)
    chunk = Chunk.objects.get(batch=batch)

    assert "done, 24 completed" in runtime.run_chunk(chunk.id)

    written = OutputSegment.objects.filter(chunk_id=chunk.id).count()
    # Held for the interval: one segment at the end of the chunk; not held: one a drain.
    assert written == 1 if interval else written > 2
    stream = b"".join(api.get(f"/v1/batches/{batch.id}/output?offset=0").streaming_content)
    ids = [orjson.loads(line)["custom_id"] for line in stream.splitlines()]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(24))
    batch.refresh_from_db()
    assert (batch.completed, batch.failed) == (24, 0)


@pytest.mark.django_db(transaction=True)  # the SDK's requests reach Django by WSGI
def test_a_download_redirects_to_a_presigned_url_the_openai_sdk_follows(
        upload, s3_storage, s3_server, settings):
    import httpx
    import openai
    from django.core.wsgi import get_wsgi_application

    file = upload(CONTENT, filename="mine.jsonl")
    settings.BATCHGEN_S3_PRESIGNED_DOWNLOADS = True
    # The SDK talks to this Django by WSGI and follows the redirect to SeaweedFS (as
    # with its own client, which follows redirects).
    seen = []
    http = httpx.Client(mounts={"http://batchgen": httpx.WSGITransport(
        app=get_wsgi_application()), "all://": httpx.HTTPTransport()},
        follow_redirects=True, event_hooks={"response": [seen.append]})
    sdk = openai.OpenAI(base_url="http://batchgen/v1", api_key="unused", http_client=http)

    assert sdk.files.content(file["id"]).read() == CONTENT

    assert [response.status_code for response in seen] == [302, 200]
    store_response = seen[1]
    assert store_response.url.port == int(s3_server.endpoint.rsplit(":", 1)[1])
    assert "Authorization" not in store_response.request.headers  # the URL is the grant
    assert 'filename="mine.jsonl"' in store_response.headers["Content-Disposition"]

    settings.BATCHGEN_S3_PRESIGNED_DOWNLOADS = False  # the default: streamed through
    assert sdk.files.content(file["id"]).read() == CONTENT
    assert seen[-1].status_code == 200 and seen[-1].url.host == "batchgen"
