"""The storage volume full under the real inference runtime, in process, for
machines where a small volume cannot be mounted (test_disk_full.py needs root):
os.write on the incremental file fails with ENOSPC, as it does on a full volume.

What the worker does: the chunk holds its finished results (the heartbeat keeps its
lease) and retries the append with backoff; the batch shows `error.code ==
"storage_full"`, and /health and /v1/pool/status say why. The worker pauses: it
stops consuming its queue, refuses unclaimed a chunk delivered meanwhile and hands
back a chunk it has not started. Once there is room the results are written and the
batch goes on: no inference is lost or run twice. A batch cancelled, or a worker
stopped, while it waits gives the held results up uncounted, so the file and
`request_counts` still agree; the worker stays paused until a probe write finds room."""

from __future__ import annotations

import errno
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from celery.exceptions import Reject

from batches import services
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from files import incremental, storage
from files.models import File
from inference import storage_pause
from tests.conftest import chat_line, error_of, jsonl
from tests.e2e.harness import output_ids, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(storage_pause, "STORAGE_RETRY_FIRST", 0.05)
    monkeypatch.setattr(storage_pause, "STORAGE_RETRY_MAX", 0.2)


class QueueSwitchRecorder:
    """Stands in for inference.signals.QueueSwitch: what the runtime asked of its
    queue each time (True: stop consuming it)."""

    def __init__(self, runtime):
        self.runtime, self.paused = runtime, []

    def changed(self):
        self.paused.append(bool(self.runtime.storage_error))


@pytest.fixture
def runtime(runtime_factory):
    runtime = runtime_factory()
    runtime.queue_switch = QueueSwitchRecorder(runtime)
    return runtime


@pytest.fixture
def full_disk(monkeypatch):
    """While `full` is set, writes to incremental files fail with ENOSPC."""
    real_write = os.write
    state = {"full": False}

    def write(fd, data):
        if state["full"] and "/incremental/" in os.path.realpath(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(incremental.os, "write", write)
    yield state
    state["full"] = False  # a chunk thread still waiting on it ends


@pytest.fixture
def in_thread():
    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="chunk")
    yield executor.submit
    executor.shutdown(wait=True)


@pytest.fixture
def half_run_batch(runtime, batch_in_progress):
    """A batch of two chunks of 10 whose first chunk ran: (batch, second chunk, the
    incremental file's bytes, its path)."""
    batch = batch_in_progress(20, chunk_size=10)
    first, second = Chunk.objects.filter(batch=batch).order_by("index")
    runtime.run_chunk(first.id)
    output = storage.absolute(storage.incremental_name(batch.id))
    return batch, second, output.read_bytes(), output


@pytest.fixture
def waiting_chunk(runtime, full_disk, half_run_batch, in_thread):
    """Fill the disk, run the second chunk in a thread and wait until its batch shows
    the full storage; returns the chunk's future."""

    def start():
        batch, second, _, _ = half_run_batch
        full_disk["full"] = True
        running = in_thread(runtime.run_chunk, second.id)
        wait_until(lambda: storage_error_of(batch) == "storage_full", timeout=30,
                   message="the batch to show the full storage")
        return running

    return start


def storage_error_of(batch: Batch) -> str | None:
    batch.refresh_from_db()
    return (batch.error or {}).get("code")


def test_full_disk_holds_the_results_shows_why_and_resumes_when_there_is_room(
        runtime, full_disk, half_run_batch, waiting_chunk, api):
    batch, second, written, output = half_run_batch

    # When: the disk is full while the second chunk runs
    running = waiting_chunk()

    # Then: the batch waits and says why; so do /health and /v1/pool/status
    shown = api.get(f"/v1/batches/{batch.id}").json()
    assert shown["status"] == "in_progress"
    assert shown["error"]["code"] == "storage_full"
    assert "space is freed" in shown["error"]["message"]
    wait_until(lambda: api.get("/v1/pool/status").json()["storage_error"], timeout=10,
               message="the pool status to show the full storage")
    assert "No space left on device" in api.get("/v1/pool/status").json()["storage_error"]
    health = api.get("/health")
    assert health.status_code == 503
    assert health.json()["reason"].startswith("storage full: 1 inference worker(s)")
    # ...while the chunk holds its results under its lease; the file is untouched
    assert not running.done()
    second.refresh_from_db()
    assert (second.status, second.attempts, second.completed) == (ChunkStatus.RUNNING, 1, 0)
    assert output.read_bytes() == written

    # When: there is room again
    full_disk["full"] = False

    # Then: the held results are written by the same attempt; nothing ran twice
    assert running.result(timeout=30).endswith("10 completed, 0 failed")
    second.refresh_from_db()
    assert (second.status, second.attempts) == (ChunkStatus.DONE, 1)
    assert runtime.completed == 20
    assert storage_error_of(batch) is None
    wait_until(lambda: api.get("/v1/pool/status").json()["storage_error"] is None,
               timeout=10, message="the pool status (cached for a second) to clear")
    assert api.get("/health").status_code == 200
    services.batch_finalize(batch_id=batch.id)
    batch.refresh_from_db()
    assert (batch.status, batch.error) == (BatchStatus.COMPLETED, None)
    assert (batch.total, batch.completed, batch.failed) == (20, 20, 0)
    content = output.read_bytes()
    assert content.startswith(written)
    assert sorted(output_ids(content)) == sorted(f"req-{i}" for i in range(20))


