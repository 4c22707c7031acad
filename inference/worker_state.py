"""What every role of an inference worker reads about the worker as a whole: its
name, whether it is ready, draining, stopping or swapping, whether its engine failed
or its storage is full, and the requests it ran. One object, handed to each role
(inference/runtime.py composes them), so the roles share these flags without
reaching into one another, and none calls back into the role that called it."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass(eq=False)
class WorkerState:
    name: str = ""
    multiplex: bool = False  # holds the model the residency scheduler gives it
    hostname: str = field(default_factory=socket.gethostname)
    ready: threading.Event = field(default_factory=threading.Event)
    draining: threading.Event = field(default_factory=threading.Event)  # SIGTERM
    stopping: threading.Event = field(default_factory=threading.Event)
    swapping: threading.Event = field(default_factory=threading.Event)  # no new request in
    swap_cancel: threading.Event = field(default_factory=threading.Event)  # ... nor in flight
    failed: BaseException | None = None
    permanent_failure: bool = False  # the engine can never start with these settings
    # Why results cannot be written (the storage volume full), while they cannot
    # (inference.storage_pause).
    storage_error: str = ""
    # Stops and restarts the consumption of this worker's queue while storage is
    # full or a model swaps (inference.signals.QueueSwitch; None outside Celery).
    queue_switch: object | None = None
    completed: int = 0  # requests this worker ran, as the heartbeat shows them
    failed_requests: int = 0
    tokens: int = 0
    _stats_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.name = self.name or f"{self.hostname}:{os.getpid()}:{int(time.time())}"

    def count(self, result) -> None:
        """A request's result (an EngineResult) was written and accounted."""
        with self._stats_lock:
            if result.error is None:
                self.completed += 1
            else:
                self.failed_requests += 1
            self.tokens += result.completion_tokens

    def switch_queue(self) -> None:
        """Consume this worker's queue, or not, as its storage and swap now say."""
        if self.queue_switch is not None:
            self.queue_switch.changed()

    def going_away(self) -> bool:
        """Draining for a stop, or without an engine: chunks in hand are handed back."""
        return self.draining.is_set() or self.failed is not None
