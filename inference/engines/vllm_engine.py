"""The real engine: one vLLM v1 `AsyncLLM` per worker process.

Requests go through vLLM's own OpenAI serving layer (`OpenAIServingChat`,
`OpenAIServingCompletion`, `OpenAIServingResponses`), wired up the way `vllm run_batch`
wires it, so chat templates, sampling defaults, usage, finish reasons, reasoning
parsing and tool-call parsing are vLLM's, not ours. What BatchGen adds:

- the batch-level context cap (`EngineRequest.max_context_length`): the serving
  classes are subclassed at their render hook, where the prompt has just been
  tokenized by vLLM, to reject prompts over the cap and to lower the output token
  limit to what the cap leaves;
- error mapping: nothing raises for a bad request, every failure becomes an
  `EngineResult` error with a BatchGen code;
- the output body shape of the API contract (`reasoning_content`, `tool_calls`), which
  each endpoint's spec gives (serving/endpoints/).

LoRA adapters are vLLM's too: the model's adapters are registered with
`OpenAIServingModels` as `vllm serve --lora-modules` does, so a request naming one
gets its `LoRARequest` from the serving layer, and one naming neither the model nor
an adapter is refused there.

One method per endpoint, `serve_<name>` for the spec named `name`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

import orjson
import pydantic
from vllm.config import StructuredOutputsConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.entrypoints.openai.completion.protocol import (
    CompletionRequest,
    CompletionResponse,
)
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from vllm.entrypoints.openai.models.protocol import BaseModelPath, LoRAModulePath
from vllm.entrypoints.openai.models.serving import OpenAIServingModels
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest
from vllm.entrypoints.pooling.embed.serving import ServingEmbedding
from vllm.entrypoints.pooling.scoring.serving import ServingScores
from vllm.entrypoints.serve import create_error_response
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.exceptions import VLLMValidationError
from vllm.renderers.chat_utils import ChatTemplateConfig
from vllm.renderers.inputs.preprocess import extract_prompt_len
from vllm.renderers.online_renderer import OnlineRenderer
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.metrics.loggers import StatLoggerBase

from inference.engines.vllm_scoring import scoring_serving, serve_rerank, serve_score
from serving.endpoints import ENDPOINTS, EndpointSpec
from serving.engines.base import (
    Engine,
    EngineConfig,
    EngineConfigError,
    EngineLoad,
    EngineRequest,
    EngineResult,
    EngineUnavailable,
)

logger = logging.getLogger(__name__)

# A batch line is one full answer: no streaming (its n choices come together).
_ONE_FULL_ANSWER = {"stream": False, "stream_options": None}
NOT_GENERATIVE = "model {!r} is an embedding model: it serves embeddings only"
# KV cache on CPU: about 23k tokens of SmolLM2-135M in float32 (45 KiB a token), so
# one full 8k context plus many short requests. VLLM_CPU_KVCACHE_SPACE (GiB) or
# engine_args["kv_cache_memory_bytes"] override it.
CPU_KV_CACHE_BYTES = 1 << 30

# The batch-level cap of the request being rendered. A context variable because the
# serving objects are shared by every concurrent request on the loop, while each
# generate() call runs in its own asyncio task (and so its own context).
_context_cap: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "batchgen_context_cap", default=None
)
# vLLM's renderer raises a VLLMValidationError naming one of these parameters when
# the prompt is longer than max_model_len (in characters or in tokens).
_PROMPT_LENGTH_PARAMS = frozenset({"input_tokens", "input_text"})


class PromptTooLong(Exception):
    def __init__(self, prompt_len: int, limit: int) -> None:
        if prompt_len > limit:
            message = f"Prompt length {prompt_len} exceeds model context {limit}"
        else:
            message = (
                f"Prompt length {prompt_len} leaves no room for output in model context {limit}"
            )
        super().__init__(message)
        self.prompt_len = prompt_len
        self.limit = limit


def _context_limit(max_model_len: int) -> int:
    cap = _context_cap.get()
    return max_model_len if cap is None else min(cap, max_model_len)


def _fit_context(serving: Any, request: Any, engine_inputs: list, field: str) -> None:
    """Apply the request's context limit to freshly rendered prompts.

    vLLM itself only knows `max_model_len`; the batch may lower it. A prompt that
    leaves no room for one output token is rejected; otherwise the output limit
    (`field` on the request, which vLLM then clamps to max_model_len - prompt)
    is lowered to what the limit leaves.
    """
    model_config = serving.model_config
    limit = _context_limit(model_config.max_model_len)
    prompt_len = max(extract_prompt_len(model_config, prompt) for prompt in engine_inputs)
    if prompt_len >= limit:
        raise PromptTooLong(prompt_len, limit)
    # A batch-level max_decoding_length larger than what the context leaves is a
    # ceiling, not an error: lower it to the room left after the prompt.
    room = limit - prompt_len
    requested = getattr(request, field)
    if field == "max_completion_tokens" and requested is None:
        # The chat request's max_tokens is a deprecated pydantic field: read it
        # without the warning. vLLM uses it when max_completion_tokens is unset.
        requested = vars(request).get("max_tokens")
    if requested is None or requested > room:
        setattr(request, field, room)


class _BatchServingChat(OpenAIServingChat):
    async def render_chat_request(self, request: ChatCompletionRequest):
        result = await super().render_chat_request(request)
        if not isinstance(result, ErrorResponse):
            _fit_context(self, request, result[1], "max_completion_tokens")
        return result


class _BatchServingCompletion(OpenAIServingCompletion):
    async def render_completion_request(self, request: CompletionRequest):
        result = await super().render_completion_request(request)
        if not isinstance(result, ErrorResponse):
            _fit_context(self, request, result, "max_tokens")
        return result


class _BatchServingResponses(OpenAIServingResponses):
    async def _render_resolved_response_inputs(self, request: ResponsesRequest, *args,
                                               **kwargs):
        result = await super()._render_resolved_response_inputs(request, *args, **kwargs)
        if not isinstance(result, ErrorResponse):
            _fit_context(self, request, [result.engine_input], "max_output_tokens")
        return result


class _LoadReporter(StatLoggerBase):
    """A vLLM stat logger that hands each step's scheduler figures (running and
    waiting requests, KV-cache usage) to the engine, which tells the worker: the
    figures `vllm serve` logs and exports, read as they arrive instead of estimated.
    One per engine core (data parallel: one per rank)."""

    def __init__(self, engine: VllmEngine, engine_index: int) -> None:
        self.engine = engine
        self.engine_index = engine_index

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None,
               engine_idx: int = 0) -> None:
        if scheduler_stats is not None:
            self.engine._core_load(self.engine_index, scheduler_stats)

    def log_engine_initialized(self) -> None:
        pass


class VllmEngine(Engine):
    name = "vllm"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._llm: AsyncLLM | None = None
        self._chat: _BatchServingChat | None = None
        self._completion: _BatchServingCompletion | None = None
        self._responses: _BatchServingResponses | None = None
        self._embedding: ServingEmbedding | None = None
        self._scores: ServingScores | None = None  # score and rerank (vllm_scoring.py)
        self._stats_task: asyncio.Task | None = None
        self._core_loads: dict[int, EngineLoad] = {}  # engine core (DP rank) -> last load

    @property
    def max_context_length(self) -> int:
        if self._llm is None:
            raise RuntimeError("VllmEngine.start() has not run")
        return self._llm.model_config.max_model_len

    @property
    def token_capacity(self) -> int | None:
        """Tokens the KV cache holds (blocks x block size), known after start().

        None for a pooling (embedding) model: its request is one forward pass over
        the prompt, with no output to decode and so nothing kept in the KV cache
        between steps; vLLM's scheduler batches what fits and the rest waits in its
        queue, with no preemption to avoid. An encoder-only model's cache is a
        placeholder anyway (128 tokens for all-MiniLM-L6-v2): taken as the budget it
        let about 7 requests into the engine at once, which then ran in batches
        too small to be efficient (benchmarks/embeddings.py)."""
        if self._llm is None or self._llm.model_config.runner_type == "pooling":
            return None
        cache = self._llm.vllm_config.cache_config
        if not cache.num_gpu_blocks:
            return None
        return cache.num_gpu_blocks * cache.block_size

    @property
    def max_running(self) -> int | None:
        """The scheduler's max_num_seqs (over all data-parallel ranks): the running
        set a step can hold. vLLM reports its load after every step."""
        if self._llm is None:
            return None
        config = self._llm.vllm_config
        return config.scheduler_config.max_num_seqs * config.parallel_config.data_parallel_size

    def _core_load(self, engine_index: int, stats) -> None:
        """On the engine loop, after each step of an engine core."""
        self._core_loads[engine_index] = EngineLoad(
            running=stats.num_running_reqs,
            waiting=stats.num_waiting_reqs + stats.num_skipped_waiting_reqs,
            kv_cache_usage=stats.kv_cache_usage)
        loads = list(self._core_loads.values())
        self.report_load(loads[0] if len(loads) == 1 else
                         EngineLoad(running=sum(load.running for load in loads),
                                    waiting=sum(load.waiting for load in loads),
                                    kv_cache_usage=max(load.kv_cache_usage for load in loads)))

    def engine_args(self) -> AsyncEngineArgs:
        import torch

        config = self.config
        kwargs: dict[str, Any] = {
            "model": config.model,
            "served_model_name": config.served_model_name,
            # Server default sampling is greedy (the API contract): vLLM's neutral
            # defaults, not the model folder's generation_config.json, plus
            # temperature 0 where the request and the batch say nothing (vLLM's
            # own default would be 1.0). top_p and top_k stay off.
            "generation_config": "vllm",
            "override_generation_config": {"temperature": 0.0},
            # Batch requests often share a system prompt or few-shot prefix: vLLM's
            # default turns prefix caching on for every model that supports it
            # (generative decoders), and off for embedding models, which cannot.
            # response_format's JSON is compact: measured with SmolLM2, a grammar that
            # lets the model emit whitespace between fields gets newlines until the
            # token limit, so the output never closes. xgrammar is the backend vLLM's
            # "auto" picks first; only it and guidance can forbid the whitespace.
            "structured_outputs_config": StructuredOutputsConfig(
                backend="xgrammar", disable_any_whitespace=True),
        }
        if config.max_context_length is not None:
            kwargs["max_model_len"] = config.max_context_length
        if config.parse_thinking:
            kwargs["reasoning_parser"] = config.reasoning_parser
        if not torch.cuda.is_available():
            # Measured here: bfloat16 is 4x slower than float32 on CPUs without
            # AMX, and torch.compile warm-up costs minutes for a small gain.
            kwargs.update(dtype="float32", enforce_eager=True)
            # Left alone, vLLM reserves gpu_memory_utilization (92%) of the NUMA
            # node's RAM for the KV cache and refuses to start when other processes
            # hold any of it. The CPU, not memory, bounds concurrency here.
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if config.sleep_mode and _sleep_mode_available():
            # Multiplexing on CUDA, ROCm or XPU: a swap puts this engine to sleep at
            # level 1 (weights to host memory, KV cache dropped) and wakes it later.
            kwargs["enable_sleep_mode"] = True
        if config.adapters:
            kwargs.update(
                enable_lora=True, max_loras=config.max_loras, max_lora_rank=config.max_lora_rank,
                # Every registered adapter stays loaded in host memory: a batch naming
                # one beyond max_loras swaps it onto the device, not in from disk.
                max_cpu_loras=max(config.max_loras, len(config.adapters)))
        kwargs.update(config.engine_args)
        return AsyncEngineArgs(**kwargs)

    async def start(self) -> None:
        if self._llm is not None:
            return
        # The engine core runs in a child process. Forking a process that already
        # runs threads (a Celery threads pool, this loop's thread) is unsafe, so
        # spawn it; vLLM's CPU platform forces spawn anyway.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

        try:
            engine_args = self.engine_args()  # TypeError: an argument vLLM does not know
            vllm_config = engine_args.create_engine_config(
                usage_context=UsageContext.OPENAI_BATCH_RUNNER
            )
        except Exception as exc:
            failure = _start_failure(type(exc).__name__, str(exc))
            if failure is None:
                raise
            raise failure from exc
        with _engine_core_errors(vllm_config) as root_cause:
            try:
                # Blocks this loop until the engine core is up; nothing else runs on
                # the engine loop before start() returns.
                llm = AsyncLLM.from_vllm_config(
                    vllm_config=vllm_config,
                    usage_context=UsageContext.OPENAI_BATCH_RUNNER,
                    enable_log_requests=engine_args.enable_log_requests,
                    disable_log_stats=engine_args.disable_log_stats,
                    # The scheduler's figures after every step, for admission (the
                    # worker keeps the engine's queue fed from them); vLLM's own
                    # loggers stay.
                    stat_loggers=[lambda _config, index: _LoadReporter(self, index)],
                )
            except Exception as exc:
                # The engine core process failed: what it raised is only in its log.
                cause = root_cause()
                failure = _start_failure(*cause) if cause else None
                if failure is None:
                    raise
                raise failure from exc
        try:
            models = self._build_serving(llm)
            self._scores = await scoring_serving(llm, models)
            # Loads each adapter into the engine now: a bad one stops the start-up.
            await models.init_static_loras()
        except BaseException:
            llm.shutdown()
            raise
        self._llm = llm
        if not engine_args.disable_log_stats:
            self._stats_task = asyncio.get_running_loop().create_task(self._log_stats(llm))
        logger.info(
            "vLLM engine ready: model=%s served as %r, max_model_len=%d",
            self.config.model,
            self.config.served_model_name,
            self.max_context_length,
        )

    def _build_serving(self, llm: AsyncLLM) -> OpenAIServingModels:
        """The serving objects `init_app_state` would build for run_batch: the
        embedding one for a pooling model, chat and completion for the others. The
        models object knows the model and its adapters (loaded by the caller)."""
        config = self.config
        models = OpenAIServingModels(
            engine_client=llm,
            base_model_paths=[
                BaseModelPath(name=config.served_model_name, model_path=config.model)
            ],
            lora_modules=[LoRAModulePath(name=adapter.name, path=adapter.path,
                                         base_model_name=config.served_model_name)
                          for adapter in config.adapters] or None,
        )
        if llm.model_config.runner_type == "pooling":
            self._embedding = ServingEmbedding(
                llm, models, request_logger=None, chat_template_config=ChatTemplateConfig())
        else:
            self._build_generative_serving(llm, models)
        return models

    def _build_generative_serving(self, llm: AsyncLLM, models: OpenAIServingModels) -> None:
        config = self.config
        reasoning_parser = config.reasoning_parser if config.parse_thinking else None
        tool_parser = config.tool_call_parser
        renderer = OnlineRenderer(
            model_config=llm.model_config,
            renderer=llm.renderer,
            request_logger=None,
            chat_template=None,  # the model's own template
            chat_template_content_format="auto",
            enable_auto_tools=tool_parser is not None,
            tool_parser=tool_parser,
            reasoning_parser=reasoning_parser,
        )
        renderer.warmup()
        self._chat = _BatchServingChat(
            llm,
            models,
            "assistant",
            online_renderer=renderer,
            request_logger=None,
            chat_template=None,
            chat_template_content_format="auto",
            reasoning_parser=reasoning_parser or "",
            enable_auto_tools=tool_parser is not None,
            tool_parser=tool_parser,
            # usage.prompt_tokens_details.cached_tokens: prefix-cache hits, per request.
            enable_prompt_tokens_details=True,
        )
        self._completion = _BatchServingCompletion(
            llm, models, online_renderer=renderer, request_logger=None,
            enable_prompt_tokens_details=True,
        )
        # As `vllm serve` builds it, on the same renderer and parsers as chat. No tool
        # server: a batch runs no built-in tools (validation refuses them). Its store
        # stays off (VLLM_ENABLE_RESPONSES_API_STORE), so no response is kept.
        self._responses = _BatchServingResponses(
            llm, models, renderer, request_logger=None, chat_template=None,
            chat_template_content_format="auto",
            reasoning_parser=reasoning_parser or "",
            enable_auto_tools=tool_parser is not None, tool_parser=tool_parser,
            enable_prompt_tokens_details=True,
        )

    async def generate(self, request: EngineRequest) -> EngineResult:
        if self._llm is None:
            raise RuntimeError("VllmEngine.start() has not run")
        cap_token = _context_cap.set(request.max_context_length)
        try:
            response = await self._serve(request)
        except PromptTooLong as exc:
            return EngineResult.failure("context_length_exceeded", str(exc))
        except pydantic.ValidationError as exc:
            return EngineResult.failure("invalid_request", _validation_message(exc))
        except VLLMValidationError as exc:
            if exc.parameter in _PROMPT_LENGTH_PARAMS:
                message = _prompt_too_long_message(exc, self.max_context_length)
                return EngineResult.failure("context_length_exceeded", message)
            return EngineResult.failure("invalid_request", str(exc))
        except EngineDeadError as exc:
            raise EngineUnavailable(str(exc)) from exc
        except Exception as exc:  # mapped the way vLLM's HTTP server maps it
            logger.exception("vLLM failed on request %s", request.request_id)
            return _failure_from(create_error_response(exc))
        finally:
            _context_cap.reset(cap_token)

        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # vLLM's full generators turn the cancellation into a "Client
            # disconnected" error after aborting the request; keep it a cancel.
            raise asyncio.CancelledError
        if isinstance(response, ErrorResponse):
            return _failure_from(response)
        if not isinstance(response, dict):
            return EngineResult.failure(
                "engine_error", f"unexpected response type {type(response).__name__}"
            )
        # Its `model` is vLLM's: the name of the model or of the adapter that answered.
        body = ENDPOINTS[request.endpoint].answer_as_asked(
            _output_body(response, ENDPOINTS[request.endpoint]), request.body)
        prompt_tokens, completion_tokens = ENDPOINTS[request.endpoint].token_counts(
            body["usage"])
        return EngineResult(body=body, prompt_tokens=prompt_tokens,
                            completion_tokens=completion_tokens)

    async def _serve(self, request: EngineRequest) -> Any:
        if not isinstance(request.body, dict):
            raise VLLMValidationError("request body must be a JSON object")
        spec = ENDPOINTS.get(request.endpoint)
        serve = getattr(self, f"serve_{spec.name}", None) if spec is not None else None
        if serve is None:
            raise VLLMValidationError(f"unsupported endpoint {request.endpoint!r}",
                                      parameter="url")
        # The body's model stays as the line named it: validation let only served
        # models through and the dispatcher sent this chunk to its model's worker, and
        # vLLM's OpenAIServingModels refuses any other name (never a substitution).
        body = {**request.body, "request_id": request.request_id}
        return await serve(body)

    # One method per endpoint spec (serving/endpoints/), named serve_<spec.name>: the
    # response body as a plain dict, or vLLM's ErrorResponse.

    async def serve_chat(self, body: dict[str, Any]) -> dict[str, Any] | ErrorResponse:
        serving = self._generative(self._chat)
        request = ChatCompletionRequest.model_validate({**body, **_ONE_FULL_ANSWER})
        return _dumped(await serving.create_chat_completion(request))

    async def serve_completion(self, body: dict[str, Any]) -> dict[str, Any] | ErrorResponse:
        serving = self._generative(self._completion)
        request = CompletionRequest.model_validate({**body, **_ONE_FULL_ANSWER})
        return _dumped(await serving.create_completion(request))

    async def serve_responses(self, body: dict[str, Any]) -> dict[str, Any] | ErrorResponse:
        serving = self._generative(self._responses)
        # The Response's id is its request id: OpenAI's resp_ prefix on the engine's
        # own unique id. One full answer, kept nowhere.
        request = ResponsesRequest.model_validate({
            **body, "request_id": f"resp_{body['request_id']}", "stream": False,
            "background": False, "store": False})
        return _dumped(await serving.create_responses(request))

    def _generative(self, serving: Any) -> Any:
        """The serving object, built only when the model generates text."""
        if serving is None:
            raise VLLMValidationError(NOT_GENERATIVE.format(self.config.served_model_name),
                                      parameter="url")
        return serving

    async def serve_embeddings(self, body: dict[str, Any]) -> dict[str, Any] | ErrorResponse:
        if self._embedding is None:
            raise VLLMValidationError(
                f"model {self.config.served_model_name!r} is not an embedding model",
                parameter="url")
        response = await self._embedding(EmbeddingCompletionRequest.model_validate(body))
        if isinstance(response, ErrorResponse):
            return response
        # The serving class answers with an HTTP response; its body is the JSON.
        return orjson.loads(response.body)

    async def serve_score(self, body: dict[str, Any]) -> dict[str, Any] | ErrorResponse:
        return await serve_score(self._scores, body, self.config.served_model_name)

    async def serve_rerank(self, body: dict[str, Any]) -> dict[str, Any] | ErrorResponse:
        return await serve_rerank(self._scores, body, self.config.served_model_name)

    @staticmethod
    async def _log_stats(llm: AsyncLLM) -> None:
        """vLLM's stats line (running and waiting requests, KV cache usage, prefix-cache
        hit rate) in the worker's log every VLLM_LOG_STATS_INTERVAL seconds while the
        engine works, as `vllm serve` logs it; AsyncLLM alone never does."""
        from vllm import envs

        while True:
            await asyncio.sleep(envs.VLLM_LOG_STATS_INTERVAL)
            await llm.do_log_stats()

    @property
    def can_sleep(self) -> bool:
        return (self._llm is not None
                and bool(self._llm.vllm_config.model_config.enable_sleep_mode))

    async def sleep(self) -> None:
        await self._llm.sleep(level=1)

    async def wake_up(self) -> None:
        await self._llm.wake_up()

    async def shutdown(self) -> None:
        if self._stats_task is not None:
            self._stats_task.cancel()
            self._stats_task = None
        llm, self._llm = self._llm, None
        self._chat = self._completion = self._responses = self._embedding = None
        self._scores = None
        if llm is not None:
            llm.shutdown()


# What vLLM raises for settings it cannot work with, whatever the host does meanwhile
# (its config checks, the engine core's KV cache check, an argument it does not know,
# pydantic's ValidationError); anything else (a device busy, out of memory, a lost
# process) may pass with a restart.
_CONFIG_ERRORS = frozenset({"ValueError", "TypeError", "ValidationError"})
# The settings a message of vLLM's about memory or length points at.
_MEMORY_WORDS = ("KV cache", "max seq len", "max_model_len", "gpu_memory_utilization",
                 "cache blocks")
_ESTIMATED_LENGTH = re.compile(r"estimated maximum model length is (\d+)")
# The last line of a Python traceback: "ValueError: To serve at least one request ...".
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


def _sleep_mode_available() -> bool:
    """vLLM offers sleep mode on CUDA, ROCm and XPU only: not on the CPU build."""
    from vllm.platforms import current_platform

    return current_platform.is_sleep_mode_available()


def _start_failure(kind: str, message: str) -> EngineConfigError | None:
    """The engine's start failed with `kind` (an exception's class name) and
    `message`: an EngineConfigError naming the setting to change when these settings
    can never start it, else None (a restart may help)."""
    if kind.rsplit(".", 1)[-1] not in _CONFIG_ERRORS:
        return None
    if any(word in message for word in _MEMORY_WORDS):
        setting = ("BATCHGEN_ENGINE_ARGS (kv_cache_memory_bytes, gpu_memory_utilization) "
                   "or BATCHGEN_MAX_CONTEXT_LENGTH")
        estimated = _ESTIMATED_LENGTH.search(message)
        if estimated:
            setting += f", e.g. BATCHGEN_MAX_CONTEXT_LENGTH={estimated.group(1)}"
    else:
        setting = "BATCHGEN_ENGINE_ARGS or the model (BATCHGEN_MODEL, BATCHGEN_MODELS)"
    return EngineConfigError(f"vLLM refused them: {kind}: {message}", setting=setting)


@contextlib.contextmanager
def _engine_core_errors(vllm_config: Any) -> Iterator[Any]:
    """While the engine core process starts, keep the errors it logs, and yield a
    function returning the (class name, message) of the exception it failed with.

    The engine core is another process: when it fails to start, AsyncLLM raises only
    "Engine core initialization failed. See root cause above", and the root cause is
    in that process's log. vLLM's own logging setting (LoggingConfig's
    pylogging_config_file, which the engine core applies first thing) adds a file
    handler to its default configuration for ERROR records. Left alone where the
    operator configures vLLM's logging."""
    logging_config = vllm_config.logging_config
    if not logging_config.configure_logging or logging_config.pylogging_config_file:
        yield lambda: None
        return
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    folder = tempfile.mkdtemp(prefix="batchgen-vllm-start-")
    errors = os.path.join(folder, "engine-core-errors.log")
    config = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
    config["formatters"]["batchgen_plain"] = {"format": "%(message)s"}
    config["handlers"]["batchgen_errors"] = {
        "class": "logging.FileHandler", "filename": errors, "level": "ERROR",
        # Opened when the engine core applies the configuration, not at its first
        # error: the folder is gone after the start, and a handler opening its file
        # then would raise out of vLLM's logging call (FileHandler opens outside its
        # error handling), failing the request that logged.
        "formatter": "batchgen_plain", "delay": False}
    config["loggers"]["vllm"]["handlers"].append("batchgen_errors")
    path = os.path.join(folder, "logging.json")
    with open(path, "w") as file:
        json.dump(config, file)
    vllm_config.logging_config = dataclasses.replace(logging_config,
                                                     pylogging_config_file=path)

    def root_cause() -> tuple[str, str] | None:
        try:
            with open(errors, errors="replace") as file:
                lines = file.read().splitlines()
        except OSError:
            return None
        found = [match.groups() for line in lines if (match := _EXCEPTION_LINE.match(line))]
        return found[-1] if found else None

    try:
        yield root_cause
    finally:
        # The running engine core keeps its handler on the unlinked file: a few
        # bytes an error, for a process that has its own log anyway.
        vllm_config.logging_config = logging_config
        shutil.rmtree(folder, ignore_errors=True)


