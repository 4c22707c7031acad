"""The real engine: one vLLM v1 `AsyncLLM` per worker process.

Requests go through vLLM's own OpenAI serving layer (`OpenAIServingChat`,
`OpenAIServingCompletion`, `OpenAIServingResponses`), wired up the way `vllm run_batch`
wires it, so chat templates, sampling defaults, usage, finish reasons, reasoning
parsing and tool-call parsing are vLLM's, not ours. What BatchGen adds:

- the batch-level context cap (`EngineRequest.max_context_length`): the serving
  classes are subclassed at their render hook, where the prompt has just been
  tokenized by vLLM, to reject prompts over the cap and to lower the output token
  limit to what the cap leaves (inference/engines/vllm_serving.py);
- the engine's arguments on this host, and a failed start told apart by its cause
  (inference/engines/vllm_start.py);
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
import logging
import math
import os
from http import HTTPStatus
from typing import Any

import orjson
import pydantic
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionRequest,
    CompletionResponse,
)
from vllm.entrypoints.openai.models.protocol import BaseModelPath, LoRAModulePath
from vllm.entrypoints.openai.models.serving import OpenAIServingModels
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest
from vllm.entrypoints.pooling.embed.serving import ServingEmbedding
from vllm.entrypoints.pooling.scoring.serving import ServingScores
from vllm.entrypoints.serve import create_error_response
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.exceptions import VLLMValidationError
from vllm.renderers.chat_utils import ChatTemplateConfig
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.metrics.loggers import StatLoggerBase

from inference.engines.vllm_scoring import scoring_serving, serve_rerank, serve_score
from inference.engines.vllm_serving import (
    _PROMPT_LENGTH_PARAMS,
    PromptTooLong,
    _BatchServingChat,
    _BatchServingCompletion,
    _BatchServingResponses,
    _context_cap,
    _context_limit,
    generative_serving,
)
from inference.engines.vllm_start import (  # noqa: F401 (the rest: their tests' names)
    CPU_KV_CACHE_BYTES,
    _engine_core_errors,
    _start_failure,
    engine_args,
    log_stats,
    start_llm,
)
from serving.endpoints import ENDPOINTS, EndpointSpec
from serving.engines.base import (
    Engine,
    EngineConfig,
    EngineLoad,
    EngineRequest,
    EngineResult,
    EngineUnavailable,
)

logger = logging.getLogger(__name__)

# A batch line is one full answer: no streaming (its n choices come together).
_ONE_FULL_ANSWER = {"stream": False, "stream_options": None}
NOT_GENERATIVE = "model {!r} is an embedding model: it serves embeddings only"


class _LoadReporter(StatLoggerBase):
    """A vLLM stat logger that hands each step's scheduler figures (running and
    waiting requests, KV-cache usage) and its work (prompt tokens computed, tokens
    generated) to the engine, which tells the worker: the figures `vllm serve` logs
    and exports, read as they arrive instead of estimated. One per engine core (data
    parallel: one per rank)."""

    def __init__(self, engine: VllmEngine, engine_index: int) -> None:
        self.engine = engine
        self.engine_index = engine_index

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None,
               engine_idx: int = 0) -> None:
        if scheduler_stats is not None:
            self._core_load(scheduler_stats)
        if iteration_stats is not None:
            # The step's time in the engine core: the inter-token latency of each
            # request it decoded, one each step (the least: a request preempted and
            # resumed waited more). None for a step that decoded none.
            latencies = iteration_stats.inter_token_latencies_iter
            self.engine.report_work(iteration_stats.prompt_token_stats.computed,
                                    iteration_stats.num_generation_tokens,
                                    len(iteration_stats.finished_requests),
                                    min(latencies) if latencies else None)

    def _core_load(self, stats) -> None:
        """On the engine loop, after each step of its engine core: the engine's load,
        summed over its cores (data parallel), to its load listener."""
        loads = self.engine._core_loads
        loads[self.engine_index] = EngineLoad(
            running=stats.num_running_reqs,
            waiting=stats.num_waiting_reqs + stats.num_skipped_waiting_reqs,
            kv_cache_usage=stats.kv_cache_usage)
        now = list(loads.values())
        self.engine.report_load(now[0] if len(now) == 1 else
                                EngineLoad(running=sum(load.running for load in now),
                                           waiting=sum(load.waiting for load in now),
                                           kv_cache_usage=max(load.kv_cache_usage
                                                              for load in now)))

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
        self._serving: set[str] = set()  # the request_ids of generate() calls under way

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

    @property
    def reports_work(self) -> bool:
        """As it reports its load: after every step."""
        return self.max_running is not None

    def progress(self) -> dict[str, tuple[int, int | None]]:
        return requests_progress(self._llm, self._serving)

    def engine_args(self) -> AsyncEngineArgs:
        """The arguments start() gives vLLM (inference/engines/vllm_start.py)."""
        return engine_args(self.config)

    async def start(self) -> None:
        if self._llm is not None:
            return
        # The engine core runs in a child process. Forking a process that already
        # runs threads (a Celery threads pool, this loop's thread) is unsafe, so
        # spawn it; vLLM's CPU platform forces spawn anyway.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        # vLLM logs to sys.stdout, which the Celery worker has redirected to its
        # `celery.redirected` logger at WARNING: each of vLLM's lines, its stats line
        # every 10 s among them, would be counted as a warning of ours. The process's
        # own standard output keeps them at the levels vLLM gives them.
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.__stdout__")

        # Blocks this loop until the engine core is up; nothing else runs on the engine
        # loop before start() returns. The scheduler's figures after every step, for
        # admission (the worker keeps the engine's queue fed from them); vLLM's own
        # loggers stay.
        llm, engine_args = start_llm(
            self.config, stat_loggers=[lambda _config, index: _LoadReporter(self, index)])
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
            self._stats_task = asyncio.get_running_loop().create_task(log_stats(llm))
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
            self._chat, self._completion, self._responses = generative_serving(
                llm, models, config)
        return models

    async def generate(self, request: EngineRequest) -> EngineResult:
        if self._llm is None:
            raise RuntimeError("VllmEngine.start() has not run")
        cap_token = _context_cap.set(request.max_context_length)
        self._serving.add(request.request_id)
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
            self._serving.discard(request.request_id)

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


def requests_progress(llm: AsyncLLM | None, serving: set[str]
                      ) -> dict[str, tuple[int, int | None]]:
    """Engine.progress from vLLM's output processor, which keeps each request's
    tokens generated and its max_tokens in this process (`serving`: the request_ids
    of the generate() calls under way): a request's several samples (n) share its id,
    and the one with most left speaks for it."""
    if llm is None or not llm.log_stats:  # the token counts are its stats
        return {}
    # One C-level copy under the GIL: the engine loop adds and drops requests
    # meanwhile, which would break an iteration over the dict itself.
    states = tuple(llm.output_processor.request_states.values())
    found: dict[str, tuple[int, int | None]] = {}
    for state in states:
        ours = _our_request_id(state.external_req_id, serving)
        if ours is None or state.stats is None:
            continue
        now = (state.stats.num_generation_tokens, state.max_tokens_param)
        if ours not in found or _tokens_left(now) > _tokens_left(found[ours]):
            found[ours] = now
    return found


def _our_request_id(external: str, serving: set[str]) -> str | None:
    """The request_id generate() was given, from the id vLLM's serving classes gave
    the engine for it: chat's "chatcmpl-<id>", completion's "cmpl-<id>-<prompt>",
    responses' "resp_<id>" (generate's ids are "resp_<id>" there) with "_<turn>";
    None for one that is not ours (serving: the ids under way)."""
    for name in (external, external.partition("-")[2], external.partition("_")[2]):
        for candidate in (name, name.rpartition("-")[0], name.rpartition("_")[0]):
            if candidate in serving:
                return candidate
    return None


def _tokens_left(progress: tuple[int, int | None]) -> float:
    generated, limit = progress
    return math.inf if limit is None else limit - generated


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
