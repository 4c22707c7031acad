"""The storage volume fills up under a running server (a small tmpfs; root only, see
test_disk_full_in_process.py for the same without root).

While results cannot be appended, the chunks hold them under their leases and retry,
and the worker stops consuming its queue; the batch waits with `error.code ==
"storage_full"`, /health answers 503 and /v1/pool/status names the cause; nothing
already written is lost or half-written. Once the volume has room the worker
consumes again and the batch completes, every custom_id once. An upload that does
not fit, sent with a length or chunked, is refused with 507 and leaves nothing
behind."""

from __future__ import annotations

import collections
import json

import pytest

from tests.e2e.harness import chat_lines, output_ids, wait_until
from tests.faults.faults import (
    SmallDisk,
    assert_each_custom_id_once,
    request_ids,
)

KIB = 1024


@pytest.fixture
def small_disk():
    disks: list[SmallDisk] = []

    def _mount(path, size: int) -> SmallDisk:
        disks.append(SmallDisk(path, size).mount())
        return disks[-1]

    yield _mount
    for disk in disks:
        disk.unmount()


def test_disk_full_while_appending_waits_with_a_clear_error_and_resumes(
        small_disk, start_server):
    # Given: the incremental files live on a 256 KiB volume (a tmpfs), and a batch
    # whose results need about 2 MiB
    disks: list[SmallDisk] = []
    server, api = start_server(
        prepare=lambda storage: disks.append(small_disk(storage / "incremental", 256 * KIB)),
        BATCHGEN_SIM_LATENCY_MS="20", BATCHGEN_MAX_POOL_SIZE="100", BATCHGEN_CHUNK_SIZE="50",
        BATCHGEN_CHUNK_LEASE_SECONDS="5")
    disk = disks[0]
    count = 3_000
    input_file = api.upload(chat_lines(count))

    # When: the volume fills up
    batch = api.create_batch(input_file["id"]).json()
    output = server.storage / "incremental" / f"{batch['id']}.jsonl"

    # Then: the batch waits and says why, and so do /health and /v1/pool/status
    waiting = wait_until(
        lambda: (b := api.batch(batch["id"]))["error"] and b, timeout=120,
        message="the batch to show the full storage")
    assert waiting["status"] == "in_progress", waiting
    assert waiting["error"]["code"] == "storage_full"
    health = api.http.get("/health")
    assert health.status_code == 503
    assert health.json()["reason"].startswith("storage full:")
    assert "No space left on device" in api.pool()["storage_error"]
    log = server.log(tail=1_000_000)
    assert "storage full: cannot append results" in log
    # ...and the worker stopped consuming its queue (Celery's own line)
    wait_until(lambda: "Canceling queue inference" in server.log(tail=1_000_000), timeout=30,
               message="the inference worker to stop consuming its queue")
    # ...and the file holds whole, distinct results only; request_counts never count
    # more than it holds
    written = output.read_bytes()
    assert written.endswith(b"\n")
    ids = output_ids(written)
    for raw in written.splitlines():
        json.loads(raw)
    assert not [cid for cid, n in collections.Counter(ids).items() if n > 1]
    assert api.batch(batch["id"])["request_counts"]["completed"] <= len(ids)

    # When: the volume grows (an operator makes room)
    disk.resize(64 * 1024 * KIB)

    # Then: the batch completes without the error; what was written before is still
    # there, unchanged, and every custom_id is in the output once
    done = api.wait_status(batch["id"], {"completed", "failed", "cancelled"}, timeout=120)
    assert (done["status"], done["error"]) == ("completed", None)
    assert_each_custom_id_once(api, done, request_ids(count))
    assert api.content(done["output_file_id"]).startswith(written)
    wait_until(lambda: api.pool()["storage_error"] is None, timeout=30,
               message="the pool status to clear the storage error")
    assert api.http.get("/health").status_code == 200
    assert "Started consuming from inference" in server.log(tail=1_000_000)


def test_upload_that_does_not_fit_is_refused_with_507_and_leaves_nothing(
        small_disk, start_server):
    # Given: uploads land on a 256 KiB volume
    disks: list[SmallDisk] = []
    server, api = start_server(
        prepare=lambda storage: disks.append(small_disk(storage / "uploads", 256 * KIB)))
    content = chat_lines(2_000)  # about 500 KiB
    assert len(content) > 256 * KIB

    # When: a file larger than the room left is uploaded
    response = api.http.post("/v1/files", files={"file": ("big.jsonl", content)},
                             data={"purpose": "batch"})

    # Then: 507 in the error envelope; no partial file stays, no file is listed
    assert response.status_code == 507, response.text
    assert response.json()["error"]["code"] == "storage_full"
    assert list((server.storage / "uploads").iterdir()) == []
    assert api.http.get("/v1/files").json()["data"] == []

    # The same sent chunked (no length known before the volume fills)
    boundary = "batchgen-disk-full"

    def chunked_body():
        yield (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
               f'batch\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
               'filename="big.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n').encode()
        for at in range(0, len(content), 16 * KIB):
            yield content[at:at + 16 * KIB]
        yield f"\r\n--{boundary}--\r\n".encode()

    response = api.http.post("/v1/files", content=chunked_body(), headers={
        "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert response.status_code == 507, response.text
    assert response.json()["error"]["code"] == "storage_full"
    assert list((server.storage / "uploads").iterdir()) == []
    assert api.http.get("/v1/files").json()["data"] == []

    # When: there is room, the same upload succeeds, byte for byte
    disks[0].resize(64 * 1024 * KIB)
    stored = api.upload(content)
    assert api.content(stored["id"]) == content
