"""The inference worker's runtime: one engine, its event loop, the slots, the
heartbeat, and the loop that runs a chunk, each a role of its own that
InferenceRuntime composes:

- inference.engine_host.EngineHost: the engine's life on its asyncio loop (start,
  replacement at a model swap, loss, stop) and the slots that admit requests into it.
- inference.chunk_loop.ChunkRunner: the loop that runs a chunk, on Celery's task
  thread that holds it (the threads pool; its size lets the worker hold enough chunks
  to fill every slot). It reads the chunk through inference.chunk_input.ChunkInput and
  writes through the ledger, as all ORM work goes through inference.database.
- inference.storage_pause.StoragePause: the pause while the storage volume is full.
- inference.heartbeat.Heartbeat: the flusher thread, which sends the chunk ledger
  (inference.ledger) to the database in one transaction per interval, and the
  heartbeat (liveness, slot figures, lease renewal, which batches must stop).
- inference.swap.ModelSwapper (a multiplexing worker): drives the runtime through
  its SwapHost interface, which InferenceRuntime implements below.

Threads of one worker process: Celery's task threads, one per chunk in hand; the
engine loop; two DB threads (inference.database), so a worker holds at most two
database connections however many chunks it runs; the flusher; the swapper.

Stopping: on SIGTERM Celery begins a warm shutdown and `drain()` runs at once: every
chunk in hand stops its requests and is handed back to the queue (not after its
lease runs out), then the pool's threads end and `stop()` shuts the engine down.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import psutil
from django.conf import settings

from core.publishing import publish
from core.termination import TERMINATION_LOG_ENV
from inference.chunk_input import ChunkInput
from inference.chunk_loop import ChunkRunner
from inference.database import WorkerDatabase
from inference.engine_host import (  # noqa: F401 (NO_MODEL, fits_host_memory: importers)
    NO_MODEL,
    EngineHost,
    engine_config_from_settings,
    fits_host_memory,
)
from inference.engines import Engine, EngineConfig
from inference.heartbeat import Heartbeat
from inference.ledger import ChunkLedger
from inference.slots import SlotPool
from inference.storage_pause import StoragePause
from inference.swap import ModelSwapper
from inference.worker_state import WorkerState

logger = logging.getLogger("batchgen.inference")

STOP_DRAIN_SECONDS = 30.0  # at stop, the longest wait for chunks to be handed back


class InferenceRuntime:
    """One inference worker: its roles, composed. What others read of the worker
    (its queue switch, the tests) goes through the properties here."""

    def __init__(self, *, config: EngineConfig, capacity: int, name: str | None = None,
                 multiplex: bool = False) -> None:
        self.state = WorkerState(name=name or "", multiplex=multiplex)
        self.name = self.state.name
        self.engines = EngineHost(config=config, capacity=capacity, state=self.state)
        self.database = WorkerDatabase(self.name)
        self.ledger = ChunkLedger(self.database.flush)
        self.heartbeat = Heartbeat(state=self.state, engines=self.engines,
                                   database=self.database, ledger=self.ledger)
        self.storage = StoragePause(state=self.state, database=self.database,
                                    ledger=self.ledger, heartbeat=self.heartbeat.beat_once)
        self.heartbeat.at_beat = self.storage.probe  # probe for room at every beat
        self.chunks = ChunkRunner(state=self.state, engines=self.engines, ledger=self.ledger,
                                  database=self.database, storage=self.storage,
                                  chunk_input=ChunkInput())
        self.swapper: ModelSwapper | None = None

    # --- what others read -------------------------------------------------------------

    multiplex = property(lambda self: self.state.multiplex)
    ready = property(lambda self: self.state.ready)
    draining = property(lambda self: self.state.draining)
    swapping = property(lambda self: self.state.swapping)
    failed = property(lambda self: self.state.failed)
    config = property(lambda self: self.engines.config)
    served_model = property(lambda self: self.engines.config.served_model_name)
    storage_error = property(lambda self: self.state.storage_error)
    completed = property(lambda self: self.state.completed)
    stop_batches = property(lambda self: self.ledger.stop_batches)

    @property
    def queue_switch(self):
        """inference.signals.QueueSwitch, set once the Celery worker is ready."""
        return self.state.queue_switch

    @queue_switch.setter
    def queue_switch(self, switch) -> None:
        self.state.queue_switch = switch

    @property
    def engine(self) -> Engine | None:
        return self.engines.engine

    @property
    def slots(self) -> SlotPool:
        return self.engines.slots

    # --- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        self.engines.start_loop()
        if self.database.reap_host(hostname=self.state.hostname, pid_alive=psutil.pid_exists):
            publish("batches.recover_chunks")
        self.heartbeat.beat_once()
        self.heartbeat.start()
        if self.multiplex:
            self.ready.set()  # nothing to start: chunks come once a model is resident
            logger.info("inference worker %s multiplexing: it holds the model the residency "
                        "scheduler gives it, slots=%s", self.name, self.slots.capacity)
            return
        self.engines.start()
        logger.info("inference worker %s starting engine=%s model=%s slots=%s", self.name,
                    self.config.engine, self.config.served_model_name, self.slots.capacity)

    def start_swapper(self) -> None:
        """A multiplexing worker obeys the residency scheduler from now on (once its
        queue switch is in place: a swap changes the queue it consumes)."""
        if self.multiplex and self.swapper is None:
            self.swapper = ModelSwapper(self).start()

    def run_chunk(self, chunk_id: int, queue: str | None = None) -> str:
        return self.chunks.run_chunk(chunk_id, queue=queue)

    def switch_queue(self) -> None:
        """Consume this worker's queue, or not, as its storage and swap now say."""
        self.state.switch_queue()

    def exit_code(self) -> int | None:
        """EX_CONFIG (78, sysexits' "configuration error", which systemd's
        RestartPreventExitStatus= and `serve`'s supervisor honour) when these settings
        can never start the engine; None otherwise (Celery's own code stands)."""
        return os.EX_CONFIG if self.state.permanent_failure else None

    def termination_message(self) -> str:
        """One line saying why this worker stopped for good (see exit_code())."""
        return (f"the {self.config.engine} engine of model {self.config.served_model_name} "
                f"cannot start with these settings: {self.failed}")

    def drain(self) -> None:
        """Warm shutdown began: chunks in hand stop and go back to the queue now."""
        if not self.draining.is_set():
            self.draining.set()
            logger.info("inference worker %s draining: handing %s chunk(s) back", self.name,
                        self.ledger.held)
            self.storage.wake_waiters()

    def stop(self) -> None:
        if self.state.stopping.is_set():
            return
        self.drain()
        # Chunk threads hand their chunks back through the flusher, still running.
        if not self.ledger.wait_until_empty(STOP_DRAIN_SECONDS):
            logger.warning("%s chunk(s) not handed back in %s s; their leases will expire",
                           self.ledger.held, STOP_DRAIN_SECONDS)
        self.state.stopping.set()
        try:
            self.heartbeat.flush_once()  # what the last chunks said, before the worker goes
            self.database.stopped()
            self.engines.shutdown()
        except Exception:
            logger.exception("error while stopping the inference runtime")
        finally:
            self.ledger.fail_waiting(RuntimeError("the inference worker stopped"))
            self.engines.stop_loop()
            self.database.close()

    # --- the swapper's interface (inference.swap.SwapHost) ------------------------------

    def stopped(self) -> bool:
        return self.state.stopping.is_set() or self.state.going_away()

    def pause(self, seconds: float) -> None:
        self.draining.wait(seconds)

    def chunks_held(self) -> int:
        return self.ledger.held

    def wait_handed_back(self, seconds: float) -> bool:
        return self.ledger.wait_until_empty(seconds)

    def swap_began(self) -> None:
        self.swapping.set()
        self.heartbeat.beat()
        self.switch_queue()

    def cancel_in_flight(self) -> None:
        self.state.swap_cancel.set()

    def swap_ended(self) -> None:
        self.state.swap_cancel.clear()
        self.swapping.clear()
        self.heartbeat.beat()
        self.switch_queue()

    def replace_engine(self, model_id: str) -> float:
        return self.engines.replace(model_id)

    def engine_lost(self, error: BaseException, what: str) -> None:
        self.engines.engine_lost(error, what)


