"""The loop that runs a chunk on an inference worker, on the Celery task thread that
holds it: claim it, read its requests (inference.chunk_input), submit them while slots
are free, write each finished one to the incremental file and put it in the ledger
(inference.ledger), then close the chunk or hand it back. The requests themselves run
as tasks on the engine's loop (inference.engine_host)."""

from __future__ import annotations

import asyncio
import logging
import queue
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from pathlib import Path

from celery.exceptions import Reject

from batches.chunks import ChunkWork
from batches.usage import Usage
from core.celery import inference_queue
from core.outage import noted_outage
from files.segments import segment_name
from inference.chunk_input import ChunkInput
from inference.database import WorkerDatabase
from inference.engine_host import EngineHost
from inference.engines import EngineRequest, EngineResult, EngineUnavailable
from inference.held_results import HeldResults
from inference.ledger import ChunkLedger
from inference.output import format_line
from inference.slots import Cost, estimate_cost
from inference.storage_pause import StoragePause
from inference.worker_state import WorkerState, request_id
from serving.endpoints import endpoint_spec

logger = logging.getLogger("batchgen.inference")

PROGRESS_INTERVAL = 0.5  # seconds a chunk thread waits for results before it looks round
# While the database is unreachable, a chunk's claim is tried again this often.
CLAIM_RETRY_SECONDS = 1.0
_CANCELLED = object()
_WAKE = object()  # put in a chunk's result queue: room was freed, it may be its turn
_COST = itemgetter(1)  # of a pending (request, cost)


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
    segments: int = 0  # segment objects written (an object store's incremental output)
    held: HeldResults = field(default_factory=HeldResults)  # not yet written (object store)
    # Each request's output token limit, by custom_id (Usage.output_limit, for the ETA).
    limits: dict[str, int] = field(default_factory=dict)


