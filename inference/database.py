"""The inference worker's database calls, by name, on a small pool of threads.

All of a worker's ORM work runs on `DB_THREADS` threads, so a worker holds at most
that many database connections however many chunks it runs. Each call closes stale
connections first, so a connection the database dropped is replaced, and the
services it calls retry transient errors themselves (core.transient).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections, connection

from batches import chunks
from batches.chunks import ChunkWork, Counts, FlushResult
from batches.services import batch_storage_full, batch_storage_resumed
from batches.usage import Usage
from fleet.services import worker_heartbeat, worker_stopped
from inference.services import worker_reap_host

logger = logging.getLogger("batchgen.inference")

DB_THREADS = 2


def _call(fn, kwargs):
    close_old_connections()
    try:
        return fn(**kwargs)
    finally:
        close_old_connections()


class WorkerDatabase:
    def __init__(self, worker: str) -> None:
        self.worker = worker
        self._executor = ThreadPoolExecutor(max_workers=DB_THREADS,
                                            thread_name_prefix="batchgen-db")

    def _run(self, fn, **kwargs):
        return self._executor.submit(_call, fn, kwargs).result()

    # --- chunks (batches.chunks) ----------------------------------------------------------

    def claim(self, chunk_id: int) -> ChunkWork | None:
        return self._run(chunks.chunk_claim, chunk_id=chunk_id, worker=self.worker)

    def flush(self, *, progress: dict[int, Counts], closing: dict[int, Counts],
              releasing: dict[int, Counts], holding: Iterable[int],
              usage: dict[int, Usage] | None = None,
              segments: dict[int, list[tuple[str, int]]] | None = None) -> FlushResult:
        return self._run(chunks.chunks_flush, worker=self.worker, progress=progress,
                         closing=closing, releasing=releasing, holding=list(holding),
                         usage=usage, segments=segments)

    # --- batches shown waiting on a full volume ---------------------------------------------

    def storage_full(self, batch_id: str) -> None:
        self._run(batch_storage_full, batch_id=batch_id)

    def storage_resumed(self, batch_id: str) -> None:
        self._run(batch_storage_resumed, batch_id=batch_id)

    # --- this worker's own row ------------------------------------------------------------

    def heartbeat(self, **figures) -> None:
        self._run(worker_heartbeat, name=self.worker, **figures)

    def stopped(self) -> None:
        self._run(worker_stopped, name=self.worker)

    def reap_host(self, *, hostname: str, pid_alive) -> int:
        return self._run(worker_reap_host, hostname=hostname, current=self.worker,
                         pid_alive=pid_alive)

    def call(self, fn, **kwargs):
        """Any other service of this worker's (model residency, inference/swap.py)."""
        return self._run(fn, **kwargs)

    def close(self) -> None:
        """Close the DB threads' connections (one task per thread, held at a barrier
        so each thread runs exactly one), then the threads."""
        barrier = threading.Barrier(DB_THREADS)

        def close_one() -> None:
            connection.close()
            barrier.wait(timeout=10)

        for future in [self._executor.submit(close_one) for _ in range(DB_THREADS)]:
            try:
                future.result(timeout=15)
            except Exception:
                logger.warning("a database connection did not close cleanly")
        self._executor.shutdown(wait=False)
