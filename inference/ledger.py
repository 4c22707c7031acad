"""The worker's chunk ledger: what its chunks did since the last flush, said to the
database in one transaction (batches.chunks.chunks_flush) per interval.

Chunk threads only write to the ledger: results written (`add`), a chunk finished
(`close`) or handed back (`release`). The flusher thread sends it all at once, every
`BATCHGEN_PROGRESS_FLUSH_SECONDS`, at once when a chunk closes or is released (its
thread is waiting), and at every heartbeat to renew the leases of the chunks held.
So a worker's statements per second stay the same whether it holds one chunk or
fifty, and nothing is written per request.

A flush that fails keeps its figures for the next one: nothing is counted twice,
nothing is lost. A chunk the database says this worker no longer holds (its lease
ran out and recovery requeued it) is marked lost; its thread stops.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future

from batches.chunks import Counts, FlushResult
from batches.usage import Usage

logger = logging.getLogger("batchgen.inference")


def _add(into: dict[int, Counts], chunk_id: int, completed: int, failed: int) -> None:
    was = into.get(chunk_id, (0, 0))
    into[chunk_id] = (was[0] + completed, was[1] + failed)


def _add_usage(into: dict[int, Usage], chunk_id: int, usage: Usage) -> None:
    total = into.setdefault(chunk_id, Usage())
    total += usage


class ChunkLedger:
    def __init__(self, flush) -> None:
        self._flush = flush  # WorkerDatabase.flush
        self._lock = threading.Lock()
        self._held: set[int] = set()
        self._progress: dict[int, Counts] = {}
        self._closing: dict[int, Counts] = {}
        self._releasing: dict[int, Counts] = {}
        self._usage: dict[int, Usage] = {}
        # chunk -> segments (name, size) written on an object store since the last flush
        self._segments: dict[int, list[tuple[str, int]]] = {}
        self._waiting: dict[int, Future] = {}
        self._lost: set[int] = set()
        self.urgent = threading.Event()  # a thread waits on the next flush
        self._empty = threading.Event()  # no chunk held
        self._empty.set()
        self.stop_batches: frozenset[str] = frozenset()

    # --- chunk threads ------------------------------------------------------------------

    def hold(self, chunk_id: int) -> None:
        with self._lock:
            self._held.add(chunk_id)
            self._empty.clear()

    def add(self, chunk_id: int, completed: int, failed: int,
            usage: Usage | None = None, segment: tuple[str, int] | None = None) -> None:
        if completed or failed:
            with self._lock:
                _add(self._progress, chunk_id, completed, failed)
                if usage:
                    _add_usage(self._usage, chunk_id, usage)
                if segment:
                    self._segments.setdefault(chunk_id, []).append(segment)

    def drop(self, chunk_id: int) -> None:
        """The chunk's thread failed: stop renewing its lease (what it wrote is still
        flushed), so recovery requeues it once the lease runs out, after a pause
        that keeps a chunk that fails every time from spinning through workers."""
        with self._lock:
            self._held.discard(chunk_id)
            if not self._held:
                self._empty.set()

    def is_lost(self, chunk_id: int) -> bool:
        return chunk_id in self._lost

    def close(self, chunk_id: int, completed: int = 0, failed: int = 0) -> Future:
        """The chunk ends: done, or skipped if its batch stopped. Resolves to the
        chunk's status, or None if it was lost."""
        return self._finish(self._closing, chunk_id, completed, failed)

    def release(self, chunk_id: int, completed: int = 0, failed: int = 0) -> Future:
        """This worker is stopping: account what was written, requeue the rest."""
        return self._finish(self._releasing, chunk_id, completed, failed)

    def _finish(self, into: dict[int, Counts], chunk_id: int, completed: int,
                failed: int) -> Future:
        future: Future = Future()
        with self._lock:
            _add(into, chunk_id, completed, failed)
            self._waiting[chunk_id] = future
        self.urgent.set()
        return future

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def held_ids(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._held)

    def wait_until_empty(self, timeout: float) -> bool:
        """Until every chunk held was closed, released or lost (and flushed)."""
        return self._empty.wait(timeout)

    # --- the flusher thread -------------------------------------------------------------

    def has_news(self) -> bool:
        return bool(self._progress or self._closing or self._releasing)

    def flush(self) -> FlushResult | None:
        """Send everything gathered so far; on failure keep it for the next flush."""
        with self._lock:
            self.urgent.clear()
            progress, closing, releasing = self._progress, self._closing, self._releasing
            usage, segments = self._usage, self._segments
            self._progress, self._closing, self._releasing = {}, {}, {}
            self._usage, self._segments = {}, {}
            held = set(self._held)
        if not (progress or closing or releasing or held):
            return None
        try:
            extra = {"segments": segments} if segments else {}
            result = self._flush(progress=progress, closing=closing, releasing=releasing,
                                 holding=held, usage=usage, **extra)
        except BaseException:
            with self._lock:
                for chunk_id, tokens in usage.items():
                    _add_usage(self._usage, chunk_id, tokens)
                for chunk_id, written in segments.items():
                    self._segments[chunk_id] = written + self._segments.get(chunk_id, [])
                for gathered, pending in ((progress, self._progress),
                                          (closing, self._closing),
                                          (releasing, self._releasing)):
                    for chunk_id, (completed, failed) in gathered.items():
                        _add(pending, chunk_id, completed, failed)
            raise
        with self._lock:
            self._lost |= result.lost
            ended = set(closing) | set(releasing)
            self._held -= ended | result.lost
            self._lost -= ended
            if not self._held:
                self._empty.set()
            waiting = {c: self._waiting.pop(c) for c in ended if c in self._waiting}
        self.stop_batches = frozenset(result.stop_batches)
        for chunk_id, future in waiting.items():
            future.set_result(None if chunk_id in result.lost
                              else result.closed.get(chunk_id, "released"))
        return result

    def fail_waiting(self, error: BaseException) -> None:
        """The worker is going away and cannot flush: wake every waiting thread."""
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            future.set_exception(error)
