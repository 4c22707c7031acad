"""An inference worker's engine and its life: the asyncio loop that owns it, its
start, the slots it admits requests into, its replacement at a model swap
(multiplexing), its loss, and its stop."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import threading
import time
from pathlib import Path

import psutil
from django.conf import settings

from inference.engines import (
    Engine,
    EngineConfig,
    EngineConfigError,
    LoraAdapter,
    engine_spec,
    load_engine,
)
from inference.slots import SlotPool
from inference.worker_state import WorkerState

logger = logging.getLogger("batchgen.inference")

SHUTDOWN_SECONDS = 120.0  # at a swap, the longest wait for the old engine to stop
STOP_SECONDS = 30.0  # at the worker's stop, the longest wait for each engine
# A sleeping model's weights may take this share of the host's available memory at
# most: the rest is for the processes and the page cache the next load reads through.
HOST_MEMORY_SHARE = 0.7

# What a multiplexing worker holds before the scheduler gives it a model: no engine.
NO_MODEL = EngineConfig(engine="", model="", served_model_name="")


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


def fits_host_memory(model_path: str) -> bool:
    """Whether the model folder's weights fit the host's available memory (vLLM's
    sleep level 1 copies them there), with room to spare."""
    folder = Path(model_path)
    if not folder.is_dir():
        return True  # nothing on disk to measure (a simulated or remote model)
    weights = sum(path.stat().st_size for pattern in ("*.safetensors", "*.bin", "*.pt")
                  for path in folder.glob(pattern))
    return weights <= HOST_MEMORY_SHARE * psutil.virtual_memory().available


class EngineHost:
    """The engine of one worker on its own event loop (every request is a task on
    it), the slots that admit requests into it, and the engines put to sleep at a
    swap (model -> engine, vLLM's sleep mode on a GPU)."""

    def __init__(self, *, config: EngineConfig, capacity: int, state: WorkerState) -> None:
        self.state = state
        self.config = config
        self.slots = SlotPool(capacity, token_budget=config.token_budget)
        # A multiplexing worker loads the model the scheduler gives it (inference/swap.py).
        self.engine: Engine | None = None if state.multiplex else load_engine(config)
        self.asleep: dict[str, tuple[Engine, EngineConfig]] = {}
        self.loop = asyncio.new_event_loop()

    def start_loop(self) -> None:
        threading.Thread(target=self.loop.run_forever, name="engine-loop", daemon=True).start()

    def start(self) -> None:
        """Start the engine; the worker is ready once it is up (or failed)."""
        started = asyncio.run_coroutine_threadsafe(self.engine.start(), self.loop)
        started.add_done_callback(self._engine_started)

    def _engine_started(self, future) -> None:
        error = future.exception()
        if isinstance(error, EngineConfigError):
            self.engine_lost(error, "cannot start with these settings, and is not "
                                    "started again with them", permanent=True)
        elif error is not None:
            self.engine_lost(error, "failed to start")
        else:
            self._admission()
            self._count_work()
        self.state.ready.set()

    def replace(self, model_id: str) -> float:
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
        asleep = self.asleep.pop(model_id, None)
        engine, config = asleep or (None, dataclasses.replace(
            engine_config_from_settings(model_id), sleep_mode=True))
        self.config = config
        self.slots = SlotPool(self.slots.capacity, token_budget=config.token_budget)
        try:
            if engine is not None:
                self.on_loop(engine.wake_up())
            else:
                engine = load_engine(config)
                self.on_loop(engine.start(), timeout=None)
        except BaseException:
            # Hold nothing, as before a first swap; what the failed start left running
            # (vLLM's engine core may be up) goes now, not with the worker.
            self.config = NO_MODEL
            if engine is not None:
                self._discard(engine)
            raise
        self.engine = engine
        self._admission()
        self._count_work()
        return stopped

    def _put_away(self, engine: Engine, config: EngineConfig) -> None:
        if engine.can_sleep and fits_host_memory(config.model):
            self.on_loop(engine.sleep())
            self.asleep[config.served_model_name] = (engine, config)
            logger.info("model %s sleeps in host memory", config.served_model_name)
        else:
            self.on_loop(engine.shutdown())

    def _discard(self, engine: Engine) -> None:
        try:
            self.on_loop(engine.shutdown())
        except Exception:
            logger.exception("stopping the engine that failed to start failed")

    def on_loop(self, coroutine, *, timeout: float | None = SHUTDOWN_SECONDS):
        """Run `coroutine` on the engine loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def _count_work(self) -> None:
        """The worker's work figures (WorkerState.add_work) step by step from an
        engine that tells them, else from each answer."""
        engine = self.engine
        self.state.work_from_engine = engine.reports_work
        self.state.new_engine()
        if engine.reports_work:
            engine.work_listener = self.state.add_work

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

    def engine_lost(self, error: BaseException, what: str, *, permanent: bool = False) -> None:
        """Without an engine this worker can do nothing: stop taking chunks and exit,
        so the supervisor (or the container's restart policy) starts a fresh one and
        the chunks it held are requeued. `permanent`: these settings can never start
        the engine, so the worker exits with EX_CONFIG, which tells the supervisor not
        to start it again (see InferenceRuntime.exit_code())."""
        state = self.state
        if state.failed is not None:
            return
        state.failed = error
        state.permanent_failure = permanent
        state.ready.set()
        logger.critical("the %s engine of model %s %s: %s; stopping this worker",
                        self.config.engine, self.config.served_model_name, what,
                        error if permanent else repr(error))
        os.kill(os.getpid(), signal.SIGTERM)

    def shutdown(self) -> None:
        """Stop the engine and every sleeping one (the worker stops)."""
        if self.engine is not None:
            self.on_loop(self.engine.shutdown(), timeout=STOP_SECONDS)
        for engine, _ in self.asleep.values():
            self.on_loop(engine.shutdown(), timeout=STOP_SECONDS)

    def stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
