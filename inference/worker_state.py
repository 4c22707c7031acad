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

from batches.eta import PromptFit
from batches.usage import Usage


def request_id(batch_id: str, index: int, position: int, attempts: int) -> str:
    """The id of a chunk's request in the engine, unique while it runs (a chunk run
    again has more attempts): its chunk's key (chunk_key), then its place in it."""
    return f"{batch_id}-{index}-{position}-{attempts}"


def chunk_key(request_id: str) -> str:
    """The chunk of a request_id, as "<batch_id>-<index>" (Worker.chunk_tails)."""
    return request_id.rsplit("-", 2)[0]


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
    # The work its engines did, as the heartbeat shows it for the ETA's rate and cost
    # fit (batches/estimates.py): prompt tokens computed and tokens generated, told step
    # by step by an engine that reports its work (add_work), else counted from each
    # answer as it comes back (its prompt tokens less the cached ones its usage names).
    prompt_tokens_computed: int = 0
    tokens_computed: int = 0
    work_from_engine: bool = False
    # Each step's seconds over its work, from an engine that tells both (add_work).
    step_fit: PromptFit = field(default_factory=PromptFit)
    _stats_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.name = self.name or f"{self.hostname}:{os.getpid()}:{int(time.time())}"

    def count(self, results: list, usage: Usage) -> None:
        """Requests' results (EngineResults) were written and accounted; `usage` is
        their answers' usage summed (the chunk's flush sums it once for both)."""
        with self._stats_lock:
            output = 0
            for result in results:
                if result.error is None:
                    self.completed += 1
                else:
                    self.failed_requests += 1
                output += result.completion_tokens
            self.tokens += output
            if not self.work_from_engine:
                self.prompt_tokens_computed += max(usage.input_tokens - usage.cached_tokens, 0)
                self.tokens_computed += output

    def add_work(self, prompt_tokens: int, output_tokens: int, finished: int = 0,
                 seconds: float | None = None) -> None:
        """An engine step's work, from an engine that reports it (Engine.reports_work):
        its prompt tokens computed, tokens generated, requests finished and, where the
        engine tells it, its `seconds` in the engine, which the step fit learns from."""
        with self._stats_lock:
            self.prompt_tokens_computed += prompt_tokens
            self.tokens_computed += output_tokens
            if seconds is not None and seconds > 0:
                self.step_fit.add(seconds, output_tokens + finished, prompt_tokens, seconds)

    def new_engine(self) -> None:
        """Another engine (a start, a swap): its steps are fitted afresh."""
        with self._stats_lock:
            self.step_fit = PromptFit()

    def engine_prompt_weight(self) -> float | None:
        """A prompt token's cost against an output token's as the engine's steps tell
        (batches.eta.PromptFit over steps instead of the refresh's intervals): a step
        that prefills a chunk of prompts beside one that only decodes gives the fit its
        spread within the engine's first seconds, where the intervals take as long as
        the mix of batches takes to vary. None until the steps tell it."""
        with self._stats_lock:
            return self.step_fit.weight()

    def switch_queue(self) -> None:
        """Consume this worker's queue, or not, as its storage and swap now say."""
        if self.queue_switch is not None:
            self.queue_switch.changed()

    def going_away(self) -> bool:
        """Draining for a stop, or without an engine: chunks in hand are handed back."""
        return self.draining.is_set() or self.failed is not None
