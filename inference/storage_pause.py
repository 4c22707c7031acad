"""A full storage volume pauses the worker (docs/reliability.md, "Faults"): chunks
holding results they could not append keep them and retry; nothing new enters the
engine; chunks with nothing in flight are handed back; the worker stops consuming its
queue and refuses, unclaimed, a chunk delivered meanwhile. It resumes by itself when
an append, or a probe write at a heartbeat, finds room again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from core.errors import is_storage_full
from core.outage import OBJECT_STORE, ObjectStoreUnavailable, outage_began
from files import backends
from files.incremental import append_lines, probe_room
from inference.database import WorkerDatabase
from inference.ledger import ChunkLedger
from inference.worker_state import WorkerState

logger = logging.getLogger("batchgen.inference")

# While the storage volume is full, a chunk holds its results and retries the
# append after these many seconds, doubling up to the cap.
STORAGE_RETRY_FIRST = 1.0
STORAGE_RETRY_MAX = 30.0


class StoragePause:
    """Why results cannot be written (`error`, kept on the worker's state: the
    storage volume full), while they cannot; how many chunks now hold results it did
    not take; the volume to probe.

    `heartbeat`: beats now (raising on failure), so /health and /v1/pool/status show
    the pause at once."""

    def __init__(self, *, state: WorkerState, database: WorkerDatabase, ledger: ChunkLedger,
                 heartbeat: Callable[[], None]) -> None:
        self.state = state
        self.database = database
        self.ledger = ledger  # which batches must stop
        self._heartbeat = heartbeat
        self._waiting = 0
        self._dir: Path | None = None
        self._lock = threading.Lock()
        # Wakes chunks waiting to retry an append: the probe found room, or a drain.
        self._changed = threading.Condition()

    @property
    def error(self) -> str:
        return self.state.storage_error

    @error.setter
    def error(self, value: str) -> None:
        self.state.storage_error = value

    @property
    def on_object_store(self) -> bool:
        return not isinstance(backends.current(), backends.PathStorage)

    def write(self, batch_id: str, index: int, output: Path, lines: list[bytes],
              segment: str | None = None) -> bool:
        """Append finished results. While the storage volume is full, hold them (the
        heartbeat keeps the chunk's lease) and retry with backoff until there is room,
        so no inference is lost to a full disk. They are given up only when the batch
        or this worker stops: then they are not counted, and are not in the file, so
        whichever attempt runs the chunk next runs them again. Returns whether written.

        On an object store the lines go up as the immutable object `segment`
        (files/segments.py), which counts once the ledger's flush records it; a store
        that does not answer pauses the worker as a full volume does."""
        delay = STORAGE_RETRY_FIRST
        waiting = written = False
        try:
            while True:
                try:
                    if segment is None:
                        append_lines(output, lines)
                    else:
                        backends.current().put_bytes(segment, b"".join(lines))
                    written = True
                    return True
                except (OSError, ObjectStoreUnavailable) as exc:
                    if not (isinstance(exc, ObjectStoreUnavailable) or is_storage_full(exc)):
                        raise
                    if not waiting:
                        waiting = True
                        self._full(batch_id, output, exc)
                    else:  # another chunk of the batch may have cleared it meanwhile
                        self.tell_full(batch_id)
                with self._changed:
                    self._changed.wait(delay)
                if self.state.going_away() or batch_id in self.ledger.stop_batches:
                    logger.warning("chunk %s#%s stops with %s result(s) unwritten (storage "
                                   "full); they run again if the batch goes on",
                                   batch_id, index, len(lines))
                    return False
                delay = min(delay * 2, STORAGE_RETRY_MAX)
        finally:
            if waiting:
                # The batch's error stays while it still waits (this worker stopping).
                self._room(batch_id, written=written, batch_resumed=written or
                           batch_id in self.ledger.stop_batches)

    def _full(self, batch_id: str, output: Path, error: Exception) -> None:
        unreachable = isinstance(error, ObjectStoreUnavailable)
        with self._lock:
            self._waiting += 1
            first = not self.error
            self.error = (f"object store unreachable writing results ({error})" if unreachable
                          else f"{error.strerror} writing results to {output.parent}")
            self._dir = None if unreachable else output.parent
        if first and unreachable:
            outage_began(OBJECT_STORE, error)  # one WARNING: an outage, not a fault
            self.state.switch_queue()
        elif first:
            logger.error("storage full: cannot append results to %s (%s); this worker "
                         "pauses: chunks hold their results and retry, no new chunk is "
                         "taken and those not started are handed back, until space is "
                         "freed on the volume", output, error.strerror)
            self.state.switch_queue()
        self._tell(self.database.storage_full, batch_id)

    def _room(self, batch_id: str, *, written: bool, batch_resumed: bool) -> None:
        """A chunk stops waiting: its results written, or given up (its batch or this
        worker stopped). Only a write shows there is room again: after a chunk gave
        up, the heartbeat's probe tells (probe())."""
        with self._lock:
            self._waiting -= 1
            resumed = written and self._waiting == 0 and bool(self.error)
            if resumed:
                self.error = ""
        if resumed:
            self._resumed()
        if batch_resumed:
            self._tell(self.database.storage_resumed, batch_id)

    def probe(self) -> None:
        """Paused: once a probe write finds room on the volume, wake the chunks that
        wait to retry their appends (their backoff reaches 30 s), or, when none does
        (they gave their results up), resume."""
        with self._lock:
            directory = self._dir if self.error else None
            store_down = bool(self.error) and directory is None
        if store_down:
            try:
                backends.current().probe()
            except ObjectStoreUnavailable:
                return
        elif directory is None:
            return
        else:
            try:
                probe_room(directory)
            except OSError as exc:
                if not is_storage_full(exc):
                    logger.warning("cannot probe %s for room: %s", directory, exc)
                return
        with self._lock:
            resumed = bool(self.error) and not self._waiting
            if resumed:
                self.error = ""
        if resumed:
            self._resumed()
        self.wake_waiters()

    def wake_waiters(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _resumed(self) -> None:
        logger.warning("the storage volume takes results again; this worker resumes")
        self.state.switch_queue()

    def tell_full(self, batch_id: str) -> None:
        """Show (again) on the batch that it waits on the full volume."""
        self._tell(self.database.storage_full, batch_id, heartbeat=False)

    def _tell(self, change, batch_id: str, *, heartbeat: bool = True) -> None:
        """Show the state on the batch and, through a heartbeat now, in /health and
        /v1/pool/status. A failure here must not lose the results being held."""
        try:
            change(batch_id)
            if heartbeat:
                self._heartbeat()
        except Exception:
            logger.exception("could not record the storage state of batch %s", batch_id)
