"""The storage volume fills up while workers append results: appends fail with
ENOSPC, nothing already written is lost or half-written, the batch waits, and it
completes once there is room again."""

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


def test_disk_full_while_appending_loses_nothing_and_resumes(small_disk, start_server):
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
    # A full tmpfs takes what fits and returns a short write, or fails with ENOSPC
    # once not a byte fits; append_lines cuts the file back and raises on either.
    def append_failed() -> bool:
        log = server.log(tail=1_000_000)
        return "No space left on device" in log or f"short write to {output}" in log

    wait_until(append_failed, timeout=120, message="an append to fail on the full disk")

    # Then: the batch waits; the file holds whole, distinct results only, and
    # request_counts never count more than the file holds
    written = output.read_bytes()
    assert written.endswith(b"\n")
    ids = output_ids(written)
    for raw in written.splitlines():
        json.loads(raw)
    assert not [cid for cid, n in collections.Counter(ids).items() if n > 1]
    waiting = api.batch(batch["id"])
    assert waiting["status"] == "in_progress", waiting
    assert waiting["request_counts"]["completed"] <= len(ids)

    # ...and it keeps waiting through the chunks' lease expiry and requeue (each
    # retry fails again) without losing what is on disk
    wait_until(lambda: "requeued" in server.log(tail=1_000_000), timeout=60,
               message="a chunk requeued after its lease ran out")
    assert output.read_bytes().startswith(written)
    assert api.batch(batch["id"])["status"] == "in_progress"

    # When: the volume grows (an operator makes room)
    disk.resize(64 * 1024 * KIB)

    # Then: the batch completes; what was written before is still there, unchanged
    done = api.wait_status(batch["id"], {"completed", "failed", "cancelled"}, timeout=120)
    assert_each_custom_id_once(api, done, request_ids(count))
    assert api.content(done["output_file_id"]).startswith(written)
