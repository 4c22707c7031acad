"""The simulated engine: deterministic text, real-looking usage, a fixed latency.

For load, fault and overhead tests only; never the default. Its output says so."""

from __future__ import annotations

import asyncio
import hashlib
import time

from inference.engines.base import Engine, EngineRequest, EngineResult

CHAT = "/v1/chat/completions"
SIM_CONTEXT = 8192


def _prompt_text(request: EngineRequest) -> str:
    if request.endpoint == CHAT:
        parts = []
        for message in request.body.get("messages", []):
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(f"{message.get('role')}: {content or ''}")
        return "\n".join(parts)
    prompt = request.body.get("prompt")
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


class SimulatedEngine(Engine):
    name = "simulated"

    @property
    def max_context_length(self) -> int:
        return self.config.max_context_length or SIM_CONTEXT

    async def start(self) -> None:
        return None

    async def generate(self, request: EngineRequest) -> EngineResult:
        if self.config.sim_latency_ms:
            await asyncio.sleep(self.config.sim_latency_ms / 1000)
        prompt = _prompt_text(request)
        prompt_tokens = max(1, len(prompt.split()))
        context = min(self.max_context_length, request.max_context_length or 10**9)
        if prompt_tokens >= context:
            return EngineResult.failure(
                "context_length_exceeded",
                f"Prompt length {prompt_tokens} exceeds model context {context}")
        limit = (request.body.get("max_completion_tokens") or request.body.get("max_tokens")
                 or context - prompt_tokens)
        digest = hashlib.sha256(prompt.encode()).hexdigest()
        words = [f"sim{digest[i:i + 4]}" for i in range(0, 32, 4)]
        completion_tokens = min(len(words), limit)
        text = " ".join(words[:completion_tokens])
        finish_reason = "length" if completion_tokens < len(words) else "stop"
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        created = int(time.time())
        if request.endpoint == CHAT:
            body = {
                "id": f"chatcmpl-{request.request_id}", "object": "chat.completion",
                "created": created, "model": self.config.served_model_name,
                "choices": [{"index": 0, "message": {
                    "role": "assistant", "content": text, "reasoning_content": None,
                    "tool_calls": []}, "logprobs": None, "finish_reason": finish_reason}],
                "usage": usage,
            }
        else:
            body = {
                "id": f"cmpl-{request.request_id}", "object": "text_completion",
                "created": created, "model": self.config.served_model_name,
                "choices": [{"index": 0, "text": text, "logprobs": None,
                             "finish_reason": finish_reason}],
                "usage": usage,
            }
        return EngineResult(body=body, prompt_tokens=prompt_tokens,
                            completion_tokens=completion_tokens)
