"""SIGKILL of the control worker (validation, finalization, dispatch ticks, recovery)
mid-validation and mid-finalization: the supervisor restarts it, recovery finishes
what the dead worker held, and the output holds each custom_id exactly once."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal

from tests.e2e.harness import chat_lines, wait_until
from tests.faults.faults import (
    assert_each_custom_id_once,
    chunk_counts,
    poll_fast,
    query,
    request_ids,
    sigkill,
    wait_restarted,
)

CONTROL = "-Q control"
FINISHED = {"completed", "failed", "cancelled"}


def test_control_worker_killed_mid_validation_validates_again(start_server):
    # Given: an input large enough that validation takes a while (200,000 lines,
    # about half a second of streaming), and lost validations retried after 5 s
    # instead of 10 minutes.
    server, api = start_server(BATCHGEN_VALIDATION_TIMEOUT_SECONDS="5")
    count = 200_000
    input_file = api.upload(chat_lines(count))
    input_path = str(server.storage / "uploads" / f"{input_file['id']}.jsonl")
    control = wait_until(lambda: server.children(CONTROL), timeout=30,
                         message="the control worker")

    def reading_input() -> bool:
        for process in control:
            try:
                fds = os.listdir(f"/proc/{process.pid}/fd")
            except OSError:
                continue
            for fd in fds:
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{process.pid}/fd/{fd}") == input_path:
                        return True
        return False

    # When: the control worker is SIGKILLed while it streams the input file. (At
    # the lowest CPU priority: on a busy machine validation then takes longer, never
    # shorter, so the kill still lands inside it.)
    for process in control:
        process.nice(19)
    batch = api.create_batch(input_file["id"]).json()
    poll_fast(reading_input, timeout=60, message="the control worker to read the input")
    killed = sigkill(server, CONTROL)

    # Then: the kill landed mid-validation: nothing was admitted...
    stalled = api.batch(batch["id"])
    assert stalled["status"] == "validating", stalled
    assert stalled["request_counts"]["total"] == 0
    assert chunk_counts(server, batch["id"]) == {}
    # ...the supervisor restarts the worker, recovery validates again, and the batch
    # completes with every request exactly once.
    wait_restarted(server, CONTROL, killed)
    done = api.wait_status(batch["id"], FINISHED, timeout=300)
    assert_each_custom_id_once(api, done, request_ids(count))
    log = server.log(tail=1_000_000)
    assert "restarting" in log
    assert "1 validation(s) restarted" in log


def unpublished_chunks(server) -> list:
    """Chunks dispatched (queued) whose message is not published yet."""
    return query(server, "SELECT id FROM batches_chunk WHERE status = 'queued' "
                 "AND published_at IS NULL")


def freeze_between_dispatches(server, control) -> None:
    """SIGSTOP the control worker, but not between a dispatch's commit and its
    publish: a chunk it dispatched and had not published yet would wait for it, and
    the batch's chunks would never all close while it is frozen. Frozen there, it is
    let go until the publish is done and frozen again. (The inference worker
    publishes what its own flushes dispatch, frozen control or not.)"""
    for _ in range(10):
        for process in control:
            process.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: not unpublished_chunks(server), timeout=3,
                       message="the chunks dispatched before the freeze to be published")
            return
        except TimeoutError:
            for process in control:
                process.send_signal(signal.SIGCONT)
            wait_until(lambda: not unpublished_chunks(server), timeout=30,
                       message="the thawed control worker to publish what it dispatched")
    raise AssertionError("the control worker was frozen mid-dispatch ten times running")


def test_control_worker_killed_mid_finalization_finalizes_once(start_server):
    # Given: a running batch
    server, api = start_server(BATCHGEN_SIM_LATENCY_MS="300", BATCHGEN_MAX_POOL_SIZE="1000")
    count = 10_000
    input_file = api.upload(chat_lines(count))
    batch = api.create_batch(input_file["id"]).json()
    api.wait_status(batch["id"], {"in_progress"}, timeout=60)
    wait_until(lambda: chunk_counts(server, batch["id"])["running"], timeout=30,
               message="a running chunk")
    output = server.storage / "incremental" / f"{batch['id']}.jsonl"

    # The control worker is frozen (SIGSTOP) until every chunk has closed, and the
    # incremental file's lock is held as a slow storage volume would hold it: once
    # thawed, the worker moves the batch to `finalizing` and blocks inside
    # finalization (batch row locked, output file not yet registered). That is where
    # it dies.
    control = server.children(CONTROL)
    freeze_between_dispatches(server, control)
    wait_until(lambda: not {"pending", "queued", "running"} & set(chunk_counts(server,
                                                                            batch["id"])),
               timeout=120, message="every chunk to close")
    lock = os.open(output, os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for process in control:
            process.send_signal(signal.SIGCONT)
        api.wait_status(batch["id"], {"finalizing"}, timeout=60)

        # When: the control worker is SIGKILLed mid-finalization
        killed = sigkill(server, CONTROL)
        assert api.batch(batch["id"])["status"] == "finalizing"
    finally:
        os.close(lock)
    assert query(server, "SELECT output_file_id FROM batches_batch WHERE id = ?",
                 (batch["id"],)) == [(None,)]

    # Then: the restarted worker's recovery finalizes the batch, once
    wait_restarted(server, CONTROL, killed)
    done = api.wait_status(batch["id"], FINISHED, timeout=120)
    assert_each_custom_id_once(api, done, request_ids(count))
    outputs = query(server, "SELECT id FROM files_file WHERE filename = ?",
                    (f"{batch['id']}_output.jsonl",))
    assert outputs == [(done["output_file_id"],)]
    assert "1 batch(es) finalized" in server.log(tail=1_000_000)