def test_full_disk_pauses_the_worker_and_hands_back_what_it_has_not_started(
        runtime, in_thread, full_disk, batch_in_progress, monkeypatch):
    # Given: a batch of three chunks; the second is claimed just before the disk is
    # seen full (its claim returns only once the first chunk waits on the full disk)
    batch = batch_in_progress(30, chunk_size=10)
    first, second, third = Chunk.objects.filter(batch=batch).order_by("index")
    real_claim = runtime.database.claim

    def claim_as_the_disk_fills(chunk_id):
        work = real_claim(chunk_id)
        if chunk_id == second.id and work.attempts == 1:
            wait_until(lambda: runtime.storage_error, timeout=30,
                       message="the first chunk to find the disk full")
        return work

    monkeypatch.setattr(runtime.database, "claim", claim_as_the_disk_fills)
    full_disk["full"] = True
    holding = in_thread(runtime.run_chunk, first.id)
    handed_back = in_thread(runtime.run_chunk, second.id)

    # Then: the chunk not started is handed back at once, nothing of it run or counted
    assert handed_back.result(timeout=30).endswith("released, storage full")
    second.refresh_from_db()
    assert (second.status, second.worker, second.completed) == (ChunkStatus.QUEUED, "", 0)
    # ...the worker stopped consuming its queue, and a chunk delivered meanwhile is
    # refused unclaimed, so its message goes back to the broker
    assert runtime.queue_switch.paused == [True]
    with pytest.raises(Reject):
        runtime.run_chunk(third.id)
    third.refresh_from_db()
    assert (third.status, third.worker, third.attempts) == (ChunkStatus.QUEUED, "", 0)
    assert not holding.done()  # the first holds its results and retries

    # When: there is room again
    full_disk["full"] = False

    # Then: the worker consumes its queue again and runs the rest; every custom_id once
    assert holding.result(timeout=30).endswith("10 completed, 0 failed")
    assert runtime.queue_switch.paused == [True, False]
    assert runtime.run_chunk(second.id).endswith("10 completed, 0 failed")
    assert runtime.run_chunk(third.id).endswith("10 completed, 0 failed")
    services.batch_finalize(batch_id=batch.id)
    batch.refresh_from_db()
    assert (batch.status, batch.error) == (BatchStatus.COMPLETED, None)
    assert (batch.completed, runtime.completed) == (30, 30)
    content = storage.absolute(storage.incremental_name(batch.id)).read_bytes()
    assert sorted(output_ids(content)) == sorted(f"req-{i}" for i in range(30))


def test_batch_cancelled_while_the_disk_is_full_keeps_what_was_written(
        runtime, full_disk, half_run_batch, waiting_chunk, api):
    batch, second, written, output = half_run_batch
    running = waiting_chunk()

    # When: the user cancels it
    services.batch_cancel(batch_id=batch.id)

    # Then: the chunk gives up its held results (uncounted) and closes; the batch is
    # cancelled with the first chunk's output, and counts that match the file
    assert running.result(timeout=30).endswith("0 completed, 0 failed")
    services.batch_finalize(batch_id=batch.id)
    batch.refresh_from_db()
    assert (batch.status, batch.error) == (BatchStatus.CANCELLED, None)
    assert output.read_bytes() == written
    assert (batch.completed, batch.failed) == (len(output_ids(written)), 0) == (10, 0)
    # ...and the worker stays paused while the disk is full: giving results up is no
    # sign of room; a probe write at a heartbeat is
    assert api.get("/health").status_code == 503
    assert runtime.queue_switch.paused == [True]
    full_disk["full"] = False
    # (the heartbeat's thread clears the error, then switches the queue back on)
    wait_until(lambda: runtime.queue_switch.paused == [True, False], timeout=10,
               message="the heartbeat's probe to find room and resume the queue")
    assert not runtime.storage_error


