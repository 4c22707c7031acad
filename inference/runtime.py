"""The inference worker's runtime: one engine, its event loop, the slots, the
heartbeat, and the loop that runs a chunk.

Threads of one worker process:
- Celery's task threads, one per chunk in hand (the threads pool; its size lets the
  worker hold enough chunks to fill every slot). A chunk's thread submits requests
  while slots are free, writes each finished one to the incremental file and
  accounts progress.
- The engine loop: an asyncio loop that owns the engine; every request is a task on it.
- Two DB threads (inference.database): all ORM work goes through them, so a worker
  holds at most two database connections however many chunks it runs.
- The flusher: sends the chunk ledger (inference.ledger) to the database in one
  transaction per interval, and the heartbeat (liveness, slot figures, lease
  renewal, which batches must stop).

Stopping: on SIGTERM Celery begins a warm shutdown and `drain()` runs at once: every
chunk in hand stops its requests and is handed back to the queue (not after its
lease runs out), then the pool's threads end and `stop()` shuts the engine down.

A full storage volume pauses the worker (docs/reliability.md, "Faults"): chunks holding
results they could not append keep them and retry; nothing new enters the engine;
chunks with nothing in flight are handed back; the worker stops consuming its queue
(`queue_switch`) and refuses, unclaimed, a chunk delivered meanwhile. It resumes by
itself when an append, or a probe write at a heartbeat, finds room again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from celery.exceptions import Reject
from django.conf import settings

from batches.chunks import ChunkWork, reconcile_counts
from batches.input_file import read_chunk
from batches.usage import Usage
from core.celery import inference_queue
from core.errors import is_storage_full
from core.outage import noted_outage
from core.publishing import publish
from core.termination import TERMINATION_LOG_ENV
from files.incremental import append_lines, probe_room, scan_results
from inference.database import WorkerDatabase
from inference.engines import (
    Engine,
    EngineConfig,
    EngineConfigError,
    EngineRequest,
    EngineResult,
    EngineUnavailable,
    LoraAdapter,
    engine_spec,
    load_engine,
)
from inference.ledger import ChunkLedger
from inference.output import format_line
from inference.slots import Cost, SlotPool, estimate_cost
from serving.endpoints import endpoint_spec

logger = logging.getLogger("batchgen.inference")

PROGRESS_INTERVAL = 0.5  # seconds a chunk thread waits for results before it looks round
# While the storage volume is full, a chunk holds its results and retries the
# append after these many seconds, doubling up to the cap.
STORAGE_RETRY_FIRST = 1.0
STORAGE_RETRY_MAX = 30.0
STOP_DRAIN_SECONDS = 30.0  # at stop, the longest wait for chunks to be handed back
# While the database is unreachable, a chunk's claim is tried again this often.
CLAIM_RETRY_SECONDS = 1.0
SHUTDOWN_SECONDS = 120.0  # at a swap, the longest wait for the old engine to stop
_CANCELLED = object()
_WAKE = object()  # put in a chunk's result queue: room was freed, it may be its turn


def engine_config_from_settings(model_id: str | None = None) -> EngineConfig:
    """The config of this worker's engine: its model (`model_id`, as a multiplexing
    worker is told, else BATCHGEN_WORKER_MODEL, else the default), the settings every
    engine reads, then those its spec names (serving/engines/registry.py)."""
    from serving.model_info import adapters_of, model_by_id, served_model

    model = served_model()
    model_id = model_id or settings.BATCHGEN_WORKER_MODEL
    if model_id:
        model = model_by_id(model_id)
        if model is None:
            raise RuntimeError(f"model {model_id!r} is not a served model (BATCHGEN_MODELS; "
                               "a LoRA adapter runs on its base model's workers)")
    return EngineConfig(
        engine=model.engine,
        model=model.path,
        served_model_name=model.id,
        # The server's cap, but never above this model's own length (with several
        # models one cap may exceed a small one's, which vLLM would refuse).
        max_context_length=(min(settings.BATCHGEN_MAX_CONTEXT_LENGTH, model.max_context_length)
                            if settings.BATCHGEN_MAX_CONTEXT_LENGTH and model.max_context_length
                            else settings.BATCHGEN_MAX_CONTEXT_LENGTH),
        token_budget=settings.BATCHGEN_TOKEN_BUDGET,
        # Its LoRA adapters: the chunks of their lines come to this model's queue.
        adapters=tuple(LoraAdapter(name=adapter.id, path=adapter.path)
                       for adapter in adapters_of(model.id)),
        **engine_spec(model.engine).config_options(settings),
    )


@dataclass(eq=False)  # compared and hashed by identity: the slot pool queues runs
class ChunkRun:
    """One chunk's requests on their way through the engine: those waiting for a
    slot (with their token estimates), those inside it (tasks on the engine loop),
    the results coming back, and what has been written."""

    work: ChunkWork
    output: Path
    pending: deque[tuple[EngineRequest, Cost]] = field(default_factory=deque)
    tasks: set[asyncio.Task] = field(default_factory=set)
    results: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    outstanding: int = 0
    completed: int = 0
    failed: int = 0
    interrupted: bool = False  # requests in flight cancelled for a model swap


# What a multiplexing worker holds before the scheduler gives it a model: no engine.
NO_MODEL = EngineConfig(engine="", model="", served_model_name="")


class InferenceRuntime:
    def __init__(self, *, config: EngineConfig, capacity: int, name: str | None = None,
                 multiplex: bool = False) -> None:
        self.hostname = socket.gethostname()
        self.name = name or f"{self.hostname}:{os.getpid()}:{int(time.time())}"
        self.config = config
        self.slots = SlotPool(capacity, token_budget=config.token_budget)
        # A multiplexing worker loads the model the scheduler gives it (inference/swap.py).
        self.multiplex = multiplex
        self.engine: Engine | None = None if multiplex else load_engine(config)
        self.swapping = threading.Event()  # a swap began: no new request enters the engine
        self.swap_cancel = threading.Event()  # ... and those in flight are handed back
        self.swapper = None
        self._asleep: dict[str, tuple[Engine, EngineConfig]] = {}  # model -> sleeping engine
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.failed: BaseException | None = None
        self.permanent_failure = False  # the engine can never start with these settings
        self.database = WorkerDatabase(self.name)
        self.ledger = ChunkLedger(self.database.flush)
        self.draining = threading.Event()  # SIGTERM: hand chunks back, take no more
        self._stopping = threading.Event()
        self.completed = self.failed_requests = self.tokens = 0
        self._stats_lock = threading.Lock()
        # Why results cannot be written (the storage volume full), while they cannot;
        # chunks now holding results it did not take; the volume to probe for room.
        self.storage_error = ""
        self._storage_waiting = 0
        self._storage_dir: Path | None = None
        self._storage_lock = threading.Lock()
        # Wakes chunks waiting to retry an append: the probe found room, or a drain.
        self._storage_changed = threading.Condition()
        # Stops and restarts the consumption of this worker's queue while storage is
        # full (inference.signals.QueueSwitch; None outside a Celery worker).
        self.queue_switch = None

    # --- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        threading.Thread(target=self.loop.run_forever, name="engine-loop", daemon=True).start()
        if self.database.reap_host(hostname=self.hostname, pid_alive=psutil.pid_exists):
            publish("batches.recover_chunks")
        self._heartbeat_once()
        threading.Thread(target=self._flush_forever, name="flusher", daemon=True).start()
        if self.multiplex:
            self.ready.set()  # nothing to start: chunks come once a model is resident
            logger.info("inference worker %s multiplexing: it holds the model the residency "
                        "scheduler gives it, slots=%s", self.name, self.slots.capacity)
            return
        started = asyncio.run_coroutine_threadsafe(self.engine.start(), self.loop)
        started.add_done_callback(self._engine_started)
        logger.info("inference worker %s starting engine=%s model=%s slots=%s", self.name,
                    self.config.engine, self.config.served_model_name, self.slots.capacity)

    def _engine_started(self, future) -> None:
        error = future.exception()
        if isinstance(error, EngineConfigError):
            self._engine_lost(error, "cannot start with these settings, and is not "
                                     "started again with them", permanent=True)
        elif error is not None:
            self._engine_lost(error, "failed to start")
        else:
            self._admission()
        self.ready.set()

    def start_swapper(self) -> None:
        """A multiplexing worker obeys the residency scheduler from now on (once its
        queue switch is in place: a swap changes the queue it consumes)."""
        from inference.swap import ModelSwapper

        if self.multiplex and self.swapper is None:
            self.swapper = ModelSwapper(self).start()

    def replace_engine(self, model_id: str) -> float:
        """A multiplexing worker's swap, once its chunks are handed back: put the
        engine to sleep where it can sleep and its weights fit host memory (vLLM's
        sleep mode on a GPU), else stop it (freeing its memory: vLLM's engine core is a
        child process that ends); then wake `model_id`'s engine if it sleeps here, else
        start it. Returns the seconds the old engine took to sleep or stop; raises
        what the new engine's start raised."""
        old, self.engine = self.engine, None
        began = time.monotonic()
        if old is not None:
            self._put_away(old, self.config)
        stopped = time.monotonic() - began
        asleep = self._asleep.pop(model_id, None)
        engine, config = asleep or (None, dataclasses.replace(
            engine_config_from_settings(model_id), sleep_mode=True))
        self.config = config
        self.slots = SlotPool(self.slots.capacity, token_budget=config.token_budget)
        try:
            if engine is not None:
                self._on_loop(engine.wake_up())
            else:
                engine = load_engine(config)
                self._on_loop(engine.start(), timeout=None)
        except BaseException:
            # Hold nothing, as before a first swap; what the failed start left running
            # (vLLM's engine core may be up) goes now, not with the worker.
            self.config = NO_MODEL
            if engine is not None:
                self._discard(engine)
            raise
        self.engine = engine
        self._admission()
        return stopped

    def _put_away(self, engine: Engine, config: EngineConfig) -> None:
        if engine.can_sleep and fits_host_memory(config.model):
            self._on_loop(engine.sleep())
            self._asleep[config.served_model_name] = (engine, config)
            logger.info("model %s sleeps in host memory", config.served_model_name)
        else:
            self._on_loop(engine.shutdown())

    def _discard(self, engine: Engine) -> None:
        try:
            self._on_loop(engine.shutdown())
        except Exception:
            logger.exception("stopping the engine that failed to start failed")

    def _on_loop(self, coroutine, *, timeout: float | None = SHUTDOWN_SECONDS):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def _admission(self) -> None:
        """How this worker admits requests into its engine (inference/slots.py): from
        the engine's own figures where it reports them, else within a token budget
        (BATCHGEN_TOKEN_BUDGET, or the KV cache the engine says it has)."""
        engine, slots = self.engine, self.slots
        if engine.max_running is not None:
            depth = settings.BATCHGEN_ENGINE_QUEUE_DEPTH or engine.max_running
            slots.follow_engine(depth)
            engine.load_listener = lambda load: slots.engine_load(load.running)
            logger.info("engine ready: %s (context %s tokens); it runs up to %s requests "
                        "at once, and up to %s more wait in its queue%s",
                        self.config.served_model_name, engine.max_context_length,
                        engine.max_running, depth,
                        f", within {slots.token_budget} tokens" if slots.token_budget else "")
            return
        if slots.token_budget is None:
            slots.token_budget = engine.token_capacity
        logger.info("engine ready: %s (context %s tokens, admitting up to %s tokens at once)",
                    self.config.served_model_name, engine.max_context_length,
                    slots.token_budget or "unlimited")

    def _engine_lost(self, error: BaseException, what: str, *, permanent: bool = False) -> None:
        """Without an engine this worker can do nothing: stop taking chunks and exit,
        so the supervisor (or the container's restart policy) starts a fresh one and
        the chunks it held are requeued. `permanent`: these settings can never start
        the engine, so the worker exits with EX_CONFIG, which tells the supervisor not
        to start it again (see exit_code())."""
        if self.failed is not None:
            return
        self.failed = error
        self.permanent_failure = permanent
        self.ready.set()
        logger.critical("the %s engine of model %s %s: %s; stopping this worker",
                        self.config.engine, self.config.served_model_name, what,
                        error if permanent else repr(error))
        os.kill(os.getpid(), signal.SIGTERM)

    def exit_code(self) -> int | None:
        """EX_CONFIG (78, sysexits' "configuration error", which systemd's
        RestartPreventExitStatus= and `serve`'s supervisor honour) when these settings
        can never start the engine; None otherwise (Celery's own code stands)."""
        return os.EX_CONFIG if self.permanent_failure else None

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
            self._wake_storage_waiters()

    def stop(self) -> None:
        if self._stopping.is_set():
            return
        self.drain()
        # Chunk threads hand their chunks back through the flusher, still running.
        if not self.ledger.wait_until_empty(STOP_DRAIN_SECONDS):
            logger.warning("%s chunk(s) not handed back in %s s; their leases will expire",
                           self.ledger.held, STOP_DRAIN_SECONDS)
        self._stopping.set()
        try:
            self._flush_once()  # what the last chunks said, before the worker goes
            self.database.stopped()
            if self.engine is not None:
                asyncio.run_coroutine_threadsafe(self.engine.shutdown(), self.loop).result(30)
            for engine, _ in self._asleep.values():
                asyncio.run_coroutine_threadsafe(engine.shutdown(), self.loop).result(30)
        except Exception:
            logger.exception("error while stopping the inference runtime")
        finally:
            self.ledger.fail_waiting(RuntimeError("the inference worker stopped"))
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.database.close()

    @property
    def stop_batches(self) -> frozenset[str]:
        return self.ledger.stop_batches

    # --- flushes and heartbeats -----------------------------------------------------------

    def _heartbeat_once(self) -> None:
        self.database.heartbeat(
            hostname=self.hostname, engine=self.config.engine,
            # A multiplexing worker holds no model while it swaps (or before its first).
            model=("" if self.engine is None or self.swapping.is_set()
                   else self.config.served_model_name), capacity=self.slots.capacity,
            active=self.slots.active, tokens_active=self.slots.tokens_active,
            token_budget=self.slots.token_budget,
            ready=self.ready.is_set() and self.failed is None and not self.draining.is_set(),
            completed=self.completed, failed=self.failed_requests, tokens=self.tokens,
            storage_error=self.storage_error, held_chunks=self.held_chunk_ids(),
            admission=None if self.engine is None else self.engine.admission,
        )

    def held_chunk_ids(self) -> list[int]:
        """The chunks this worker holds: those claimed (the ledger's) and those whose
        message Celery took from the broker but has not started, prefetched while every
        chunk thread is busy. The broker no longer counts the latter in its queue."""
        from celery.worker import state

        held = set(self.ledger.held_ids)
        for request in list(state.reserved_requests):
            if request.type == "inference.run_chunk" and len(request.args) == 2:
                held.add(int(request.args[1]))
        return sorted(held)

    def _flush_once(self) -> None:
        try:
            self.ledger.flush()
        except Exception as exc:
            if not noted_outage(exc):
                logger.exception("flushing chunk progress failed; it is kept for the next "
                                 "flush")

    def _flush_forever(self) -> None:
        """Flush when a chunk thread waits on it, when there is progress and the
        interval has passed, and at every heartbeat (lease renewal)."""
        interval = settings.BATCHGEN_PROGRESS_FLUSH_SECONDS
        heartbeat_due = last_flush = time.monotonic()
        while not self._stopping.is_set():
            urgent = self.ledger.urgent.wait(interval)
            if self._stopping.is_set():
                return
            now = time.monotonic()
            beat = now >= heartbeat_due
            if urgent or beat or (self.ledger.has_news() and now - last_flush >= interval):
                self._flush_once()
                last_flush = now
            if beat:
                heartbeat_due = now + settings.BATCHGEN_HEARTBEAT_SECONDS
                self._probe_storage()
                self._beat()

    def _beat(self) -> None:
        try:
            self._heartbeat_once()
        except Exception as exc:
            if not noted_outage(exc):
                logger.exception("heartbeat failed; retrying")

    # --- running a chunk ------------------------------------------------------------------

    def run_chunk(self, chunk_id: int, queue: str | None = None) -> str:
        """`queue`: the one the message came from. A multiplexing worker hands back,
        unclaimed, a message of a model it no longer holds (prefetched before a swap)."""
        if self.multiplex and (self.swapping.is_set() or self.engine is None
                               or queue != inference_queue(self.config.served_model_name)):
            raise Reject("model not resident on this worker", requeue=True)
        self.ready.wait()
        if self.failed is not None:
            raise RuntimeError(f"the engine failed to start: {self.failed!r}")
        if self.draining.is_set():
            # Not claimed: the message goes back to the broker for another worker.
            raise Reject("inference worker stopping", requeue=True)
        if self.storage_error:
            # Paused: this worker stopped consuming its queue, so the message goes to a
            # worker with room, or waits in the broker until this one resumes.
            raise Reject("storage full", requeue=True)
        work = self._claim(chunk_id)
        if work is None:
            return "not claimed"
        self.ledger.hold(work.chunk_id)
        if self.multiplex and (self.swapping.is_set() or self.engine is None or queue !=
                               inference_queue(self.config.served_model_name)):
            # A swap began (or ended) while this chunk was being claimed: it never
            # reaches another model's engine; the swap waits for it to go back.
            self.ledger.release(work.chunk_id).result()
            return f"chunk {work.batch_id}#{work.index}: released, model swap"
        try:
            run = self._run_chunk(work)
        except BaseException:
            self.ledger.drop(work.chunk_id)
            raise
        if self.failed is not None or self.draining.is_set() or run.pending or run.interrupted:
            # This worker is going away mid-chunk, or paused on a full volume or for a
            # model swap with requests of the chunk not yet started (or cancelled):
            # keep what was written, hand the rest back to the queue now rather than
            # when the lease runs out.
            self.ledger.release(work.chunk_id).result()
            why = ("worker stopping" if self.failed is not None or self.draining.is_set()
                   else "storage full" if self.storage_error else "model swap")
            return f"chunk {work.batch_id}#{work.index}: released, {why}"
        status = self.ledger.close(work.chunk_id).result()
        # Which worker and model ran it: with several models, the log shows each
        # worker answering its own model only.
        return (f"chunk {work.batch_id}#{work.index} on {self.name} for model "
                f"{self.config.served_model_name}: {status or 'lost'}, {run.completed} "
                f"completed, {run.failed} failed")

    def _claim(self, chunk_id: int) -> ChunkWork | None:
        """Claim the chunk, waiting out a database outage: the message stays with this
        worker (not acked, so not lost), and nothing could run without the database
        anyway. A worker that stops meanwhile hands the message back."""
        while True:
            try:
                return self.database.claim(chunk_id)
            except Exception as exc:
                if not noted_outage(exc):
                    raise
            if self.draining.wait(CLAIM_RETRY_SECONDS) or self.failed is not None:
                raise Reject("inference worker stopping", requeue=True)

    def _run_chunk(self, work: ChunkWork) -> ChunkRun:
        requests = read_chunk(Path(work.input_path), start=work.start_offset,
                              end=work.end_offset, max_line_bytes=settings.BATCHGEN_MAX_LINE_BYTES,
                              order_path=Path(work.order_path) if work.order_path else None)
        output = Path(work.output_path)
        if work.attempts > 1:
            # A redelivery: skip what an earlier attempt already wrote.
            written = scan_results(output, {r["custom_id"] for r in requests})
            self.ledger.add(work.chunk_id, *reconcile_counts(work, written))
            requests = [r for r in requests if r["custom_id"] not in written]
        return self._run_requests(work, requests, output)

    def _run_requests(self, work: ChunkWork, requests: list[dict], output: Path) -> ChunkRun:
        """Submit while slots are free, write results as they come and put them in
        the ledger."""
        run = ChunkRun(work=work, output=output)
        spec = endpoint_spec(work.endpoint)
        for position, item in enumerate(requests):
            request = EngineRequest(
                request_id=f"{work.batch_id}-{work.index}-{position}-{work.attempts}",
                custom_id=item["custom_id"],
                endpoint=work.endpoint,
                body=spec.resolve_body(item["body"], work.params),
                max_context_length=work.params.max_context_length,
            )
            run.pending.append((request, estimate_cost(request)))
        try:
            self._loop_requests(run)
        except BaseException:
            self._cancel(run)
            raise
        return run

    def _loop_requests(self, run: ChunkRun) -> None:
        """Admit in turn (the slot pool's queue: the oldest chunk first), wait for
        results or for room to be freed, write what finished."""
        work = run.work
        stopped = False
        if run.pending:
            self.slots.join(run, lambda: run.results.put(_WAKE))
        try:
            while run.pending or run.outstanding:
                if self.ledger.is_lost(work.chunk_id):
                    logger.warning("lost the lease of chunk %s#%s; stopping it", work.batch_id,
                                   work.index)
                    raise RuntimeError("chunk lease lost")
                if not stopped and self._must_stop(work.batch_id):
                    stopped = True
                    run.pending.clear()
                    self._cancel(run)
                if run.outstanding and not run.interrupted and self.swap_cancel.is_set():
                    run.interrupted = True  # the swap waited long enough for them
                    self._cancel(run)
                if run.pending and (self.storage_error or self.swapping.is_set()):
                    # Paused: what would start now could not be written, or a swap
                    # waits. With nothing in flight or held, hand the rest back
                    # (run_chunk releases it).
                    if not run.outstanding:
                        if self.storage_error:
                            self._tell_storage(self.database.storage_full, work.batch_id,
                                               heartbeat=False)
                        break
                elif run.pending:
                    count = self.slots.admit(run, (cost for _, cost in run.pending))
                    if count:
                        admitted = [run.pending.popleft() for _ in range(count)]
                        # One hand-over to the engine loop for everything admitted at once.
                        self.loop.call_soon_threadsafe(self._start_requests, admitted, run)
                        run.outstanding += count
                if not run.pending:
                    self.slots.leave(run)
                    if not run.outstanding:
                        break
                finished = [item for item in self._drain(run.results) if item is not _WAKE]
                run.outstanding -= len(finished)
                self._record(run, [(custom_id, r) for custom_id, r in finished
                                   if r is not _CANCELLED])
        finally:
            self.slots.leave(run)

    def _record(self, run: ChunkRun, finished: list[tuple[str, EngineResult]]) -> None:
        work = run.work
        if finished and self._write(work, run.output, [format_line(*item) for item in finished]):
            completed = sum(1 for _, result in finished if result.error is None)
            failed = len(finished) - completed
            run.completed += completed
            run.failed += failed
            usage = Usage()
            for _, result in finished:
                usage.add_body(result.body)
            self.ledger.add(work.chunk_id, completed, failed, usage)
            for _, result in finished:
                self._count(result)

    def _must_stop(self, batch_id: str) -> bool:
        return (batch_id in self.stop_batches or self.draining.is_set()
                or self.failed is not None)

    def _cancel(self, run: ChunkRun) -> None:
        self.loop.call_soon_threadsafe(lambda: [t.cancel() for t in list(run.tasks)])

    # --- writing results ------------------------------------------------------------------

    def _write(self, work: ChunkWork, output: Path, lines: list[bytes]) -> bool:
        """Append finished results. While the storage volume is full, hold them (the
        heartbeat keeps the chunk's lease) and retry with backoff until there is room,
        so no inference is lost to a full disk. They are given up only when the batch
        or this worker stops: then they are not counted, and are not in the file, so
        whichever attempt runs the chunk next runs them again. Returns whether written."""
        delay = STORAGE_RETRY_FIRST
        waiting = written = False
        try:
            while True:
                try:
                    append_lines(output, lines)
                    written = True
                    return True
                except OSError as exc:
                    if not is_storage_full(exc):
                        raise
                    if not waiting:
                        waiting = True
                        self._storage_full(work, output, exc)
                    else:  # another chunk of the batch may have cleared it meanwhile
                        self._tell_storage(self.database.storage_full, work.batch_id,
                                           heartbeat=False)
                with self._storage_changed:
                    self._storage_changed.wait(delay)
                if (self.draining.is_set() or self.failed is not None
                        or work.batch_id in self.stop_batches):
                    logger.warning("chunk %s#%s stops with %s result(s) unwritten (storage "
                                   "full); they run again if the batch goes on",
                                   work.batch_id, work.index, len(lines))
                    return False
                delay = min(delay * 2, STORAGE_RETRY_MAX)
        finally:
            if waiting:
                # The batch's error stays while it still waits (this worker stopping).
                self._storage_room(work, written=written, batch_resumed=written or
                                   work.batch_id in self.stop_batches)

    def _storage_full(self, work: ChunkWork, output: Path, error: OSError) -> None:
        with self._storage_lock:
            self._storage_waiting += 1
            first = not self.storage_error
            self.storage_error = f"{error.strerror} writing results to {output.parent}"
            self._storage_dir = output.parent
        if first:
            logger.error("storage full: cannot append results to %s (%s); this worker "
                         "pauses: chunks hold their results and retry, no new chunk is "
                         "taken and those not started are handed back, until space is "
                         "freed on the volume", output, error.strerror)
            self._switch_queue()
        self._tell_storage(self.database.storage_full, work.batch_id)

    def _storage_room(self, work: ChunkWork, *, written: bool, batch_resumed: bool) -> None:
        """A chunk stops waiting: its results written, or given up (its batch or this
        worker stopped). Only a write shows there is room again: after a chunk gave
        up, the heartbeat's probe tells (_probe_storage)."""
        with self._storage_lock:
            self._storage_waiting -= 1
            resumed = written and self._storage_waiting == 0 and bool(self.storage_error)
            if resumed:
                self.storage_error = ""
        if resumed:
            self._storage_resumed()
        if batch_resumed:
            self._tell_storage(self.database.storage_resumed, work.batch_id)

    def _probe_storage(self) -> None:
        """Paused: once a probe write finds room on the volume, wake the chunks that
        wait to retry their appends (their backoff reaches 30 s), or, when none does
        (they gave their results up), resume."""
        with self._storage_lock:
            directory = self._storage_dir if self.storage_error else None
        if directory is None:
            return
        try:
            probe_room(directory)
        except OSError as exc:
            if not is_storage_full(exc):
                logger.warning("cannot probe %s for room: %s", directory, exc)
            return
        with self._storage_lock:
            resumed = bool(self.storage_error) and not self._storage_waiting
            if resumed:
                self.storage_error = ""
        if resumed:
            self._storage_resumed()
        self._wake_storage_waiters()

    def _wake_storage_waiters(self) -> None:
        with self._storage_changed:
            self._storage_changed.notify_all()

    def _storage_resumed(self) -> None:
        logger.warning("the storage volume takes results again; this worker resumes")
        self._switch_queue()

    def _switch_queue(self) -> None:
        """Consume this worker's queue, or not, as storage_error now says."""
        if self.queue_switch is not None:
            self.queue_switch.changed()

    def _tell_storage(self, change, batch_id: str, *, heartbeat: bool = True) -> None:
        """Show the state on the batch and, through a heartbeat now, in /health and
        /v1/pool/status. A failure here must not lose the results being held."""
        try:
            change(batch_id)
            if heartbeat:
                self._heartbeat_once()
        except Exception:
            logger.exception("could not record the storage state of batch %s", batch_id)

    @staticmethod
    def _drain(results: queue.SimpleQueue) -> list:
        try:
            finished = [results.get(timeout=PROGRESS_INTERVAL)]
        except queue.Empty:
            return []
        while True:
            try:
                finished.append(results.get_nowait())
            except queue.Empty:
                return finished

    def _count(self, result: EngineResult) -> None:
        with self._stats_lock:
            if result.error is None:
                self.completed += 1
            else:
                self.failed_requests += 1
            self.tokens += result.completion_tokens

    # --- on the engine loop ----------------------------------------------------------------

    def _start_requests(self, admitted: list[tuple[EngineRequest, Cost]], run: ChunkRun) -> None:
        for request, cost in admitted:
            task = self.loop.create_task(self._generate(request, cost, run.results))
            run.tasks.add(task)
            task.add_done_callback(run.tasks.discard)

    async def _generate(self, request: EngineRequest, cost: Cost,
                        results: queue.SimpleQueue) -> None:
        try:
            result = await self.engine.generate(request)
        except asyncio.CancelledError:
            result = _CANCELLED
        except EngineUnavailable as exc:
            self._engine_lost(exc, "died")
            result = _CANCELLED
        except Exception as exc:  # an engine bug must not lose the request's slot
            logger.exception("engine error on %s", request.request_id)
            result = EngineResult.failure("engine_error", f"{type(exc).__name__}: {exc}")
        finally:
            self.slots.release(cost=cost)
        results.put((request.custom_id, result))


# A sleeping model's weights may take this share of the host's available memory at
# most: the rest is for the processes and the page cache the next load reads through.
HOST_MEMORY_SHARE = 0.7


def fits_host_memory(model_path: str) -> bool:
    """Whether the model folder's weights fit the host's available memory (vLLM's
    sleep level 1 copies them there), with room to spare."""
    folder = Path(model_path)
    if not folder.is_dir():
        return True  # nothing on disk to measure (a simulated or remote model)
    weights = sum(path.stat().st_size for pattern in ("*.safetensors", "*.bin", "*.pt")
                  for path in folder.glob(pattern))
    return weights <= HOST_MEMORY_SHARE * psutil.virtual_memory().available


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