class ChunkRunner:
    """Runs the chunks a worker is given, each on its task's thread.

    The path of a chunk only goes down: this module calls its ports (chunk_input,
    the ledger, the database, storage_pause) and the engine's (engine_host, slots),
    none of which calls back into it (tests/inference/test_chunk_path.py); what
    others must hear of it they read from the worker's state."""

    def __init__(self, *, state: WorkerState, engines: EngineHost, ledger: ChunkLedger,
                 database: WorkerDatabase, storage: StoragePause,
                 chunk_input: ChunkInput) -> None:
        self.state = state
        self.engines = engines
        self.ledger = ledger
        self.database = database
        self.storage = storage
        self.input = chunk_input

    def _not_resident(self, queue: str | None) -> bool:
        """A multiplexing worker runs only the chunks of the model it holds now."""
        engines = self.engines
        return self.state.multiplex and (
            self.state.swapping.is_set() or engines.engine is None
            or queue != inference_queue(engines.config.served_model_name))

    def run_chunk(self, chunk_id: int, queue: str | None = None) -> str:
        """`queue`: the one the message came from. A multiplexing worker hands back,
        unclaimed, a message of a model it no longer holds (prefetched before a swap)."""
        state = self.state
        if self._not_resident(queue):
            raise Reject("model not resident on this worker", requeue=True)
        state.ready.wait()
        if state.failed is not None:
            raise RuntimeError(f"the engine failed to start: {state.failed!r}")
        if state.draining.is_set():
            # Not claimed: the message goes back to the broker for another worker.
            raise Reject("inference worker stopping", requeue=True)
        if self.state.storage_error:
            # Paused: this worker stopped consuming its queue, so the message goes to a
            # worker with room, or waits in the broker until this one resumes.
            raise Reject("storage full", requeue=True)
        work = self.claim(chunk_id)
        if work is None:
            return "not claimed"
        self.ledger.hold(work.chunk_id)
        if self._not_resident(queue):
            # A swap began (or ended) while this chunk was being claimed: it never
            # reaches another model's engine; the swap waits for it to go back.
            self.ledger.release(work.chunk_id).result()
            return f"chunk {work.batch_id}#{work.index}: released, model swap"
        try:
            run = self._run_chunk(work)
        except BaseException:
            self.ledger.drop(work.chunk_id)
            raise
        return self._end(work, run)

    def _end(self, work: ChunkWork, run: ChunkRun) -> str:
        if self.state.going_away() or run.pending or run.interrupted:
            # This worker is going away mid-chunk, or paused on a full volume or for a
            # model swap with requests of the chunk not yet started (or cancelled):
            # keep what was written, hand the rest back to the queue now rather than
            # when the lease runs out.
            self.ledger.release(work.chunk_id).result()
            why = ("worker stopping" if self.state.going_away()
                   else "storage full" if self.state.storage_error else "model swap")
            return f"chunk {work.batch_id}#{work.index}: released, {why}"
        status = self.ledger.close(work.chunk_id).result()
        # Which worker and model ran it: with several models, the log shows each
        # worker answering its own model only.
        return (f"chunk {work.batch_id}#{work.index} on {self.state.name} for model "
                f"{self.engines.config.served_model_name}: {status or 'lost'}, "
                f"{run.completed} completed, {run.failed} failed")

    def claim(self, chunk_id: int) -> ChunkWork | None:
        """Claim the chunk, waiting out a database outage: the message stays with this
        worker (not acked, so not lost), and nothing could run without the database
        anyway. A worker that stops meanwhile hands the message back."""
        while True:
            try:
                return self.database.claim(chunk_id)
            except Exception as exc:
                if not noted_outage(exc):
                    raise
            if self.state.draining.wait(CLAIM_RETRY_SECONDS) or self.state.failed is not None:
                raise Reject("inference worker stopping", requeue=True)

    def _run_chunk(self, work: ChunkWork) -> ChunkRun:
        """Submit while slots are free, write results as they come and put them in
        the ledger."""
        chunk = self.input.read(work)
        self.ledger.add(work.chunk_id, *chunk.unaccounted)
        run = ChunkRun(work=work, output=chunk.output)
        spec = endpoint_spec(work.endpoint)
        for position, item in enumerate(chunk.requests):
            request = EngineRequest(
                request_id=request_id(work.batch_id, work.index, position, work.attempts),
                custom_id=item["custom_id"],
                endpoint=work.endpoint,
                body=spec.resolve_body(item["body"], work.params),
                max_context_length=work.params.max_context_length,
            )
            run.pending.append((request, estimate_cost(request)))
            run.limits[request.custom_id] = request.body.get(spec.output_limit_field) or 0
        try:
            self._loop_requests(run)
        except BaseException:
            self._cancel(run)
            raise
        return run

    def _loop_requests(self, run: ChunkRun) -> None:
        """Admit in turn (the slot pool's queue: the oldest chunk first), wait for
        results or for room to be freed, write what finished."""
        stopped = False
        if run.pending:
            # Called by the slot pool; a partial, so no frame of this module runs
            # inside the pool's (the path only goes down).
            self.engines.slots.join(run, partial(run.results.put, _WAKE))
        try:
            while run.pending or run.outstanding:
                if self.ledger.is_lost(run.work.chunk_id):
                    logger.warning("lost the lease of chunk %s#%s; stopping it",
                                   run.work.batch_id, run.work.index)
                    raise RuntimeError("chunk lease lost")
                if not stopped and self._must_stop(run.work.batch_id):
                    stopped = True
                    run.pending.clear()
                    self._cancel(run)
                if run.outstanding and not run.interrupted and self.state.swap_cancel.is_set():
                    run.interrupted = True  # the swap waited long enough for them
                    self._cancel(run)
                if run.pending and (self.state.storage_error or self.state.swapping.is_set()):
                    # Paused: what would start now could not be written, or a swap
                    # waits. With nothing in flight or held, hand the rest back
                    # (run_chunk releases it).
                    if not run.outstanding:
                        if self.state.storage_error:
                            self.storage.tell_full(run.work.batch_id)
                        break
                elif run.pending:
                    self._admit(run)
                if not run.pending:
                    self.engines.slots.leave(run)
                    if not run.outstanding:
                        break
                finished = [item for item in _drain(run.results) if item is not _WAKE]
                run.outstanding -= len(finished)
                self._record(run, [(custom_id, r) for custom_id, r in finished
                                   if r is not _CANCELLED])
            self._record(run, [], last=True)
        finally:
            self.engines.slots.leave(run)

    def _admit(self, run: ChunkRun) -> None:
        count = self.engines.slots.admit(run, map(_COST, run.pending))
        if count:
            admitted = [run.pending.popleft() for _ in range(count)]
            # One hand-over to the engine loop for everything admitted at once.
            self.engines.loop.call_soon_threadsafe(self._start_requests, admitted, run)
            run.outstanding += count

    def _record(self, run: ChunkRun, finished: list[tuple[str, EngineResult]],
                last: bool = False) -> None:
        """Write finished results and put them in the ledger: on a path at once, on an
        object store as one segment per interval (inference.held_results) and at the
        `last` call of the chunk's loop."""
        work = run.work
        lines = [format_line(*item) for item in finished]
        segment = None
        if self.storage.on_object_store:
            run.held.add(finished, lines)
            if not (run.held.due() or last):
                return
            finished, lines = run.held.take()
            if finished:
                segment = segment_name(work.batch_id, work.index, work.attempts, run.segments)
                run.segments += 1
        if finished and self.storage.write(work.batch_id, work.index, run.output, lines,
                                           segment=segment):
            completed = sum(1 for _, result in finished if result.error is None)
            failed = len(finished) - completed
            run.completed += completed
            run.failed += failed
            usage = Usage()
            for custom_id, result in finished:
                usage.add_body(result.body)
                usage.output_limit += run.limits.get(custom_id, 0)
            self.ledger.add(work.chunk_id, completed, failed, usage,
                            segment=(segment, sum(map(len, lines))) if segment else None)
            self.state.count([result for _, result in finished], usage)

    def _must_stop(self, batch_id: str) -> bool:
        return batch_id in self.ledger.stop_batches or self.state.going_away()

    def _cancel(self, run: ChunkRun) -> None:
        self.engines.loop.call_soon_threadsafe(lambda: [t.cancel() for t in list(run.tasks)])

    # --- on the engine loop ----------------------------------------------------------------

    def _start_requests(self, admitted: list[tuple[EngineRequest, Cost]], run: ChunkRun) -> None:
        for request, cost in admitted:
            task = self.engines.loop.create_task(self._generate(request, cost, run.results))
            run.tasks.add(task)
            task.add_done_callback(run.tasks.discard)

    async def _generate(self, request: EngineRequest, cost: Cost,
                        results: queue.SimpleQueue) -> None:
        engines = self.engines
        try:
            result = await engines.engine.generate(request)
        except asyncio.CancelledError:
            result = _CANCELLED
        except EngineUnavailable as exc:
            engines.engine_lost(exc, "died")
            result = _CANCELLED
        except Exception as exc:  # an engine bug must not lose the request's slot
            logger.exception("engine error on %s", request.request_id)
            result = EngineResult.failure("engine_error", f"{type(exc).__name__}: {exc}")
        finally:
            engines.slots.release(cost=cost)
        results.put((request.custom_id, result))


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