def test_worker_stopped_while_the_disk_is_full_hands_the_chunk_back(
        runtime, runtime_factory, full_disk, half_run_batch, waiting_chunk):
    batch, second, written, output = half_run_batch
    running = waiting_chunk()

    # When: the worker is stopped (a deploy, a scale-down)
    runtime.stop()

    # Then: the chunk goes back to the queue at once with nothing counted; the batch
    # still shows why it waits
    assert running.result(timeout=30).endswith("released, worker stopping")
    second.refresh_from_db()
    assert (second.status, second.completed, second.worker) == (ChunkStatus.QUEUED, 0, "")
    assert storage_error_of(batch) == "storage_full"
    assert output.read_bytes() == written

    # When: there is room and another worker takes the chunk
    full_disk["full"] = False
    other = runtime_factory()
    assert other.run_chunk(second.id).endswith("10 completed, 0 failed")

    # Then: the batch completes, every custom_id once, the error gone
    services.batch_finalize(batch_id=batch.id)
    batch.refresh_from_db()
    assert (batch.status, batch.error) == (BatchStatus.COMPLETED, None)
    assert (batch.total, batch.completed, batch.failed) == (20, 20, 0)
    content = output.read_bytes()
    assert content.startswith(written)
    assert sorted(output_ids(content)) == sorted(f"req-{i}" for i in range(20))


# --- the other writes: uploads and the order file of validation ---------------------------


class FillingFile:
    """A file object on a volume with `room` bytes left: writes past it fail, and so
    does closing it after that, as a buffered file's close fails to flush the bytes
    it still holds (seen on a full tmpfs)."""

    def __init__(self, raw, room: int):
        self.raw, self.room, self.full = raw, room, False

    def write(self, data) -> int:
        if len(data) > self.room:
            self.full = True
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.raw.write(data)

    def close(self):
        self.raw.close()
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.raw, name)


def test_upload_to_a_full_disk_is_refused_with_507_and_leaves_nothing(
        api, monkeypatch, settings):
    from files.upload import StreamingUploadHandler

    real_new_file = StreamingUploadHandler.new_file

    def new_file(handler, *args, **kwargs):
        real_new_file(handler, *args, **kwargs)
        handler.file = FillingFile(handler.file, room=1024 * 1024)

    monkeypatch.setattr(StreamingUploadHandler, "new_file", new_file)
    content = jsonl([chat_line(f"req-{i}", "x" * 1000) for i in range(3000)])  # ~3.3 MB

    response = api.post("/v1/files", {"purpose": "batch", "file": _named(content)},
                        format="multipart")

    error = error_of(response, 507)
    assert (error["type"], error["code"]) == ("server_error", "storage_full")
    assert "storage volume is full" in error["message"]
    assert not list(settings.UPLOADS_DIR.iterdir())  # the partial upload is gone
    assert api.get("/v1/files").json()["data"] == []


def test_batch_whose_order_file_does_not_fit_fails_with_storage_full(
        upload, published, monkeypatch, settings):
    from batches.chunking import PrefixGroupingChunker

    settings.BATCHGEN_PREFIX_GROUPING = True

    def no_room(chunker):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PrefixGroupingChunker, "_flush", no_room)
    file = upload(jsonl([chat_line(f"req-{i}") for i in range(5)]))
    batch = services.batch_create(input_file_id=file["id"], endpoint="/v1/chat/completions",
                                  model="sim")

    batch = services.batch_validate(batch_id=batch.id)

    assert batch.status == BatchStatus.FAILED
    assert batch.error["code"] == "storage_full"
    assert "nothing was queued" in batch.error["message"]
    assert not Chunk.objects.filter(batch=batch).exists()
    assert not storage.absolute(storage.order_name(batch.id)).exists()


def _named(content: bytes):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile("input.jsonl", content, content_type="application/jsonl")


@pytest.mark.skipif("os.environ.get('DATABASE_URL', 'sqlite').startswith('postgres')",
                    reason="SQLite's page cap stands in for the database's volume filling up")
def test_database_volume_full_is_a_507_not_a_500(api, settings):
    from django.db import connection

    # Given: the database cannot grow (SQLite then says "database or disk is full",
    # as on a full volume), and its free pages are taken
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA page_count")
        cursor.execute(f"PRAGMA max_page_count = {cursor.fetchone()[0] + 2}")
        cursor.execute("CREATE TABLE disk_filler (b BLOB)")
        try:
            for _ in range(1000):
                cursor.execute("INSERT INTO disk_filler VALUES (randomblob(1000))")
        except Exception as exc:
            assert "full" in str(exc)
    try:
        # When: files are uploaded until one's row does not fit
        for _ in range(100):
            response = api.post("/v1/files", {"purpose": "batch", "file": _named(
                jsonl([chat_line("req-0")]))}, format="multipart")
            if response.status_code != 200:
                break
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE disk_filler")
            cursor.execute("PRAGMA max_page_count = 4294967294")

    # Then: 507 storage_full in the envelope, not a 500; the refused upload's bytes
    # are gone with it
    error = error_of(response, 507)
    assert (error["type"], error["code"]) == ("server_error", "storage_full")
    assert len(list(settings.UPLOADS_DIR.iterdir())) == File.objects.count()
