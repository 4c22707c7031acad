"""A multiplexing inference worker's side of model residency: it holds the model the
scheduler (batches/residency.py) gives it, and swaps when told.

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

A new engine that fails to start does not take the worker down (it serves the other
models): the worker holds nothing again, its chunks having been handed back. A
permanent failure (EngineConfigError: these settings can never start the model) is
recorded on its Residency row with the root cause, and the scheduler never gives it
that model again while it lives; where no live worker can start a model, its batches
wait and then fail with `model_unavailable`, as on the pinned path
(batches/availability.py). A transient one is tried again after a pause, up to
START_TRIES times in a row, and then the worker exits as a pinned one does (its
supervisor starts a fresh one).

Once the swap is recorded (made or failed) the worker publishes a `residency.swap`
task (inference/tasks.py) that only reads it back: Flower shows each swap as a task,
its kwargs the worker and models, its result the outcome and seconds.

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
from typing import Protocol

from django.utils import timezone

from core.outage import noted_outage
from core.publishing import publish
from fleet import services as fleet_services
from inference.database import WorkerDatabase
from inference.engines import EngineConfigError

logger = logging.getLogger("batchgen.inference")

POLL_SECONDS = 0.5  # how often the worker reads its assignment (one indexed read)
OUTAGE_POLL_SECONDS = 1.0  # and while the database is away
# Requests in flight at a swap finish within this, or are handed back: on a GPU most
# finish in seconds; a CPU engine's long generations must not hold a waiting model.
SWAP_DRAIN_SECONDS = 20.0
HAND_BACK_SECONDS = 30.0  # then the cancelled ones' chunks are released within this
START_TRIES = 3  # a model's engine failing to start (transiently) this often in a row ...
START_RETRY_SECONDS = 5.0  # ... with this pause, times the tries, before each next one


class SwapHost(Protocol):
    """What the swapper asks of the worker it swaps (inference.runtime.InferenceRuntime
    is one): nothing else of the worker is the swapper's business."""

    name: str  # the worker's, as its Residency row knows it
    database: WorkerDatabase  # the worker's one port to the database

    @property
    def served_model(self) -> str:
        """The model the worker holds now; "" for none."""

    def stopped(self) -> bool:
        """The worker drains, stops or lost its engine: the swapper ends."""

    def pause(self, seconds: float) -> None:
        """Wait `seconds`, or less if the worker begins to drain."""

    def chunks_held(self) -> int: ...

    def wait_handed_back(self, seconds: float) -> bool:
        """Until every chunk held is closed, released or lost; whether they all were."""

    def swap_began(self) -> None:
        """No new request enters the engine; the worker shows itself not ready and
        stops consuming its model's queue."""

    def cancel_in_flight(self) -> None:
        """The requests still in flight are cancelled and their chunks handed back."""

    def swap_ended(self) -> None:
        """Take chunks again, of whatever model is held."""

    def replace_engine(self, model_id: str) -> float:
        """Hold `model_id`'s engine; the seconds the old one took to sleep or stop."""

    def engine_lost(self, error: BaseException, what: str) -> None:
        """The worker cannot go on: it stops (its supervisor starts a fresh one)."""


