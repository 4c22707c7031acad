"""A multiplexing inference worker's side of model residency: it holds the model the
scheduler (inference/residency.py) gives it, and swaps when told.

The swap, on this worker's swapper thread:

1. `swapping` is set: the worker stops consuming the old model's queue, no new request
   enters the engine, and a chunk delivered meanwhile (prefetched) is handed back to
   the broker unclaimed.
2. The chunks in hand run their requests in flight to the end (results written and
   accounted as ever) and hand the rest back: released, requeued at once for whichever
   worker holds the model next. Requests still in flight after SWAP_DRAIN_SECONDS
   are cancelled and handed back too (their chunk's redelivery skips what was
   written), so a swap's wait is bounded. Nothing is lost or run twice: what a chunk
   wrote is in its incremental file, and a redelivery runs only what is not.
3. The old engine stops (vLLM's engine core process ends, its memory freed), the new
   model's engine starts, and the worker consumes the new model's queue.

A worker killed at any step holds nothing the existing recovery does not put right:
chunks it had claimed are RUNNING under its lease, which its restart expires at once
(worker_reap_host) or which runs out, and recovery requeues them; messages it had
prefetched go back to the broker with its connection. The scheduler forgets the
worker once its heartbeat stops, and its model waits for the next worker.
"""

from __future__ import annotations

import logging
import threading
import time

from django.utils import timezone

from inference import residency

logger = logging.getLogger("batchgen.inference")

POLL_SECONDS = 0.5  # how often the worker reads its assignment (one indexed read)
# Requests in flight at a swap finish within this, or are handed back: on a GPU most
# finish in seconds; a CPU engine's long generations must not hold a waiting model.
SWAP_DRAIN_SECONDS = 20.0
HAND_BACK_SECONDS = 30.0  # then the cancelled ones' chunks are released within this


class ModelSwapper:
    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.swaps = 0
        self._thread = threading.Thread(target=self._run, name="model-swapper", daemon=True)

    def start(self) -> ModelSwapper:
        self._thread.start()
        return self

    def _stopped(self) -> bool:
        runtime = self.runtime
        return (runtime.draining.is_set() or runtime._stopping.is_set()
                or runtime.failed is not None)

    def _run(self) -> None:
        runtime = self.runtime
        joined, assigned = False, None
        while not self._stopped():
            try:
                if not joined:
                    runtime.database.call(residency.residency_join, worker=runtime.name)
                    joined = True
                assigned = runtime.database.call(residency.residency_assigned,
                                                 worker=runtime.name)
                if assigned is None:
                    joined = False  # forgotten (a long outage): join again
                elif assigned[0] and assigned[0] != runtime.config.served_model_name:
                    self.swap(*assigned)
            except Exception as exc:
                if self._stopped():
                    return
                runtime._engine_lost(exc, f"failed its swap to model {assigned and assigned[0]}")
                return
            runtime.draining.wait(POLL_SECONDS)

    def swap(self, model: str, swap_id: int | None) -> None:
        runtime = self.runtime
        held = runtime.config.served_model_name or "nothing"
        logger.info("model swap: %s -> %s: handing back %s chunk(s)", held, model,
                    runtime.ledger.held)
        began, started_at = time.monotonic(), timezone.now()
        runtime.swapping.set()
        runtime._beat()  # not ready: the dispatcher's window for the old model shrinks
        runtime._switch_queue()
        if not runtime.ledger.wait_until_empty(SWAP_DRAIN_SECONDS):
            runtime.swap_cancel.set()
            if not runtime.ledger.wait_until_empty(HAND_BACK_SECONDS):
                logger.warning("%s chunk(s) not handed back for the swap; their leases will "
                               "expire", runtime.ledger.held)
        drained = time.monotonic()
        stop_seconds = runtime.replace_engine(model)
        seconds = time.monotonic() - drained
        runtime.swap_cancel.clear()
        runtime.swapping.clear()
        self.swaps += 1
        runtime._beat()
        runtime._switch_queue()
        logger.info("model swap: %s -> %s took %.1f s (handing back %.1f s, engine stop "
                    "%.1f s, start %.1f s)", held, model, time.monotonic() - began,
                    drained - began, stop_seconds, seconds - stop_seconds)
        if swap_id is not None:
            runtime.database.call(residency.swap_record, swap_id=swap_id,
                                  started_at=started_at, finished_at=timezone.now(),
                                  drain_seconds=drained - began, seconds=seconds)
