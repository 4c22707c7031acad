"""The worker's slots: how many requests may be inside its engine at once, how many
of them may wait in its queue, and in which order chunks get them.

Admission from the engine's own figures (a vLLM engine): after every step vLLM's
scheduler reports how many requests it runs (`engine_load`). The worker keeps at most
`queue_depth` of its requests beyond those, i.e. waiting in the engine's queue, by
default the scheduler's max_num_seqs: vLLM itself decides how many run at once from
what its KV cache holds (a shared prefix once, a cached one not at all), as it does
for `vllm serve` and `run_batch`, and its queue is never empty while the batch has
more, so each step is as full as vLLM would make it. What still waits is held by
BatchGen, in its own order (prefix groups, batch weights), where cancelling it costs
nothing. A token estimate did this before and held the engine below what it could run
(issue 15: four characters a token counted a 1,000-token prompt as 1,600, and the
engine's queue stayed empty).

Length-aware admission, for engines that report nothing (and under an explicit
BATCHGEN_TOKEN_BUDGET): a request counts against the token budget with its prompt
plus its output limit (estimated). A shared prefix (the system prompt requests with
the same prefix key start with) is counted once while any request holding it is
inside the engine, as vLLM's prefix cache stores it once. One request is always
admitted into an empty pool, however large, so nothing waits forever.

Order: chunks admit in the order they joined the queue (`join`), the oldest first;
a younger chunk admits only once every older one has nothing left waiting. With
prefix grouping, consecutive chunks hold consecutive prefix groups, so a prefix's
requests reach the engine together instead of interleaved with every other chunk's.
Whoever frees room (a finished request, an engine step that took more requests in)
wakes the chunk whose turn it is (`wake` of the waiter)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from serving.endpoints import endpoint_spec
from serving.endpoints.base import choice_count
from serving.engines.base import EngineRequest

CHARS_PER_TOKEN = 4  # a cheap, slightly generous estimate for English text
# When a request sets no output limit it may use the rest of the context; admission
# counts this much for it rather than the whole context, as most answers are short.
DEFAULT_OUTPUT_ESTIMATE = 256


@dataclass(frozen=True, slots=True)
class Cost:
    """What a request holds in the engine: `tokens` in all, of which `shared` are
    its prefix (`prefix`, a key), held once by every request with the same key."""

    tokens: int = 0
    prefix: int | None = None
    shared: int = 0


NO_COST = Cost()


def estimate_tokens(request: EngineRequest) -> int:
    """Prompt plus output tokens a request may hold in the engine, estimated without
    a tokenizer (admission runs on the worker's chunk threads, per request)."""
    return estimate_cost(request).tokens


def estimate_cost(request: EngineRequest) -> Cost:
    """The request's tokens (estimate_tokens) and the part of them its prefix key
    shares with other requests."""
    body = request.body
    spec = endpoint_spec(request.endpoint)
    chars = spec.prompt_chars(body)
    if not spec.generates:
        return Cost(chars // CHARS_PER_TOKEN + 1)
    # Each of the n choices holds its own output; the prompt's blocks are shared.
    output = (body.get(spec.output_limit_field) or body.get("max_completion_tokens")
              or body.get("max_tokens") or DEFAULT_OUTPUT_ESTIMATE)
    tokens = chars // CHARS_PER_TOKEN + 1 + output * choice_count(body)
    shared = min(spec.shared_prefix_chars(body), chars) // CHARS_PER_TOKEN
    if not shared:
        return Cost(tokens)
    return Cost(tokens, spec.prefix_key(body), shared)


class SlotPool:
    """A counting semaphore over slots and tokens that tells what is in use, with an
    ordered queue of the chunks waiting to admit."""

    def __init__(self, capacity: int, token_budget: int | None = None) -> None:
        if capacity < 1:
            raise ValueError("a worker needs at least one slot")
        self.capacity = capacity
        self.token_budget = token_budget
        self._active = 0
        self._busy = 0.0  # seconds with a request in hand, up to _since
        self._since: float | None = None  # monotonic: since when one is (None: idle)
        self._tokens = 0
        self._prefixes: dict[int, list[int]] = {}  # key -> [requests holding it, tokens]
        # Admission from the engine's figures (follow_engine): requests it last said
        # it runs, and how many more of ours may wait in its queue (None: not used).
        self.queue_depth: int | None = None
        self._engine_running = 0
        self._queue: deque[object] = deque()  # waiters with requests to admit, oldest first
        self._wakers: dict[object, Callable[[], None]] = {}
        self._cond = threading.Condition()

    @property
    def tokens_active(self) -> int:
        return self._tokens

    @property
    def prefixes_active(self) -> int:
        return len(self._prefixes)

    @property
    def active(self) -> int:
        return self._active

    @property
    def busy_seconds(self) -> float:
        """Seconds this pool held at least one request: its engine's working time,
        against which the ETA's rate and cost fit set the work done (WorkerState's
        figures)."""
        with self._cond:
            since = self._since
            return self._busy + (time.monotonic() - since if since is not None else 0.0)

    @property
    def free(self) -> int:
        return self.capacity - self._active

    @property
    def engine_queued(self) -> int:
        """Requests handed to the engine that it does not run yet (its queue, and
        those on their way), as far as its last report tells."""
        return max(0, self._active - self._engine_running)

    # --- the engine's figures ------------------------------------------------------------

    def follow_engine(self, queue_depth: int) -> None:
        """Admit from the engine's reports (`engine_load`): at most `queue_depth` of
        the requests in hand beyond those it runs."""
        if queue_depth < 1:
            raise ValueError("the engine's queue needs room for at least one request")
        with self._cond:
            self.queue_depth = queue_depth

    def engine_load(self, running: int) -> None:
        """The engine runs `running` requests now (reported after each step). When
        that leaves room in its queue, the chunk whose turn it is is woken."""
        with self._cond:
            if running == self._engine_running:
                return
            self._engine_running = running
            room = self.queue_depth is not None and self.engine_queued < self.queue_depth
            if room:
                self._cond.notify_all()
            wake = self._wakers[self._queue[0]] if room and self._queue else None
        if wake is not None:
            wake()

    # --- tokens ----------------------------------------------------------------------

    def _charge(self, cost: Cost) -> int:
        """Tokens the request adds: its own, plus its prefix if no request holds it."""
        held = self._prefixes.get(cost.prefix) if cost.shared else None
        return cost.tokens if held is None else cost.tokens - min(cost.shared, held[1])

    def _fits(self, cost: Cost) -> bool:
        if self._active >= self.capacity:
            return False
        if self.queue_depth is not None and self.engine_queued >= self.queue_depth:
            return False
        return (self.token_budget is None or self._active == 0
                or self._tokens + self._charge(cost) <= self.token_budget)

    def _take(self, cost: Cost) -> None:
        self._tokens += self._charge(cost)
        if not self._active:
            self._since = time.monotonic()
        self._active += 1
        if cost.shared:
            held = self._prefixes.setdefault(cost.prefix, [0, cost.shared])
            held[0] += 1

    def _give_back(self, cost: Cost) -> None:
        if self._active <= 0:
            raise RuntimeError("slot released more often than acquired")
        self._active -= 1
        if not self._active and self._since is not None:
            self._busy += time.monotonic() - self._since
            self._since = None
        held = self._prefixes.get(cost.prefix) if cost.shared else None
        if held is None:
            self._tokens -= cost.tokens
            return
        self._tokens -= cost.tokens - min(cost.shared, held[1])
        held[0] -= 1
        if not held[0]:  # the last request holding the prefix: the engine may drop it
            self._tokens -= held[1]
            del self._prefixes[cost.prefix]

    # --- one request at a time (no queue) ----------------------------------------------

    def try_acquire(self, tokens: int = 0, cost: Cost | None = None) -> bool:
        cost = cost or Cost(tokens)
        with self._cond:
            if not self._fits(cost):
                return False
            self._take(cost)
            return True

    def acquire(self, timeout: float | None = None, tokens: int = 0,
                cost: Cost | None = None) -> bool:
        cost = cost or Cost(tokens)
        with self._cond:
            if not self._cond.wait_for(lambda: self._fits(cost), timeout):
                return False
            self._take(cost)
            return True

    def release(self, tokens: int = 0, cost: Cost | None = None) -> None:
        with self._cond:
            self._give_back(cost or Cost(tokens))
            self._cond.notify_all()
            wake = self._wakers[self._queue[0]] if self._queue else None
        if wake is not None:
            wake()

    # --- chunks in order ---------------------------------------------------------------

    def join(self, waiter: object, wake: Callable[[], None]) -> None:
        """`waiter` (a chunk) has requests to admit; it queues behind those that
        joined before. `wake` is called (from any thread, without the pool's lock)
        when room is freed and it may be the waiter's turn."""
        with self._cond:
            if waiter not in self._wakers:
                self._wakers[waiter] = wake
                self._queue.append(waiter)

    def leave(self, waiter: object) -> None:
        """`waiter` has nothing more to admit (or stops): the next one's turn."""
        with self._cond:
            if self._wakers.pop(waiter, None) is None:
                return
            was_head = self._queue[0] is waiter
            self._queue.remove(waiter)
            wake = self._wakers[self._queue[0]] if self._queue and was_head else None
        if wake is not None:
            wake()

    def admit(self, waiter: object, costs: Iterable[Cost]) -> int:
        """How many of `costs` (the waiter's next requests, in order) it may send to
        the engine now: none unless it is the oldest waiter; then as many as fit.
        Their slots and tokens are taken; the caller pops that many."""
        with self._cond:
            if not self._queue or self._queue[0] is not waiter:
                return 0
            admitted = 0
            for cost in costs:
                if not self._fits(cost):
                    break
                self._take(cost)
                admitted += 1
            return admitted
