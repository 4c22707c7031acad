"""Parameter priority, in one place.

Sampling: the request body's value > the batch-level value > the server default
(greedy: temperature 0; top_p and top_k off).
Output tokens: the body's max_completion_tokens or max_tokens > the batch's
max_decoding_length > what remains of the context (left to the engine, which knows
the prompt's length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHAT = "/v1/chat/completions"
SAMPLING_KEYS = ("temperature", "top_p", "top_k")
GREEDY_TEMPERATURE = 0.0


@dataclass(frozen=True, slots=True)
class BatchParams:
    max_decoding_length: int | None = None
    max_context_length: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


def resolve_body(body: dict[str, Any], batch: BatchParams, *, endpoint: str) -> dict[str, Any]:
    """The body the engine runs: a copy of `body` with the batch's defaults and the
    server's defaults filled in where the body says nothing."""
    resolved = dict(body)
    for key in SAMPLING_KEYS:
        if resolved.get(key) is None:
            batch_value = getattr(batch, key)
            if batch_value is not None:
                resolved[key] = batch_value
            else:
                resolved.pop(key, None)
    if "temperature" not in resolved:
        resolved["temperature"] = GREEDY_TEMPERATURE

    limit = output_token_limit(resolved, batch)
    # Chat takes max_completion_tokens (max_tokens is its deprecated alias);
    # completions only know max_tokens.
    resolved.pop("max_completion_tokens", None)
    resolved.pop("max_tokens", None)
    if limit is not None:
        resolved["max_completion_tokens" if endpoint == CHAT else "max_tokens"] = limit
    return resolved


def output_token_limit(body: dict[str, Any], batch: BatchParams) -> int | None:
    """None means: what remains of the context after the prompt."""
    for key in ("max_completion_tokens", "max_tokens"):
        if body.get(key) is not None:
            return body[key]
    return batch.max_decoding_length
