"""What every role of an inference worker reads about the worker as a whole: its
name, whether it is ready, draining, stopping or swapping, and whether its engine
failed. One object, handed to each role (inference/runtime.py composes them), so the
roles share these flags without reaching into one another."""

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

    def __post_init__(self) -> None:
        self.name = self.name or f"{self.hostname}:{os.getpid()}:{int(time.time())}"

    def going_away(self) -> bool:
        """Draining for a stop, or without an engine: chunks in hand are handed back."""
        return self.draining.is_set() or self.failed is not None
