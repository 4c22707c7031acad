"""The simulated engine: deterministic text, real-looking usage, a latency per request
(BATCHGEN_SIM_LATENCY_MS) plus one per token (BATCHGEN_SIM_TOKEN_LATENCY_MS: each
output token, and each prompt token at PROMPT_TOKEN_FRACTION of it), all asyncio
sleeps: requests in flight cost no CPU, so a 2-core machine can play a fleet.

An answer is 8 words unless BATCHGEN_ENGINE_ARGS names a range, '{"answer_tokens":
[20, 400]}': then each prompt's answer has its own length in that range (from the
prompt's digest, so the same every time), cut at the request's max_tokens, as a
model's answers are of varied lengths.

For load, fault, overhead and ETA tests only; never the default. Its output says so."""

from __future__ import annotations

import asyncio
import hashlib
import time

from serving.endpoints import endpoint_spec
from serving.endpoints.base import choice_count
from serving.engines.base import Engine, EngineConfigError, EngineRequest, EngineResult
from serving.engines.registry import SIMULATED_CONTEXT

# A prompt token's share of an output token's time: prefill runs a prompt's tokens
# together, decoding one token after another.
PROMPT_TOKEN_FRACTION = 0.05


class SimulatedEngine(Engine):
    name = "simulated"

    @property
    def max_context_length(self) -> int:
        return self.config.max_context_length or SIMULATED_CONTEXT

    async def start(self) -> None:
        # Fault tests make its start fail as a real engine's can (BATCHGEN_ENGINE_ARGS
        # '{"fail_start": "config"}' or '"transient"'): for good, or this time only.
        failure = self.config.engine_args.get("fail_start")
        if isinstance(failure, dict):  # {"model": "config"}: that model's start only
            failure = failure.get(self.config.served_model_name)
        if failure == "config":
            raise EngineConfigError("the simulated engine was told to refuse its settings",
                                    setting="BATCHGEN_ENGINE_ARGS (fail_start)")
        if failure == "transient":
            raise RuntimeError("the simulated engine was told to fail its start")
        # A model load's cost, for the multiplexing tests and benchmark
        # (BATCHGEN_ENGINE_ARGS '{"start_seconds": 3}'): a swap waits for it.
        await asyncio.sleep(float(self.config.engine_args.get("start_seconds", 0)))

    async def shutdown(self) -> None:
        await asyncio.sleep(float(self.config.engine_args.get("stop_seconds", 0)))

    # As vLLM's sleep mode on a GPU, for the tests ('{"wake_seconds": 0.5}').
    @property
    def can_sleep(self) -> bool:
        return self.config.sleep_mode and "wake_seconds" in self.config.engine_args

    async def sleep(self) -> None:
        self.asleep = True

    async def wake_up(self) -> None:
        await asyncio.sleep(float(self.config.engine_args["wake_seconds"]))
        self.asleep = False

    async def generate(self, request: EngineRequest) -> EngineResult:
        if self.config.sim_latency_ms:
            await asyncio.sleep(self.config.sim_latency_ms / 1000)
        model = request.body.get("model")
        adapters = {adapter.name for adapter in self.config.adapters}
        if model != self.config.served_model_name and model not in adapters:
            # As vLLM's OpenAIServingModels does: a worker answers only its own model
            # and that model's adapters.
            return EngineResult.failure(
                "model_not_found", f"The model {model!r} is not the one this worker holds "
                f"({self.config.served_model_name!r}) nor one of its adapters.")
        spec = endpoint_spec(request.endpoint)
        prompt = spec.prompt_text(request.body)
        prompt_tokens = max(1, len(prompt.split()))
        context = min(self.max_context_length, request.max_context_length or 10**9)
        if prompt_tokens >= context:
            return EngineResult.failure(
                "context_length_exceeded",
                f"Prompt length {prompt_tokens} exceeds model context {context}")
        limit = (request.body.get(spec.output_limit_field)
                 or request.body.get("max_completion_tokens") or request.body.get("max_tokens")
                 or context - prompt_tokens)
        # An adapter answers other text than its base model, as a real one would.
        salt = f"{model}\n" if model in adapters else ""
        digest = hashlib.sha256(f"{salt}{prompt}".encode()).hexdigest()
        words = self.answer_words(digest)
        completion_tokens = min(len(words), limit)
        text = " ".join(words[:completion_tokens])
        finish_reason = "length" if completion_tokens < len(words) else "stop"
        # With n choices, usage sums them (as vLLM's does).
        all_completions = completion_tokens * choice_count(request.body)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": all_completions,
                 "total_tokens": prompt_tokens + all_completions}
        body = spec.simulated_body(request_id=request.request_id,
                                   model=model,
                                   created=int(time.time()), text=text,
                                   finish_reason=finish_reason, usage=usage,
                                   request_body=request.body)
        # An embedding has no completion: its spec's usage says so.
        _, completion_tokens = spec.token_counts(body["usage"])
        if self.config.sim_token_latency_ms:
            await asyncio.sleep(self.config.sim_token_latency_ms / 1000 * (
                completion_tokens + PROMPT_TOKEN_FRACTION * prompt_tokens))
        return EngineResult(body=body, prompt_tokens=prompt_tokens,
                            completion_tokens=completion_tokens)

    def answer_words(self, digest: str) -> list[str]:
        """The answer's words before max_tokens cuts them: 8, or as many as the
        digest picks in the engine_args' answer_tokens range."""
        words = [f"sim{digest[i:i + 4]}" for i in range(0, 32, 4)]
        bounds = self.config.engine_args.get("answer_tokens")
        if not bounds:
            return words
        low, high = int(bounds[0]), int(bounds[1])
        length = low + int(digest[32:40], 16) % (high - low + 1)
        return [words[i % len(words)] for i in range(length)]
