"""Parameter priority, in one place.

Sampling: the request body's value > the batch-level value > the server default
(greedy: temperature 0; top_p and top_k off).
Output tokens: the body's max_completion_tokens or max_tokens (or the endpoint's own
name for it, such as max_output_tokens) > the batch's max_decoding_length > what
remains of the context (left to the engine, which knows the prompt's length).

Bounds: SAMPLING_BOUNDS is the one table of what each numeric parameter may be. The
line checks (batches/validation.py), the msgspec fast path (serving/line_schema.py)
and the batch-level fields at create (batches/serializers.py) are all built from it,
so a line and a batch are held to the same ranges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SAMPLING_KEYS = ("temperature", "top_p", "top_k")
GREEDY_TEMPERATURE = 0.0
INT64_MAX = 2**63 - 1
MAX_CHOICES = 128
# A body's output token limit under chat's and completions' names; an endpoint may
# name it otherwise (its spec's output_limit_field, such as max_output_tokens).
OUTPUT_LIMIT_FIELDS = ("max_completion_tokens", "max_tokens")


@dataclass(frozen=True, slots=True)
class Bound:
    """What a numeric parameter may be: an integer or any number, from `low` to
    `high`; with `low_open`, `low` itself is refused."""

    integer: bool
    low: int
    high: int = INT64_MAX
    low_open: bool = False

    def admits(self, value: Any) -> bool:
        kind = int if self.integer else (int, float)
        if not isinstance(value, kind) or isinstance(value, bool):
            return False
        # NaN fails both comparisons; JSON has no infinity.
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    @property
    def must(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.high == INT64_MAX:
            return f"must be {kind} >= {self.low}"
        if self.low_open:
            return f"must be {kind} in ({self.low}, {self.high}]"
        return f"must be {kind} from {self.low} to {self.high}"


_COUNT = Bound(integer=True, low=1)
# OpenAI's ranges (API reference, "Create chat completion"), except where the engine
# is narrower: vLLM refuses top_p 0, which OpenAI takes. top_k is vLLM's (-1 = off).
# Integers stop at 64 bits: the JSON parsers read larger ones as floats.
SAMPLING_BOUNDS: dict[str, Bound] = {
    "max_tokens": _COUNT,
    "max_completion_tokens": _COUNT,
    "max_decoding_length": _COUNT,
    "max_context_length": _COUNT,
    "temperature": Bound(integer=False, low=0, high=2),
    "top_p": Bound(integer=False, low=0, high=1, low_open=True),
    "top_k": Bound(integer=True, low=-1),
    "presence_penalty": Bound(integer=False, low=-2, high=2),
    "frequency_penalty": Bound(integer=False, low=-2, high=2),
    "top_logprobs": Bound(integer=True, low=0, high=20),
    "seed": Bound(integer=True, low=-INT64_MAX - 1),
    # Choices per request: OpenAI's ceiling. vLLM samples them from one prompt.
    "n": Bound(integer=True, low=1, high=MAX_CHOICES),
}


@dataclass(frozen=True, slots=True)
class BatchParams:
    max_decoding_length: int | None = None
    max_context_length: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


def resolve_body(body: dict[str, Any], batch: BatchParams, *,
                 output_limit_field: str) -> dict[str, Any]:
    """The body the engine runs: a copy of `body` with the batch's defaults and the
    server's defaults filled in where the body says nothing. The output token limit
    goes in `output_limit_field`, the endpoint's name for it (its spec's)."""
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

    limit = output_token_limit(resolved, batch, output_limit_field)
    for key in {output_limit_field, *OUTPUT_LIMIT_FIELDS}:
        resolved.pop(key, None)
    if limit is not None:
        resolved[output_limit_field] = limit
    return resolved


def output_token_limit(body: dict[str, Any], batch: BatchParams,
                       output_limit_field: str = "max_completion_tokens") -> int | None:
    """None means: what remains of the context after the prompt."""
    for key in dict.fromkeys((output_limit_field, *OUTPUT_LIMIT_FIELDS)):
        if body.get(key) is not None:
            return body[key]
    return batch.max_decoding_length