_runtime: InferenceRuntime | None = None
_runtime_lock = threading.Lock()
_runtime_wanted = False


def want_runtime() -> None:
    """This process is an inference worker: it will own an engine."""
    global _runtime_wanted
    _runtime_wanted = True


def get_runtime() -> InferenceRuntime | None:
    """The process's runtime, started on first use (None outside inference workers)."""
    global _runtime
    if _runtime is None and _runtime_wanted:
        with _runtime_lock:
            if _runtime is None:
                multiplex = settings.BATCHGEN_MULTIPLEX
                runtime = InferenceRuntime(
                    config=NO_MODEL if multiplex else engine_config_from_settings(),
                    capacity=settings.BATCHGEN_MAX_POOL_SIZE, multiplex=multiplex)
                runtime.start()
                _runtime = runtime
    return _runtime


def stop_runtime() -> None:
    if _runtime is not None:
        _runtime.stop()


def runtime_exit_code() -> int | None:
    """The code this worker must exit with once stopped (None: Celery's own): EX_CONFIG
    when its engine can never start with these settings, having written the one line
    that says why to the supervisor's termination log."""
    if _runtime is None or _runtime.exit_code() is None:
        return None
    # Where the supervisor that started this process reads why it ended, as Kubernetes
    # reads a container's terminationMessagePath (batchgen_site/supervisor.py).
    path = os.environ.get(TERMINATION_LOG_ENV)
    if path:
        try:
            Path(path).write_text(_runtime.termination_message() + "\n")
        except OSError:
            logger.exception("could not write the termination log %s", path)
    return _runtime.exit_code()


def drain_runtime() -> None:
    if _runtime is not None:
        _runtime.drain()
