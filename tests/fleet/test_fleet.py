"""The fleet on PostgreSQL and RabbitMQ: four inference workers (`serve
--inference-workers 4`) share a large and a small batch and a cancelled one while one
worker is SIGKILLed, one is stopped with SIGTERM and one more joins mid-batch.

What must hold: each custom_id exactly once, no 5xx on any call, the small batch done
before the large one is a quarter done, a stopped worker's chunks handed back at once
(the lease is 120 s: waiting for it would show), a joining worker running chunks
within seconds, and no error line (deadlock, a task that raised, a traceback) in any
process's log. The properties are gathered and asserted together at the end, so one
run reports every one that does not hold."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psutil

from tests.e2e.harness import chat_lines, output_ids, wait_until
from tests.faults.faults import assert_each_custom_id_once, request_ids
from tests.fleet.fleet import chunks_held, error_lines, one_worker, pg_query

FINISHED = {"completed", "failed", "cancelled"}
LARGE, SMALL, CANCELLED = 6_000, 80, 2_000
LEASE_SECONDS = 120
# 300 ms a request and 16 slots a worker: 53 requests/s per worker, so a chunk of 40
# runs for about two seconds (a stopping worker that ran its chunks to the end instead
# of handing them back would be seen doing it) and four workers stay within what two
# cores can orchestrate. The small batch waits behind the dispatch window (a few
# chunks per worker) and one chunk's time, about 5 s: a quarter of the large batch is
# about 7 s of work.
SETTINGS = {"BATCHGEN_SIM_LATENCY_MS": "300", "BATCHGEN_MAX_POOL_SIZE": "16",
            "BATCHGEN_CHUNK_SIZE": "40", "BATCHGEN_CHUNK_LEASE_SECONDS": str(LEASE_SECONDS)}
HAND_BACK_SECONDS = 10  # a stopped worker's chunks are queued again within this
JOIN_SECONDS = 30  # a joining worker (process start included) runs a chunk within this


def finished(batch: dict) -> int:
    return batch["request_counts"]["completed"] + batch["request_counts"]["failed"]


def test_four_workers_survive_kill_stop_and_join_with_exactly_once_output(
        fleet_backends, start_fleet):
    database_url, broker_url = fleet_backends
    fleet = start_fleet(workers=4, database_url=database_url, broker_url=broker_url,
                        **SETTINGS)
    api, server = fleet.api, fleet.server
    problems: list[str] = []

    def completed_of(batch_id: str, at_least: int) -> dict:
        return wait_until(lambda: finished(b := api.batch(batch_id)) >= at_least and b,
                          timeout=240, interval=0.25, message=f"{at_least} finished requests")

    # Given: a large batch running on the four workers, then a small one behind it
    # and one that will be cancelled
    large_file = api.upload(chat_lines(LARGE, prefix="large"))
    small_file = api.upload(chat_lines(SMALL, prefix="small"))
    cancel_file = api.upload(chat_lines(CANCELLED, prefix="cancel"))
    large = api.create_batch(large_file["id"]).json()
    api.wait_status(large["id"], {"in_progress"}, timeout=60)
    small_created = time.monotonic()
    small = api.create_batch(small_file["id"]).json()
    doomed = api.create_batch(cancel_file["id"]).json()

    # When: the small batch finishes, the third is cancelled once it runs
    small_done = api.wait_status(small["id"], FINISHED, timeout=120)
    large_then = finished(api.batch(large["id"]))
    if large_then >= LARGE / 4:
        problems.append(f"the small batch finished {time.monotonic() - small_created:.1f} s "
                        f"after its create, when the large one had {large_then} of {LARGE} "
                        "done")
    completed_of(doomed["id"], 1)
    cancelling = api.http.post(f"/v1/batches/{doomed['id']}/cancel")
    assert cancelling.status_code == 200, cancelling.text

    # When: one worker is SIGKILLed (the supervisor restarts it)
    completed_of(large["id"], LARGE // 10)
    killed = one_worker(server, 1)
    killed.send_signal(signal.SIGKILL)
    psutil.wait_procs([killed], timeout=10)

    # When: another is stopped with SIGTERM while it runs chunks, and a fifth worker
    # joins mid-batch
    completed_of(large["id"], LARGE // 5)
    stopped = stop_with_sigterm(server, database_url, number=2)
    problems.extend(stopped.problems_handing_back(database_url))
    joining, join_seconds = join(fleet, database_url, "inference5")
    if joining is None:
        problems.append(f"the joining worker ran no chunk within {JOIN_SECONDS} s")

    # Then: every batch ends, each custom_id once
    done = api.wait_status(large["id"], FINISHED, timeout=300)
    assert_each_custom_id_once(api, done, request_ids(LARGE, "large"))
    assert_each_custom_id_once(api, small_done, request_ids(SMALL, "small"))
    cancelled = api.wait_status(doomed["id"], FINISHED, timeout=120)
    assert cancelled["status"] == "cancelled", cancelled
    if cancelled.get("output_file_id"):
        ids = output_ids(api.content(cancelled["output_file_id"]))
        assert len(ids) == len(set(ids)) and set(ids) <= request_ids(CANCELLED, "cancel")

    # Then: the stopped worker ran none of its chunks on to the end after SIGTERM
    problems.extend(stopped.problems_running_on(database_url))
    problems.extend(f"5xx: {e}" for e in api.server_errors)
    problems.extend(error_lines(fleet.logs, expected_exits=[killed.pid, stopped.pid]))
    assert problems == [], (f"{len(problems)} problem(s) (joining worker's first chunk after "
                            f"{join_seconds} s):\n" + "\n".join(problems[:60]))


def wait_for(predicate, *, timeout: float, interval: float = 0.25) -> bool:
    try:
        wait_until(predicate, timeout=timeout, interval=interval)
    except TimeoutError:
        return False
    return True


@dataclass
class Stopped:
    """A worker stopped with SIGTERM: the chunks it ran at that moment, and when."""

    pid: int
    held: list[int]
    at: datetime
    handed_back: bool

    def problems_handing_back(self, database_url: str) -> list[str]:
        if self.handed_back:
            return []
        return [f"the stopped worker still held {chunks_held(database_url, self.pid)} "
                f"running chunk(s) {HAND_BACK_SECONDS} s after SIGTERM"]

    def problems_running_on(self, database_url: str, grace: float = 0.5) -> list[str]:
        """Its chunks it closed itself more than `grace` s after SIGTERM. A chunk
        thread notices the drain at its next turn, within a progress interval (0.5 s),
        so a chunk whose last results came in that turn may still close as done; one
        of these chunks takes about 2 s, and without the drain a chunk runs on for a
        second on average after the signal."""
        rows = pg_query(database_url,
                        "SELECT id, status, finished_at FROM batches_chunk WHERE id = ANY(%s) "
                        "AND worker LIKE %s AND finished_at > %s ORDER BY id",
                        (self.held, f"%:{self.pid}:%", self.at + timedelta(seconds=grace)))
        if not rows:
            return []
        late = {chunk_id: f"{status} at +{(finished - self.at).total_seconds():.1f} s"
                for chunk_id, status, finished in rows}
        return [f"the stopped worker kept running {len(late)} of its {len(self.held)} "
                f"chunks to the end after SIGTERM instead of handing them back: {late}"]


def stop_with_sigterm(server, database_url: str, *, number: int) -> Stopped:
    worker = one_worker(server, number)
    held = wait_until(lambda: running_chunks(database_url, worker.pid), timeout=60,
                      interval=0.1, message=f"inference{number} running chunks")
    at = datetime.now(UTC)
    worker.send_signal(signal.SIGTERM)
    handed_back = wait_for(lambda: chunks_held(database_url, worker.pid) == 0,
                           timeout=HAND_BACK_SECONDS)
    return Stopped(pid=worker.pid, held=held, at=at, handed_back=handed_back)


def join(fleet, database_url: str, name: str):
    """Start one more worker; it and the seconds it took to run a chunk, or None."""
    started = time.monotonic()
    worker = fleet.add_worker(name)
    took = wait_for(lambda: chunks_held(database_url, worker.process.pid) > 0,
                    timeout=JOIN_SECONDS, interval=0.1)
    return (worker if took else None), round(time.monotonic() - started, 1)


def running_chunks(database_url: str, pid: int) -> list[int]:
    return [row[0] for row in pg_query(
        database_url, "SELECT id FROM batches_chunk WHERE status = 'running' AND worker LIKE %s",
        (f"%:{pid}:%",))]
