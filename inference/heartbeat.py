"""An inference worker's flusher thread: it sends the chunk ledger (inference.ledger)
to the database in one transaction per interval, and beats (liveness, slot figures,
lease renewal, which batches must stop)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings

from core.outage import noted_outage
from inference.database import WorkerDatabase
from inference.engine_host import EngineHost
from inference.ledger import ChunkLedger
from inference.worker_state import WorkerState, chunk_key

logger = logging.getLogger("batchgen.inference")


class Heartbeat:
    def __init__(self, *, state: WorkerState, engines: EngineHost, database: WorkerDatabase,
                 ledger: ChunkLedger) -> None:
        self.state = state
        self.engines = engines
        self.database = database
        self.ledger = ledger
        # Run at every beat, before it (the storage probe, inference.storage_pause).
        self.at_beat: Callable[[], None] | None = None
        self._progress_failed = False  # said once

    def start(self) -> None:
        threading.Thread(target=self._flush_forever, name="flusher", daemon=True).start()

    def beat_once(self) -> None:
        """Beat now; raises what the database raised."""
        state, engines, slots = self.state, self.engines, self.engines.slots
        self.database.heartbeat(
            hostname=state.hostname, engine=engines.config.engine,
            # A multiplexing worker holds no model while it swaps (or before its first).
            model=("" if engines.engine is None or state.swapping.is_set()
                   else engines.config.served_model_name), capacity=slots.capacity,
            active=slots.active, tokens_active=slots.tokens_active,
            token_budget=slots.token_budget,
            ready=state.ready.is_set() and not state.going_away(),
            completed=state.completed, failed=state.failed_requests, tokens=state.tokens,
            work=(slots.busy_seconds, state.prompt_tokens_computed, state.tokens_computed),
            prompt_weight=state.engine_prompt_weight(),
            storage_error=state.storage_error, held_chunks=self.held_chunk_ids(),
            chunk_tails=chunk_tails(self.progress()),
            admission=None if engines.engine is None else engines.engine.admission,
            max_context_length=(engines.engine.max_context_length
                                if engines.engine is not None and state.ready.is_set() else 0),
        )

    def beat(self) -> None:
        """Beat now; a failure is logged (an outage once) and the next beat retries."""
        try:
            self.beat_once()
        except Exception as exc:
            if not noted_outage(exc):
                logger.exception("heartbeat failed; retrying")

    def progress(self) -> dict[str, tuple[int, int | None]]:
        """The engine's requests as it tells them (Engine.progress), for the ETA only:
        a failure to read them is said once and beats without them, never costs the
        beat that keeps the worker live."""
        engine = self.engines.engine
        try:
            return {} if engine is None else engine.progress()
        except Exception:
            if not self._progress_failed:
                self._progress_failed = True
                logger.warning("reading the engine's requests for the ETA failed; "
                               "heartbeats go on without them", exc_info=True)
            return {}

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

    def flush_once(self) -> None:
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
        stopping = self.state.stopping
        while not stopping.is_set():
            urgent = self.ledger.urgent.wait(interval)
            if stopping.is_set():
                return
            now = time.monotonic()
            beat = now >= heartbeat_due
            if urgent or beat or (self.ledger.has_news() and now - last_flush >= interval):
                self.flush_once()
                last_flush = now
            if beat:
                heartbeat_due = now + settings.BATCHGEN_HEARTBEAT_SECONDS
                if self.at_beat is not None:
                    self.at_beat()
                self.beat()


def chunk_tails(progress: dict[str, tuple[int, int | None]]) -> dict[str, list]:
    """Each chunk's requests in the engine (Engine.progress) as the ETA reads them
    (Worker.chunk_tails): {"<batch_id>-<index>": [requests, most tokens one of
    them may still generate (None: one has no limit), requests that have generated
    a token (their prompts computed)]}."""
    tails: dict[str, list] = {}
    for ours, (generated, limit) in progress.items():
        left = None if limit is None else max(limit - generated, 0)
        tail = tails.setdefault(chunk_key(ours), [0, 0, 0])
        tail[0] += 1
        tail[1] = None if left is None or tail[1] is None else max(tail[1], left)
        tail[2] += generated > 0
    return tails
