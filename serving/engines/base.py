"""The contract between the inference worker and an engine.

The worker owns one engine and one asyncio event loop (in a thread of its own). It
calls `start()` once, then `generate()` concurrently for every request it has a slot
for. Cancelling the asyncio task that awaits `generate()` must abort the request
inside the engine (that is how cancelled batches free GPU work).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    name: str  # the id requests name in body.model
    path: str  # a PEFT LoRA folder made for the engine's model


@dataclass(frozen=True, slots=True)
class EngineConfig:
    engine: str  # a name in serving.engines.registry.ENGINES
    model: str  # path of a local Hugging Face model folder
    served_model_name: str  # the id shown in /v1/models and in output bodies
    max_context_length: int | None = None  # server cap, prompt + completion; None = model's
    parse_thinking: bool = False
    reasoning_parser: str = "deepseek_r1"  # vLLM reasoning parser used when parse_thinking
    tool_call_parser: str | None = None  # a vLLM tool parser name, e.g. "hermes"
    sim_latency_ms: float = 0.0  # simulated engine only
    sim_token_latency_ms: float = 0.0  # simulated engine only: per output token
    # Tokens admitted into the engine at once; None = the engine's KV cache capacity.
    token_budget: int | None = None
    # The LoRA adapters of this model, each answered under its own name.
    adapters: tuple[LoraAdapter, ...] = ()
    max_loras: int = 4  # adapters in the engine at once (vLLM only)
    max_lora_rank: int = 16  # vLLM sizes its adapter buffers by it
    # Passed through to vLLM's AsyncEngineArgs (GPU users: tensor_parallel_size,
    # gpu_memory_utilization, max_num_seqs, dtype, quantization, ...).
    engine_args: dict[str, Any] = field(default_factory=dict)
    # The openai-http engine: its server (`model` is then the id that server serves),
    # its timeouts in seconds and the priority its requests carry (None: none sent).
    engine_url: str = ""
    engine_api_key: str = ""
    engine_timeout: float = 600.0
    engine_retry_seconds: float = 600.0
    engine_start_timeout: float = 900.0
    engine_priority: int | None = None
    # Adaptive concurrency (inference/adaptive.py): the batch requests at the server
    # follow its load, between a floor and a ceiling; off: as many as there are slots.
    adaptive: bool = False
    adaptive_target: float = 1.5
    adaptive_floor: int = 1
    adaptive_ceiling: int = 256
    # A multiplexing worker may put this engine to sleep for another model and wake
    # it again (vLLM's sleep mode, where the platform offers it: inference/swap.py).
    sleep_mode: bool = False


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str  # unique inside the engine while it runs
    custom_id: str
    endpoint: str  # a URL of serving.endpoints.ENDPOINTS
    # The request body with batch-level defaults already merged in
    # (see serving.params.resolve_body). If neither max_tokens nor
    # max_completion_tokens is present, the engine uses what remains of the context.
    body: dict[str, Any]
    # Batch-level cap on prompt + completion tokens; None means the engine's own.
    max_context_length: int | None = None


@dataclass(slots=True)
class EngineResult:
    """Either `body` (an OpenAI chat.completion / text_completion object) or `error`."""

    body: dict[str, Any] | None = None
    error: dict[str, str] | None = None  # {"code": ..., "message": ...}
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def failure(cls, code: str, message: str) -> EngineResult:
        return cls(error={"code": code, "message": message})


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What the engine's scheduler reported after a step."""

    running: int  # requests it runs (holding KV cache)
    waiting: int  # requests in its queue, not yet scheduled
    kv_cache_usage: float = 0.0  # 0..1


class EngineUnavailable(Exception):
    """The engine itself is gone (its process died): no request can run here any
    more. The worker stops and its chunks are requeued; nothing is written."""


class EngineConfigError(Exception):
    """The engine cannot start with these settings, and starting it again with the
    same ones fails the same way (a KV cache too small for the model's context, an
    unknown engine argument): a permanent failure, unlike a transient one (a device
    busy, a server not up yet) that a restart may cure. The worker exits with
    EX_CONFIG and its supervisor does not restart it. `setting` names what to change."""

    def __init__(self, message: str, *, setting: str) -> None:
        super().__init__(message)
        self.setting = setting

    def __str__(self) -> str:
        return f"{self.args[0]} (change {self.setting})"


class Engine(abc.ABC):
    name: str = "engine"

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        # Called (on the engine loop) with every load the engine reports, if it
        # reports any (max_running is not None); the worker admits from it.
        self.load_listener: Callable[[EngineLoad], None] | None = None
        # Called (on the engine loop) with the prompt tokens each step computed, the
        # tokens it generated, the requests it finished and its seconds in the engine
        # (None where it cannot tell), if the engine tells them (reports_work).
        self.work_listener: Callable[[int, int, int, float | None], None] | None = None

    @property
    @abc.abstractmethod
    def max_context_length(self) -> int:
        """Effective prompt + completion limit in tokens (after start())."""

    @property
    def token_capacity(self) -> int | None:
        """How many tokens (prompt + output) the engine holds at once, if it knows;
        the worker admits requests within it (length-aware admission)."""
        return None

    @property
    def max_running(self) -> int | None:
        """How many requests the engine's scheduler runs at once, if the engine
        reports its load (known after start()): then it calls `load_listener` after
        each step, and the worker keeps its queue fed from that instead of from a
        token estimate. None for an engine that reports nothing."""
        return None

    @property
    def admission(self) -> dict | None:
        """How the engine bounds its own requests in flight (adaptive concurrency), as
        the worker's heartbeat reports it; None when it does not."""
        return None

    @property
    def reports_work(self) -> bool:
        """Whether the engine tells its work step by step as it does it (calls
        `work_listener`): the prompt tokens it prefills (prefix-cache hits left out)
        and the tokens it generates. Else the worker counts each request's work when
        its answer comes back, which on an engine running many requests side by side
        lags the work by a request's time (the ETA's rate and prompt cost fit,
        batches/estimates.py, read these figures)."""
        return False

    def progress(self) -> dict[str, tuple[int, int | None]]:
        """The requests in the engine now, by their request_id: the tokens each has
        generated so far and its output limit (None: none known), from an engine that
        can tell (vLLM's); empty from the others. Called on the heartbeat's thread,
        not on the engine loop. The ETA starts a chunk whose requests are all in the
        engine where its longest one is (batches.eta.Held.left_steps)."""
        return {}

    def report_work(self, prompt_tokens: int, output_tokens: int, finished: int = 0,
                    seconds: float | None = None) -> None:
        listener = self.work_listener
        if listener is not None:
            listener(prompt_tokens, output_tokens, finished, seconds)

    def report_load(self, load: EngineLoad) -> None:
        listener = self.load_listener
        if listener is not None:
            listener(load)

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model. Called once, on the worker's engine loop. Raises
        EngineConfigError when these settings can never start the engine."""

    @abc.abstractmethod
    async def generate(self, request: EngineRequest) -> EngineResult:
        """Run one request to completion. Never raises for a bad request: returns an
        EngineResult with `error` (e.g. code `context_length_exceeded`). Raises
        EngineUnavailable when the engine can run nothing at all."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release the engine's resources."""

    @property
    def can_sleep(self) -> bool:
        """Whether `sleep()` frees the device while keeping the weights in host memory,
        so that `wake_up()` (a copy back) replaces a stop and a start at a swap."""
        return False

    async def sleep(self) -> None:
        raise NotImplementedError

    async def wake_up(self) -> None:
        raise NotImplementedError