def _failure_from(response: ErrorResponse) -> EngineResult:
    error = response.error
    if error.param in _PROMPT_LENGTH_PARAMS or "maximum context length" in error.message:
        return EngineResult.failure("context_length_exceeded", error.message)
    if HTTPStatus.BAD_REQUEST <= error.code < HTTPStatus.INTERNAL_SERVER_ERROR:
        return EngineResult.failure("invalid_request", error.message)
    return EngineResult.failure("engine_error", error.message)


def _prompt_too_long_message(exc: VLLMValidationError, max_model_len: int) -> str:
    """The renderer's verdict on a prompt over max_model_len, in BatchGen's words.

    It checks the character count before tokenizing, and stops tokenizing at
    max_model_len + 1 tokens, so the count may be a lower bound.
    """
    limit = _context_limit(max_model_len)
    if exc.parameter == "input_text":
        return f"Prompt of {exc.value} characters exceeds model context {limit} tokens"
    qualifier = "at least " if exc.value == max_model_len + 1 else ""
    return f"Prompt length {qualifier}{exc.value} exceeds model context {limit}"


def _validation_message(exc: pydantic.ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(part) for part in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    return "invalid request body: " + "; ".join(parts)


def _dumped(response: Any) -> dict[str, Any] | ErrorResponse:
    if isinstance(response, ChatCompletionResponse | CompletionResponse):
        return response.model_dump(mode="json", exclude_none=True)
    if isinstance(response, ResponsesResponse):
        # By alias, as vLLM's own server answers: a Response's text.format holds
        # OpenAI's json_schema config, whose `schema` is the pydantic field `schema_`.
        return response.model_dump(mode="json", exclude_none=True, by_alias=True)
    return response


def _output_body(body: dict[str, Any], spec: EndpointSpec) -> dict[str, Any]:
    """The response as the API contract shapes it (plain, JSON-serializable dict)."""
    spec.complete_usage(body.setdefault("usage", {}))
    return spec.shape_output(body)
