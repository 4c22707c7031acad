"""The inference worker's runtime: one engine, its event loop, the slots, the
heartbeat, and the loop that runs a chunk.

Threads of one worker process:
- Celery's task threads, one per chunk in hand (the threads pool; its size lets the
  worker hold enough chunks to fill every slot). A chunk's thread submits requests
  while slots are free, writes each finished one to the incremental file and
  accounts progress.
- The engine loop: an asyncio loop that owns the engine; every request is a task on it.
- Two DB threads: all ORM work goes through them, so a worker holds at most two
  database connections however many chunks it runs.
- The heartbeat: liveness, slot figures, lease renewal, and which batches must stop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from django.conf import settings
from django.db import close_old_connections, connection

from batches.params import resolve_body
from batches.services import batch_storage_full, batch_storage_resumed
from batches.validation import read_chunk
from batchgen_site.errors import is_storage_full
from files.incremental import append_lines, scan_results
from inference import services
from inference.engines import (
    Engine,
    EngineConfig,
    EngineRequest,
    EngineResult,
    EngineUnavailable,
    load_engine,
)
from inference.output import format_line
from inference.slots import SlotPool, estimate_tokens

logger = logging.getLogger("batchgen.inference")

PROGRESS_INTERVAL = 0.5  # seconds between progress flushes of a running chunk
# While the storage volume is full, a chunk holds its results and retries the
# append after these many seconds, doubling up to the cap.
STORAGE_RETRY_FIRST = 1.0
STORAGE_RETRY_MAX = 30.0
DB_THREADS = 2  # all of a worker's ORM work: its database connections, bounded
_CANCELLED = object()


def engine_config_from_settings() -> EngineConfig:
    from inference.model_info import served_model

    model = served_model()
    return EngineConfig(
        engine=settings.BATCHGEN_ENGINE,
        model=settings.BATCHGEN_MODEL,
        served_model_name=model.id,
        max_context_length=settings.BATCHGEN_MAX_CONTEXT_LENGTH,
        parse_thinking=settings.BATCHGEN_PARSE_THINKING,
        reasoning_parser=settings.BATCHGEN_REASONING_PARSER,
        tool_call_parser=settings.BATCHGEN_TOOL_CALL_PARSER,
        sim_latency_ms=settings.BATCHGEN_SIM_LATENCY_MS,
        token_budget=settings.BATCHGEN_TOKEN_BUDGET,
        engine_args=settings.BATCHGEN_ENGINE_ARGS,
    )


def _db(fn, kwargs):
    close_old_connections()
    try:
        return fn(**kwargs)
    finally:
        close_old_connections()


class InferenceRuntime:
    def __init__(self, *, config: EngineConfig, capacity: int, name: str | None = None) -> None:
        self.hostname = socket.gethostname()
        self.name = name or f"{self.hostname}:{os.getpid()}:{int(time.time())}"
        self.config = config
        self.slots = SlotPool(capacity, token_budget=config.token_budget)
        self.engine: Engine = load_engine(config)
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.failed: BaseException | None = None
        self.stop_batches: frozenset[str] = frozenset()
        self._running: dict[int, str] = {}  # chunk id -> batch id
        self._running_lock = threading.Lock()
        self._db = ThreadPoolExecutor(max_workers=DB_THREADS, thread_name_prefix="batchgen-db")
        self._stopping = threading.Event()
        self.completed = self.failed_requests = self.tokens = 0
        self._stats_lock = threading.Lock()
        # Chunks now holding results the full storage volume cannot take, and why.
        self.storage_error = ""
        self._storage_waiting = 0
        self._storage_lock = threading.Lock()

    # --- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        threading.Thread(target=self.loop.run_forever, name="engine-loop", daemon=True).start()
        reaped = self.db(services.worker_reap_host, hostname=self.hostname, current=self.name,
                         pid_alive=psutil.pid_exists)
        if reaped:
            from batches.tasks import recover_chunks

            recover_chunks.delay()
        self._heartbeat_once()
        threading.Thread(target=self._heartbeat_forever, name="heartbeat", daemon=True).start()
        started = asyncio.run_coroutine_threadsafe(self.engine.start(), self.loop)
        started.add_done_callback(self._engine_started)
        logger.info("inference worker %s starting engine=%s model=%s slots=%s", self.name,
                    self.config.engine, self.config.served_model_name, self.slots.capacity)

    def _engine_started(self, future) -> None:
        if future.exception() is not None:
            self._engine_lost(future.exception(), "failed to start")
        else:
            if self.slots.token_budget is None:
                self.slots.token_budget = self.engine.token_capacity
            logger.info("engine ready: %s (context %s tokens, admitting up to %s tokens at once)",
                        self.config.served_model_name, self.engine.max_context_length,
                        self.slots.token_budget or "unlimited")
        self.ready.set()

    def _engine_lost(self, error: BaseException, what: str) -> None:
        """Without an engine this worker can do nothing: stop taking chunks and exit,
        so the supervisor (or the container's restart policy) starts a fresh one and
        the chunks it held are requeued."""
        if self.failed is not None:
            return
        self.failed = error
        self.ready.set()
        logger.critical("the %s engine %s: %r; stopping this worker", self.config.engine, what,
                        error)
        os.kill(os.getpid(), signal.SIGTERM)

    def stop(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        try:
            self.db(services.worker_stopped, name=self.name)
            asyncio.run_coroutine_threadsafe(self.engine.shutdown(), self.loop).result(30)
        except Exception:
            logger.exception("error while stopping the inference runtime")
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._close_db_connections()
            self._db.shutdown(wait=False)

    def _close_db_connections(self) -> None:
        """Close the DB threads' connections (one task per thread, held at a barrier
        so each thread runs exactly one)."""
        barrier = threading.Barrier(DB_THREADS)

        def close() -> None:
            connection.close()
            barrier.wait(timeout=10)

        for future in [self._db.submit(close) for _ in range(DB_THREADS)]:
            try:
                future.result(timeout=15)
            except Exception:
                logger.warning("a database connection did not close cleanly")

    def db(self, fn, **kwargs):
        return self._db.submit(_db, fn, kwargs).result()

    # --- heartbeat ----------------------------------------------------------------------

    def _heartbeat_once(self) -> None:
        with self._running_lock:
            chunk_ids = list(self._running)
        self.stop_batches = frozenset(self.db(
            services.worker_heartbeat, name=self.name, hostname=self.hostname,
            engine=self.config.engine, model=self.config.served_model_name,
            capacity=self.slots.capacity, active=self.slots.active,
            tokens_active=self.slots.tokens_active, token_budget=self.slots.token_budget,
            ready=self.ready.is_set() and self.failed is None, completed=self.completed,
            failed=self.failed_requests, tokens=self.tokens, chunk_ids=chunk_ids,
            storage_error=self.storage_error,
        ))

    def _heartbeat_forever(self) -> None:
        while not self._stopping.wait(settings.BATCHGEN_HEARTBEAT_SECONDS):
            try:
                self._heartbeat_once()
            except Exception:
                logger.exception("heartbeat failed; retrying")

    # --- running a chunk ------------------------------------------------------------------

    def run_chunk(self, chunk_id: int) -> str:
        self.ready.wait()
        if self.failed is not None:
            raise RuntimeError(f"the engine failed to start: {self.failed!r}")
        work = self.db(services.chunk_claim, chunk_id=chunk_id, worker=self.name)
        if work is None:
            return "not claimed"
        requests = read_chunk(Path(work.input_path), start=work.start_offset,
                              end=work.end_offset, max_line_bytes=settings.BATCHGEN_MAX_LINE_BYTES,
                              order_path=Path(work.order_path) if work.order_path else None)
        output = Path(work.output_path)
        if work.attempts > 1:
            # A redelivery: skip what an earlier attempt already wrote.
            written = scan_results(output, {r["custom_id"] for r in requests})
            self.db(services.chunk_reconcile, work=work, worker=self.name, written=written)
            requests = [r for r in requests if r["custom_id"] not in written]
        with self._running_lock:
            self._running[work.chunk_id] = work.batch_id
        try:
            completed, failed = self._run_requests(work, requests, output)
        finally:
            with self._running_lock:
                self._running.pop(work.chunk_id, None)
        if self.failed is not None or self._stopping.is_set():
            # This worker is going away mid-chunk: keep what was written, hand the
            # rest back to the queue now rather than when the lease runs out.
            self.db(services.chunk_release, chunk_id=work.chunk_id, worker=self.name,
                    completed=completed, failed=failed)
            return f"chunk {work.batch_id}#{work.index}: released, worker stopping"
        self.db(services.chunk_close, chunk_id=work.chunk_id, worker=self.name,
                completed=completed, failed=failed)
        return f"chunk {work.batch_id}#{work.index}: {completed} completed, {failed} failed"

    def _run_requests(self, work: services.ChunkWork, requests: list[dict],
                      output: Path) -> tuple[int, int]:
        """Submit while slots are free, write results as they come, flush progress.
        Returns the results not yet accounted when the chunk ends."""
        results: queue.SimpleQueue = queue.SimpleQueue()
        pending: deque[tuple[EngineRequest, int]] = deque()
        for position, item in enumerate(requests):
            request = EngineRequest(
                request_id=f"{work.batch_id}-{work.index}-{position}-{work.attempts}",
                custom_id=item["custom_id"],
                endpoint=work.endpoint,
                body=resolve_body(item["body"], work.params, endpoint=work.endpoint),
                max_context_length=work.params.max_context_length,
            )
            pending.append((request, estimate_tokens(request)))
        tasks: set[asyncio.Task] = set()

        def submit(admitted: list[tuple[EngineRequest, int]]) -> None:
            # One hand-over to the engine loop for everything admitted at once.
            self.loop.call_soon_threadsafe(self._start_requests, admitted, results, tasks)

        try:
            return self._loop_requests(work, pending, tasks, results, submit, output)
        except BaseException:
            self.loop.call_soon_threadsafe(lambda: [t.cancel() for t in list(tasks)])
            raise

    def _loop_requests(self, work, pending, tasks, results, submit, output) -> tuple[int, int]:
        outstanding = 0
        completed = failed = 0
        last_flush = time.monotonic()
        stopped = False
        while pending or outstanding:
            if not stopped and (work.batch_id in self.stop_batches or self._stopping.is_set()
                                or self.failed is not None):
                stopped = True
                pending.clear()
                self.loop.call_soon_threadsafe(lambda: [t.cancel() for t in list(tasks)])
            admitted = []
            while pending and self.slots.try_acquire(tokens=pending[0][1]):
                admitted.append(pending.popleft())
            if (pending and not outstanding and not admitted
                    and self.slots.acquire(timeout=PROGRESS_INTERVAL, tokens=pending[0][1])):
                admitted.append(pending.popleft())
            if admitted:
                submit(admitted)
                outstanding += len(admitted)
            if not outstanding:
                continue
            finished = self._drain(results)
            outstanding -= len(finished)
            finished = [(custom_id, r) for custom_id, r in finished if r is not _CANCELLED]
            if self._write(work, output, [format_line(*item) for item in finished]):
                for _, result in finished:
                    if result.error is None:
                        completed += 1
                    else:
                        failed += 1
                    self._count(result)
            if time.monotonic() - last_flush >= PROGRESS_INTERVAL and (completed or failed):
                if not self.db(services.chunk_progress, chunk_id=work.chunk_id,
                               worker=self.name, completed=completed, failed=failed):
                    logger.warning("lost the lease of chunk %s#%s; stopping it",
                                   work.batch_id, work.index)
                    raise RuntimeError("chunk lease lost")
                completed = failed = 0
                last_flush = time.monotonic()
        return completed, failed

    # --- writing results ------------------------------------------------------------------

    def _write(self, work: services.ChunkWork, output: Path, lines: list[bytes]) -> bool:
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
                        self._tell_storage(batch_storage_full, work.batch_id, heartbeat=False)
                if (self._stopping.wait(delay) or self.failed is not None
                        or work.batch_id in self.stop_batches):
                    logger.warning("chunk %s#%s stops with %s result(s) unwritten (storage "
                                   "full); they run again if the batch goes on",
                                   work.batch_id, work.index, len(lines))
                    return False
                delay = min(delay * 2, STORAGE_RETRY_MAX)
        finally:
            if waiting:
                # The batch's error stays while it still waits (this worker stopping).
                self._storage_room(work, batch_resumed=written or
                                   work.batch_id in self.stop_batches)

    def _storage_full(self, work: services.ChunkWork, output: Path, error: OSError) -> None:
        with self._storage_lock:
            self._storage_waiting += 1
            first = not self.storage_error
            self.storage_error = f"{error.strerror} writing results to {output.parent}"
        if first:
            logger.error("storage full: cannot append results to %s (%s); chunks hold "
                         "their results and retry until space is freed on the volume",
                         output, error.strerror)
        self._tell_storage(batch_storage_full, work.batch_id)

    def _storage_room(self, work: services.ChunkWork, *, batch_resumed: bool) -> None:
        with self._storage_lock:
            self._storage_waiting -= 1
            last = self._storage_waiting == 0 and bool(self.storage_error)
            if last:
                self.storage_error = ""
        if last:
            logger.warning("the storage volume takes results again; chunks resume")
        if batch_resumed:
            self._tell_storage(batch_storage_resumed, work.batch_id)

    def _tell_storage(self, change, batch_id: str, *, heartbeat: bool = True) -> None:
        """Show the state on the batch and, through a heartbeat now, in /health and
        /v1/pool/status. A failure here must not lose the results being held."""
        try:
            self.db(change, batch_id=batch_id)
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

    def _start_requests(self, admitted: list[tuple[EngineRequest, int]],
                        results: queue.SimpleQueue, tasks: set) -> None:
        for request, tokens in admitted:
            task = self.loop.create_task(self._generate(request, tokens, results))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _generate(self, request: EngineRequest, tokens: int,
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
            self.slots.release(tokens=tokens)
        results.put((request.custom_id, result))


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
                runtime = InferenceRuntime(config=engine_config_from_settings(),
                                           capacity=settings.BATCHGEN_MAX_POOL_SIZE)
                runtime.start()
                _runtime = runtime
    return _runtime


def stop_runtime() -> None:
    if _runtime is not None:
        _runtime.stop()
