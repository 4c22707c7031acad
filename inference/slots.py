"""The worker's slots: how many requests may be inside its engine at once, and how
many tokens they may hold between them.

Length-aware admission: a request counts against the token budget with its prompt
plus its output limit (estimated), so the engine's running set stays full without
overflowing its KV cache, which would make it preempt and recompute. One request is
always admitted into an empty pool, however large, so nothing waits forever."""

from __future__ import annotations

import threading

from batches.endpoints import endpoint_spec
from batches.endpoints.base import choice_count
from inference.engines.base import EngineRequest

CHARS_PER_TOKEN = 4  # a cheap, slightly generous estimate for English text
# When a request sets no output limit it may use the rest of the context; admission
# counts this much for it rather than the whole context, as most answers are short.
DEFAULT_OUTPUT_ESTIMATE = 256


def estimate_tokens(request: EngineRequest) -> int:
    """Prompt plus output tokens a request may hold in the engine, estimated without
    a tokenizer (admission runs on the worker's chunk threads, per request)."""
    body = request.body
    spec = endpoint_spec(request.endpoint)
    chars = spec.prompt_chars(body)
    if not spec.generates:
        return chars // CHARS_PER_TOKEN + 1
    # Each of the n choices holds its own output; the prompt's blocks are shared.
    output = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_OUTPUT_ESTIMATE
    return chars // CHARS_PER_TOKEN + 1 + output * choice_count(body)


class SlotPool:
    """A counting semaphore over slots and tokens that tells what is in use."""

    def __init__(self, capacity: int, token_budget: int | None = None) -> None:
        if capacity < 1:
            raise ValueError("a worker needs at least one slot")
        self.capacity = capacity
        self.token_budget = token_budget
        self._active = 0
        self._tokens = 0
        self._cond = threading.Condition()

    @property
    def tokens_active(self) -> int:
        return self._tokens

    def _fits(self, tokens: int) -> bool:
        if self._active >= self.capacity:
            return False
        return (self.token_budget is None or self._active == 0
                or self._tokens + tokens <= self.token_budget)

    @property
    def active(self) -> int:
        return self._active

    @property
    def free(self) -> int:
        return self.capacity - self._active

    def try_acquire(self, tokens: int = 0) -> bool:
        with self._cond:
            if not self._fits(tokens):
                return False
            self._active += 1
            self._tokens += tokens
            return True

    def acquire(self, timeout: float | None = None, tokens: int = 0) -> bool:
        with self._cond:
            if not self._cond.wait_for(lambda: self._fits(tokens), timeout):
                return False
            self._active += 1
            self._tokens += tokens
            return True

    def release(self, tokens: int = 0) -> None:
        with self._cond:
            if self._active <= 0:
                raise RuntimeError("slot released more often than acquired")
            self._active -= 1
            self._tokens -= tokens
            self._cond.notify_all()