class ModelSwapper:
    def __init__(self, runtime: SwapHost) -> None:
        self.runtime = runtime
        self.swaps = 0
        self.start_failures: dict[str, int] = {}  # model -> transient failures in a row
        self.cannot_start: dict[str, str] = {}  # model -> why it never starts here
        self._thread = threading.Thread(target=self._run, name="model-swapper", daemon=True)

    def start(self) -> ModelSwapper:
        self._thread.start()
        return self

    def _stopped(self) -> bool:
        return self.runtime.stopped()

    def _run(self) -> None:
        runtime = self.runtime
        joined, assigned = False, None
        while not self._stopped():
            try:
                if not joined:
                    runtime.database.call(fleet_services.residency_join, worker=runtime.name,
                                          cannot_start=self.cannot_start)
                    joined = True
                assigned = runtime.database.call(fleet_services.residency_assigned,
                                                 worker=runtime.name)
                if assigned is None:
                    joined = False  # forgotten (a long outage): join again
                elif assigned[0] and assigned[0] != runtime.served_model:
                    self.swap(*assigned)
            except Exception as exc:
                if self._stopped():
                    return
                if noted_outage(exc):
                    # The database (or broker) away: said once; the assignment is read
                    # again when it answers, and a swap it interrupted is made again.
                    runtime.pause(OUTAGE_POLL_SECONDS)
                    continue
                runtime.engine_lost(exc, f"failed its swap to model {assigned and assigned[0]}")
                return
            runtime.pause(POLL_SECONDS)

    def swap(self, model: str, swap_id: int | None) -> None:
        runtime = self.runtime
        previous = runtime.served_model  # "": nothing yet
        held = previous or "nothing"
        logger.info("model swap: %s -> %s: handing back %s chunk(s)", held, model,
                    runtime.chunks_held())
        began, started_at = time.monotonic(), timezone.now()
        # Not ready from now: the dispatcher's window for the old model shrinks.
        runtime.swap_began()
        if not runtime.wait_handed_back(SWAP_DRAIN_SECONDS):
            runtime.cancel_in_flight()
            if not runtime.wait_handed_back(HAND_BACK_SECONDS):
                logger.warning("%s chunk(s) not handed back for the swap; their leases will "
                               "expire", runtime.chunks_held())
        drained = time.monotonic()
        try:
            stop_seconds = runtime.replace_engine(model)
        except Exception as exc:
            self._settle()
            if swap_id is not None:
                runtime.database.call(fleet_services.swap_record, swap_id=swap_id,
                                      started_at=started_at, finished_at=timezone.now(),
                                      drain_seconds=drained - began, seconds=None,
                                      error=str(exc))
                self._show(swap_id, previous, model)
            self._start_failed(model, exc)
            return
        seconds = time.monotonic() - drained
        self.start_failures.pop(model, None)
        self._settle()
        self.swaps += 1
        logger.info("model swap: %s -> %s took %.1f s (handing back %.1f s, engine stop "
                    "%.1f s, start %.1f s)", held, model, time.monotonic() - began,
                    drained - began, stop_seconds, seconds - stop_seconds)
        if swap_id is not None:
            runtime.database.call(fleet_services.swap_record, swap_id=swap_id,
                                  started_at=started_at, finished_at=timezone.now(),
                                  drain_seconds=drained - began, seconds=seconds)
            self._show(swap_id, previous, model)

    def _show(self, swap_id: int, previous: str, model: str) -> None:
        """Show the swap, once recorded, as a `residency.swap` task in Flower
        (inference/tasks.py). Only a view of the row: publish holds it through a
        broker outage, and a message lost or run twice changes nothing."""
        publish("residency.swap", (swap_id,), kwargs={
            "worker": self.runtime.name, "from_model": previous, "to_model": model})

    def _settle(self) -> None:
        """The swap is over (made or not): take chunks again, of whatever is held."""
        self.runtime.swap_ended()

    def _start_failed(self, model: str, error: Exception) -> None:
        """After `model`'s engine failed to start, this worker holding nothing: record
        a permanent failure so it is never given that model again, pause before trying
        a transient one again, or raise after START_TRIES in a row (the worker exits)."""
        runtime = self.runtime
        if isinstance(error, EngineConfigError):
            logger.error("model %s cannot start on this worker with these settings, and is "
                         "not given it again; it serves the other models: %s", model, error)
            self.cannot_start[model] = str(error)
            runtime.database.call(fleet_services.residency_cannot_start, worker=runtime.name,
                                  model=model, error=str(error))
            return
        tries = self.start_failures[model] = self.start_failures.get(model, 0) + 1
        if tries >= START_TRIES:
            raise error
        logger.warning("model %s failed to start (%s of %s tries), trying again in %.0f s: "
                       "%r", model, tries, START_TRIES, START_RETRY_SECONDS * tries, error)
        runtime.pause(START_RETRY_SECONDS * tries)
