"""The ETA model: when will each batch finish, given the work ahead of it and beside
it under the dispatcher's fair share, and each model's measured throughput.

Pure, no database. Two plays of the scheduler (batches/dispatch.py):

- `chunk_finish_times`, the server's ETA: the dispatcher and the workers played
  forward from where every open chunk is (held by a worker, in the broker's
  window, pending), each worker's engine played request by request (`_Engine`):
  its chunks' requests admitted in the order it claimed them as its slots free,
  each computing its prompt, then a token a step, at one worker's rate
  (batches/estimates.py measures it). It sees what a split of the rate cannot: a
  chunk keeps its worker, a small batch's chunk waits for the window and the
  chunks ahead of it, on a worker with many slots a chunk of short answers ends
  before the long ones beside it, and the requests in an engine now have only
  their steps left, their prompts computed but for those it tells have no token yet.
- `finish_times` and `fair_finish_times`, the fluid view the deadline policy plans
  with (batches/deadlines.py) and benchmarks/eta_model.py checks it by: stride
  scheduling over many chunks is a fluid split of the model's throughput in
  proportion to the shares (`fair_shares`: keys by weight, a key's batches by
  priority; generalised processor sharing), played event by event: at each step
  every batch with work left runs at `rate * share / sum(shares)`; the one that runs
  out first finishes, the shares of the rest are computed again (a key's other
  batches inherit its share, as dispatch would give it), and so on. The two agree
  over many chunks (tests/batches/test_deadlines.py).

Work is counted in cost units, not requests: a request costs one unit plus its
output tokens (a batch's own mean once some of it has finished, the model's mean
before), and a model's rate is measured in the same units (batches/estimates.py),
so a batch of long answers is not taken for one of short answers.

The share function is a parameter of both plays, so they give the ETA under the
deadline policy (batches/deadlines.py) when dispatch applies it.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class Load:
    """A batch's work left on one model."""

    batch_id: str
    remaining: float  # cost units still to run
    priority: int = 1
    owner: int | None = None  # the API key (None: an open server)
    weight: int | None = None  # the key's weight
    time_left: float | None = None  # seconds to its window's end (None: no window)
    # Cost units of one of its chunks (None: no cap). A chunk runs on one worker, so
    # a batch with k chunks left runs on k workers at most: its tail is one chunk on
    # one worker, whatever its share.
    chunk: float | None = None
    # Cost units of one of its requests. Dispatch shares requests (a chunk's count
    # moves its pass), so a batch's part of the model's cost units is its share
    # times its cost per request: long answers take more of the workers' time.
    cost: float = 1.0
    # The steps one of its requests stays in an engine's slots for: one plus its
    # output tokens, for an engine that gives every request in it a token a step (vLLM;
    # the simulated engine's requests each at their own pace). None: as many as its
    # cost units (processor sharing, each request taking as much of the engine as it
    # costs).
    steps: float | None = None
    # When it was created (Unix seconds): dispatch gives level passes to the older
    # batch. 0 where unknown (the runs recorded before it): then by id, as they ran.
    created: float = 0.0


ShareFunction = Callable[[Sequence[Load]], dict[str, float]]


# An estimate that moved less than this many seconds, or less than this fraction of
# the time it still has to go, is not written again: a day-long batch's row is not
# rewritten every 5 s for noise.
MOVED_SECONDS = 1.0
MOVED_FRACTION = 0.01


def moved(change: float, left: float) -> bool:
    """Whether an estimate `left` seconds away that moved by `change` seconds is
    written again (the refresh, batches/estimates.py; its replay,
    benchmarks/eta_replay.py)."""
    return abs(change) >= max(MOVED_SECONDS, left * MOVED_FRACTION)


def fair_shares(loads: Sequence[Load]) -> dict[str, float]:
    """The dispatcher's shares (batches.dispatch.batch_shares): keys in proportion to
    their weights, a key's share split among its batches by priority."""
    per_key: dict[int | None, int] = {}
    for load in loads:
        per_key[load.owner] = per_key.get(load.owner, 0) + max(load.priority, 1)
    return {load.batch_id: (load.weight or 1) * max(load.priority, 1) / per_key[load.owner]
            for load in loads}


def chunks_left(load: Load) -> int:
    return max(1, math.ceil(load.remaining / load.chunk - 1e-9)) if load.chunk else 0


def speeds(active: Sequence[Load], split: dict[str, float], rate: float,
           worker_rate: float | None) -> dict[str, float]:
    """Each batch's speed: the rate split by shares, a batch capped at its chunks
    left times one worker's rate, what a capped batch cannot use going to the
    others by their shares (water-filling)."""
    speed: dict[str, float] = {}
    free, room = rate, list(active)
    while room:
        total = sum(split[load.batch_id] for load in room)
        capped = [load for load in room if worker_rate and load.chunk and
                  chunks_left(load) * worker_rate < free * split[load.batch_id] / total]
        if not capped:
            speed.update((load.batch_id, free * split[load.batch_id] / total) for load in room)
            return speed
        for load in capped:
            speed[load.batch_id] = chunks_left(load) * worker_rate
            free -= speed[load.batch_id]
        room = [load for load in room if load.batch_id not in speed]
    return speed


def finish_times(loads: Sequence[Load], rate: float, shares: ShareFunction = fair_shares,
                 worker_rate: float | None = None,
                 arrivals: Sequence[tuple[float, Load]] = ()) -> dict[str, float]:
    """Seconds from now until each batch's work on this model is done, playing the
    fluid split forward. `rate` is the model's throughput in cost units a second
    (over all its workers), `worker_rate` one worker's (None: no chunk caps); a
    batch with no work left finishes at 0. `arrivals` are batches that come on the
    way, (seconds from now, load), played from then and timed too (the server plays
    none: benchmarks/eta_model.py --forecast tries them). O(n^2) in the batches of
    one model times their chunks, a few hundred batches at most on a server."""
    done = {load.batch_id: 0.0 for load in loads if load.remaining <= 0}
    active = [load for load in loads if load.remaining > 0]
    coming = deque(sorted(arrivals, key=lambda arrival: arrival[0]))
    if rate <= 0:
        raise ValueError("finish_times needs a positive rate")
    now, split, members = 0.0, {}, None
    while active or coming:
        if not active or coming and coming[0][0] <= now:  # a batch comes: shares move
            now = max(now, coming[0][0])
            active.append(coming.popleft()[1])
            members = None
            continue
        if members != len(active):  # the shares move when a batch finishes
            split, members = shares(active), len(active)
        speed = speeds(active, {load.batch_id: split[load.batch_id] * load.cost
                                for load in active}, rate, worker_rate)
        step = min(load.remaining / speed[load.batch_id] for load in active)
        if worker_rate:
            # Until a batch's chunks left next drop where its cap can bind (fewer
            # than the workers): the caps move then, and only then.
            workers = max(1, math.floor(rate / worker_rate + 1e-9))
            step = min([step] + [(load.remaining - min(chunks_left(load) - 1, workers)
                                  * load.chunk) / speed[load.batch_id] for load in active
                                 if load.chunk and chunks_left(load) > 1])
        if coming:
            step = min(step, coming[0][0] - now)
        now += step
        left = []
        for load in active:
            remaining = load.remaining - speed[load.batch_id] * step
            if remaining <= load.remaining * 1e-9 + 1e-9:
                done[load.batch_id] = now
            else:
                time_left = None if load.time_left is None else load.time_left - step
                left.append(replace(load, remaining=remaining, time_left=time_left))
        active = left
    return done


def fair_finish_times(loads: Sequence[Load], rate: float) -> dict[str, float]:
    """finish_times under fair share without chunk caps, in O(n log n): exact when
    every batch is of its own key or all of one (shares then stay in proportion as
    batches finish, so they finish in the order of remaining / share); with several
    batches on several keys it keeps the shares of the start (a key's batch does not
    inherit its sibling's share), a slight pessimism for the policy's quick check."""
    split = {batch_id: share * load.cost for (batch_id, share), load
             in zip(fair_shares(loads).items(), loads, strict=True)}
    order = sorted((load for load in loads if load.remaining > 0),
                   key=lambda load: load.remaining / split[load.batch_id])
    total = sum(split[load.batch_id] for load in order)
    result = {load.batch_id: 0.0 for load in loads if load.remaining <= 0}
    now = virtual = 0.0
    for load in order:
        share = split[load.batch_id]
        now += (load.remaining / share - virtual) * total / rate
        virtual = load.remaining / share
        result[load.batch_id] = now
        total -= share
    return result


def request_cost(done: int, output_tokens: int, fallback: float = 1.0, prompt_tokens: int = 0,
                 prompt_weight: float = 0.0, answer: float | None = None) -> float:
    """What one request of a batch costs, in cost units: one plus its output tokens
    plus its computed prompt tokens at `prompt_weight` (an output token's worth each:
    the model's, learned, PromptFit), the batch's own mean once some of it finished
    (its output tokens `answer` where that is known better: left_output), else
    `fallback` (its model's)."""
    if done <= 0:
        return fallback
    output = output_tokens / done if answer is None else answer
    return 1.0 + output + prompt_weight * prompt_tokens / done


def request_steps(done: int, output_tokens: int, prior: float | None = None,
                  answer: float | None = None, limit: float | None = None,
                  cost: float = math.inf) -> float | None:
    """The steps one request of a batch stays in an engine's slots for (Load.steps):
    one plus the output tokens request_cost counts for it (its answers so far, or
    `answer`, left_output's); before any finished, one plus the answer prior
    (`prior`); before the model has a history to give one, one plus the batch's
    mean output limit (`limit`, the most a request can answer); None without any.
    Unknown steps are played as sharing by cost with no prompt to compute
    (_ChunkPlay), so the requests of the batch behind a model's first one filled
    its freed slots without stalling its last steps, and it read 33-73 % early
    (docs/benchmarks.md, "A model's first batch"). No more than the request's `cost`
    units (Load.cost): a step of a request is a unit of its cost."""
    if done <= 0:
        if prior is not None:
            return min(1.0 + prior, cost)
        return min(1.0 + limit, cost) if limit else None
    return min(1.0 + (output_tokens / done if answer is None else answer), cost)


def left_output(done: int, left: int, tokens: int, limit_done: int,
                limit_mean: float | None) -> float | None:
    """The output tokens each of a running batch's `left` requests is expected to
    answer, from its lines' output limits (max_tokens): its answers so far per token
    of their limits (`tokens` over `limit_done`, the `done` requests'), times the
    limits of the requests left (`limit_mean` a line, less the done ones'), per
    request left. The mean of the answers so far reads low where the short answers
    end first: an engine with many slots runs a batch's requests side by side, and
    those of a small limit end first (in a batch of limits 8 to 24 answered to
    them, the tenth done first answered about 9 tokens a request against its 16).
    Where the done requests had the mean limit it is that mean. None without the
    limits."""
    if not limit_mean or limit_done <= 0 or done <= 0 or left <= 0:
        return None
    limits_left = max(limit_mean * (done + left) - limit_done, 0.0)
    return tokens / limit_done * limits_left / left


def answer_prior(history: Sequence[tuple[float, float, int]], limit: float | None) -> float | None:
    """The output tokens a request is expected to answer, before any of its batch
    finished, from the model's finished batches as (mean output limit of their
    lines, output tokens per request, requests): their ratio of answer to limit,
    weighted by requests, over the batches whose limit is within a factor of two of
    `limit` (else over all), times `limit`. None without a limit or a history: a
    batch of max_tokens 16 is not taken for one of 512 before it runs."""
    if not limit or not history:
        return None
    near = [row for row in history if 0.5 <= row[0] / limit <= 2.0] or list(history)
    requests = sum(row[2] for row in near)
    if requests <= 0:
        return None
    return sum(output / cap * count for cap, output, count, *_ in near if cap > 0) \
        / requests * limit


def prompt_prior(history: Sequence[tuple[float, float, int, float]]) -> float:
    """The computed prompt tokens a request is expected to take, before any of its
    batch finished: the model's finished batches' (answer_prior's history, with their
    prompt tokens per request fourth) mean, weighted by requests; 0 without any."""
    requests = sum(row[2] for row in history)
    return sum(row[2] * row[3] for row in history) / requests if requests > 0 else 0.0


# A prompt token's worth, in output tokens, per model (PromptFit): over the progress
# intervals of the last PROMPT_HALF_LIFE seconds or so, once the mix of prompt and
# output in them has varied enough to tell the two apart (PROMPT_SPREAD_MIN) and the
# fit's standard error is at most PROMPT_WEIGHT_ERROR, and at most PROMPT_WEIGHT_MAX
# (prefill computes a prompt's tokens together; an output token is a decode step of
# its own).
PROMPT_HALF_LIFE = 600.0
PROMPT_SPREAD_MIN = 0.05
PROMPT_WEIGHT_ERROR = 0.1
PROMPT_WEIGHT_MAX = 1.0


@dataclass
class PromptFit:
    """What a prompt token costs against an output token on one model: the least
    squares fit, through the origin, of each refresh interval's busy
    worker-seconds B over the decode units D the model's workers did (a request
    plus each token generated) and the prompt tokens P they computed (cached ones
    left out), B = u D + v P, as the workers tell them
    (batches/estimates.Progress.work_since); a prompt token is worth v / u output
    tokens. Older intervals weigh less (by half every PROMPT_HALF_LIFE seconds).

    No answer until the intervals tell it: not while they hold D and P in about the
    same proportion (their series' 1 - cos² under PROMPT_SPREAD_MIN: any weight
    explains them as well), nor while v's standard error is over
    PROMPT_WEIGHT_ERROR output tokens' worth (a few noisy intervals)."""

    dd: float = 0.0
    dp: float = 0.0
    pp: float = 0.0
    db: float = 0.0
    pb: float = 0.0
    bb: float = 0.0
    n: float = 0.0  # intervals, as weighed

    def add(self, seconds: float, decode: float, prompt: float, busy: float) -> None:
        keep = 0.5 ** (seconds / PROMPT_HALF_LIFE)
        for name, value in (("dd", decode * decode), ("dp", decode * prompt),
                            ("pp", prompt * prompt), ("db", decode * busy),
                            ("pb", prompt * busy), ("bb", busy * busy), ("n", 1.0)):
            setattr(self, name, getattr(self, name) * keep + value)

    def weight(self) -> float | None:
        det = self.dd * self.pp - self.dp * self.dp
        if self.n <= 2 or self.dd <= 0 or self.pp <= 0 or \
                det < PROMPT_SPREAD_MIN * self.dd * self.pp:
            return None
        u = (self.db * self.pp - self.pb * self.dp) / det
        v = (self.pb * self.dd - self.db * self.dp) / det
        if u <= 0:
            return None
        squares = (self.bb - 2 * u * self.db - 2 * v * self.pb + u * u * self.dd
                   + 2 * u * v * self.dp + v * v * self.pp)
        error = math.sqrt(max(squares, 0.0) / (self.n - 2) * self.dd / det) / u
        if error > PROMPT_WEIGHT_ERROR:
            return None
        return min(max(v / u, 0.0), PROMPT_WEIGHT_MAX)


def span_rate(spans: Sequence[tuple[float, float, float, float, float]],
              prompt_weight: float = 0.0) -> float | None:
    """One worker's cost units a second over a model's progress intervals, as
    (start, end, decode units, prompt tokens computed, worker-seconds busy), a prompt
    token at `prompt_weight` (estimates.Progress.rate; the replay's oracle,
    benchmarks/eta_replay.py). None without work or busy time."""
    work = sum(decode + prompt_weight * prompt for _, _, decode, prompt, _ in spans)
    busy = sum(span[4] for span in spans)
    return work / busy if work > 0 and busy > 0 else None


def busy_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """The length of the union of [start, end) intervals: the time a model's
    workers were running at least one of the chunks measured, idle gaps left out."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def measured_rate(chunks: Sequence[tuple[float, float, float]]) -> float | None:
    """Cost units a second from chunks as (claimed, finished or now, work done): the
    work done since the earliest of them finished, over the time since then that at
    least one ran. Starting there rather than at the earliest claim counts every
    chunk that ran in the window (the older ones had finished before it), so work
    in flight is neither lost nor counted twice; a chunk's work is taken as spread
    evenly over its run. While that window is empty (the chunks measured all ended
    together), all of their work over all of their busy time; None without any."""
    whole = busy_seconds([(start, end) for start, end, _ in chunks])
    total = sum(done for _, _, done in chunks)
    fallback = total / whole if whole > 0 and total > 0 else None
    since = min((end for _, end, _ in chunks), default=0.0)
    work, spans = 0.0, []
    for start, end, done in chunks:
        if end <= since or end <= start:
            continue
        begin = max(start, since)
        work += done * (end - begin) / (end - start)
        spans.append((begin, end))
    busy = busy_seconds(spans)
    return work / busy if busy > 0 and work > 0 else fallback


def service_rate(chunks: Sequence[tuple[str, float, float, float]]) -> float | None:
    """One worker's rate, in cost units a second, from finished chunks as (worker,
    claimed, finished, work). A worker serves the chunks it holds one after another,
    in the order it claimed them (inference/slots.py admits a younger chunk's
    requests only once every older one's are in), so a chunk's service runs from the
    later of its claim and the close before it on the same worker to its own close:
    the time it waited behind the others is not its own, and an idle gap (a claim
    after that close) is nobody's. A worker's earliest chunk here is only the start
    of the next one's service (the close before it is not in the list), unless it is
    the worker's only one: then from its claim. None without any."""
    by_worker: dict[str, list[tuple[float, float, float]]] = {}
    for worker, claimed, finished, work in chunks:
        by_worker.setdefault(worker, []).append((finished, claimed, work))
    work = seconds = 0.0
    for rows in by_worker.values():
        rows.sort()
        if len(rows) == 1:
            finished, claimed, done = rows[0]
            work, seconds = work + done, seconds + finished - claimed
            continue
        for (before, _, _), (finished, claimed, done) in zip(rows, rows[1:], strict=False):
            work, seconds = work + done, seconds + finished - max(claimed, before)
    return work / seconds if seconds > 0 and work > 0 else None


@dataclass(frozen=True, slots=True)
class Held:
    """One live worker of a model: its chunk threads, the chunks it holds in the
    order it claimed them, as (batch, cost units left), and its slots: the requests
    it runs at once. One slot serves the chunks one after another; with more, the
    engine runs requests of several chunks side by side, admitted in claim order
    (inference/slots.py)."""

    threads: int
    chunks: tuple[tuple[str, float], ...] = ()
    slots: int = 1
    # The steps the longest of a chunk's requests has left, by the chunk's place in
    # `chunks`, where all the requests it has left are in the engine (from an engine
    # that tells each request's tokens: Engine.progress). They end evenly up to
    # those steps, a whole request's at most (_Engine.start).
    left_steps: dict[int, float] = field(default_factory=dict)
    # The requests of each chunk in the engine that have generated a token, by the
    # chunk's place in `chunks` (none where a place is missing), from an engine that
    # tells each request's tokens; None from one that does not. A request in its
    # slots without a token has its prompt still to compute: admitted since the
    # engine last told, on its way into the engine, or waiting there for prefill.
    # Each such request's prompt is played before the steps (_Engine.start).
    started: dict[int, float] | None = None


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Where a model's open chunks are, as the dispatcher (batches/dispatch.py) sees
    them: held by its workers, in the broker's window (first in, first out: (batch,
    cost units left)), or pending in the database, and each batch's stride pass."""

    workers: tuple[Held, ...]
    queued: tuple[tuple[str, float], ...] = ()
    window: int = 1  # chunks the dispatcher keeps in the broker's window
    pending: dict[str, tuple[int, int]] = field(default_factory=dict)  # batch: (chunks, requests)
    passes: dict[str, float] = field(default_factory=dict)


# Where the requests in an engine at the start of a play stand, but for a chunk's
# whose steps left the worker tells (Held.left_steps): spread by their admission, the
# oldest furthest on, between half of their steps left and all of them. In a steady
# engine one is admitted as one ends, so they would be spread from none to all; the
# ones still in it are the longer of those admitted with them, so further from their
# end than that. Read on twenty recorded real-engine runs (docs/benchmarks.md, "The
# engine played request by request"): 0.047 at 50 % with half, 0.049 with none.
IN_ENGINE_SPREAD = 0.5
# A chunk's requests all in the engine end spread evenly up to the steps its longest
# has left (Held.left_steps), in this many groups at most (one a request).
TAIL_GROUPS = 4
# Once an engine has admitted this many times its slots in the play, a chunk's
# requests admitted within this part of their steps of its last group join it, at
# their mean end: where requests of several lengths share few slots, each end admits
# a few and the groups split down to single requests (a simulated 50,000-request
# workload on 12 slots: 45 events a chunk, 80 ms a play of 64,000 requests; 19 ms
# so). The recorded real-engine runs' ETAs read the same (docs/benchmarks.md).
EXACT_TURNS = 32
MERGE_STEPS = 0.1


class _Engine:
    """One worker's engine, as vLLM runs it, played request by request: requests
    admitted in the worker's claim order (inference/slots.py) as its slots free,
    each computing its prompt first, then one token a step. A request's cost units
    (Load.cost) are its steps (Load.steps: one plus its output tokens, a decode unit
    each) and its prompt (the rest); at the worker's rate in cost units a second, a
    step of n requests takes n / rate seconds and an admission's prompts their units
    over the rate, before the next step. So a short answer behind long ones ends
    before them, however dear its prompt, and a long answer stays while the short
    ones beside it come and go. Requests found in it at the start have computed
    their prompts, but those its worker tells have no token yet (Held.started):
    only their steps are left (`start`). Where a request's steps are
    its cost units (an engine that tells none) it is processor sharing.

    Requests that are admitted together and alike move together, as one group of a
    count (not a whole number once spread); a chunk closes when its last group ends.
    Past EXACT_TURNS of its slots, a chunk's requests admitted within MERGE_STEPS of
    their steps of its last group join that group at their mean end (`run`), so the
    groups do not split down to single requests far ahead."""

    def __init__(self, slots: int, rate: float) -> None:
        self.slots, self.rate = max(slots, 1), rate
        self.waiting: deque[list] = deque()  # [order, count, cost, steps], claim order
        self.running: list[tuple[float, int, int, float]] = []  # (end step, seq, order, count)
        self.seq = 0
        self.step = 0.0  # steps done since the play began
        self.clock = 0.0  # when `step` was
        self.busy = 0.0  # requests in it
        self.prompts = 0.0  # cost units of prompts to compute before the next step
        self.parts: Counter[int] = Counter()  # groups of each chunk not ended, waiting ones too
        self.last: dict[int, tuple[float, int, float]] = {}  # order: its last group's
        self.gone: set[int] = set()  # groups merged into a later one (by seq)
        self.admitted = 0.0  # requests admitted in the play

    def at(self, now: float) -> None:
        """Play the engine forward to `now`: prompts first, then steps."""
        if now <= self.clock:
            return
        if self.prompts > 0:
            spent = min(now - self.clock, self.prompts / self.rate)
            self.prompts = max(self.prompts - spent * self.rate, 0.0)
            self.clock += spent
        if self.busy > 1e-9:
            self.step += (now - self.clock) * self.rate / self.busy
        self.clock = now

    def run(self, order: int, count: float, left: float, merge: float = 0.0) -> None:
        """`count` requests of chunk `order` in the engine, `left` steps from their end;
        merged into the chunk's last group where that ends within `merge` steps."""
        self.seq += 1
        end = self.step + max(left, 0.0)
        self.busy += count
        last = self.last.get(order)
        if last is not None and last[1] not in self.gone and 0.0 <= end - last[0] <= merge:
            self.gone.add(last[1])
            end = (last[0] * last[2] + end * count) / (last[2] + count)
            count += last[2]
        else:
            self.parts[order] += 1
        self.last[order] = (end, self.seq, count)
        heapq.heappush(self.running, (end, self.seq, order, count))

    def put(self, order: int, count: float, cost: float, steps: float) -> None:
        """A chunk claimed: its requests wait for slots behind those claimed before."""
        self.waiting.append([order, count, cost, steps])
        self.parts[order] += 1

    def admit(self) -> None:
        """The waiting requests into the slots free, first claimed first."""
        while self.waiting and self.busy < self.slots - 1e-9:
            order, count, cost, steps = head = self.waiting[0]
            taken = min(count, self.slots - self.busy)
            head[1] -= taken
            if head[1] <= 1e-9:
                self.waiting.popleft()
                self.parts[order] -= 1
            self.prompts += taken * max(cost - steps, 0.0)
            self.admitted += taken
            far = self.admitted > EXACT_TURNS * self.slots
            self.run(order, taken, steps, MERGE_STEPS * steps if far else 0.0)

    def start(self, requests: Sequence[tuple[int, float, float, float, float | None,
                                             float | None]]) -> None:
        """The requests of the chunks held at the start, as (order, count, cost, steps,
        steps left of the longest where the worker tells them all in the engine,
        requests with a token where it tells them: Held.started) in claim order. The
        first `slots` are in the engine: a told chunk's ending evenly up to its
        longest's steps left (TAIL_GROUPS), the others spread by their admission
        (IN_ENGINE_SPREAD), four requests a group at most; their prompts computed,
        but for those the worker tells have no token yet, whose prompts come before
        the next step. The rest wait."""
        room, found = float(self.slots), []
        for order, count, cost, steps, told, started in requests:
            if count <= 1e-9:  # its requests all ended: it closes now
                self.run(order, 0.0, 0.0)
                continue
            taken = count if told is not None else min(count, max(room, 0.0))
            if started is not None:
                self.prompts += max(taken - started, 0.0) * max(cost - steps, 0.0)
            if told is not None:
                groups = max(1, min(TAIL_GROUPS, round(count)))
                for part in range(groups):
                    self.run(order, count / groups, min(told, steps) * (part + 1) / groups)
                room -= count
                continue
            room -= taken
            if taken > 1e-9:
                found.append((order, taken, steps))
            if count - taken > 1e-9:
                self.put(order, count - taken, cost, steps)
        total, place = sum(count for _, count, _ in found), 0.0
        for order, count, steps in found:
            pieces = max(1, math.ceil(count / 4))
            for _ in range(pieces):
                middle = (place + count / pieces / 2) / total
                self.run(order, count / pieces, steps * (1 - IN_ENGINE_SPREAD * (1 - middle)))
                place += count / pieces

    def next_end(self) -> float:
        """When its next group ends (inf: none runs)."""
        if not self.running:
            return math.inf
        steps = max(self.running[0][0] - self.step, 0.0)
        return self.clock + (self.prompts + steps * self.busy) / self.rate

    def end(self) -> list[int]:
        """The groups ending now leave their slots; the chunks of which none is left."""
        closed = []
        if self.running:  # the clock is there, but for rounding
            self.step = max(self.step, self.running[0][0])
        while self.running and self.running[0][0] <= self.step * (1 + 1e-12) + 1e-9:
            _, seq, order, count = heapq.heappop(self.running)
            if seq in self.gone:
                self.gone.discard(seq)
                continue
            self.busy = max(self.busy - count, 0.0)
            self.parts[order] -= 1
            if self.parts[order] <= 0:
                del self.parts[order]
                closed.append(order)
        if not self.running:
            self.busy = 0.0
        self.admit()
        return closed


class _ChunkPlay:
    """chunk_finish_times' state as it plays forward (one model): the dispatcher's
    window and passes, and each worker's chunk threads and engine (_Engine)."""

    def __init__(self, loads: Sequence[Load], state: Dispatch, worker_rate: float,
                 shares: ShareFunction) -> None:
        self.loads = {load.batch_id: load for load in loads}
        self.state, self.shares = state, shares
        self.holding = [0] * len(state.workers)  # chunks each worker holds
        self.queue = deque(state.queued)
        self.pending = {batch: [chunks, requests] for batch, (chunks, requests)
                        in state.pending.items() if chunks > 0 and batch in self.loads}
        self.engines = [_Engine(held.slots, worker_rate) for held in state.workers]
        self.left = Counter(batch for held in state.workers for batch, _ in held.chunks)
        self.left.update(batch for batch, _ in self.queue)
        self.left.update({batch: chunks for batch, (chunks, _) in self.pending.items()})
        self.remaining = {batch: load.remaining for batch, load in self.loads.items()}
        self.passes = [(state.passes.get(batch, 0.0), self.loads[batch].created, batch)
                       for batch in self.pending]
        heapq.heapify(self.passes)
        self.split: dict[str, float] = {}
        self.members: frozenset[str] = frozenset()
        self.held: dict[int, tuple[int, str, float]] = {}  # order: (worker, batch, cost units)
        self.order = 0
        self.now = 0.0
        # (when its engine's next group ends, worker, version): an entry is stale
        # once its worker's engine changed since (`versions`)
        self.ends: list[tuple[float, int, int]] = []
        self.versions = [0] * len(state.workers)
        for worker, held in enumerate(state.workers):
            found = []
            for place, (batch, work) in enumerate(held.chunks):
                found.append((self.claim(worker, batch, work), work / self.cost(batch),
                              self.cost(batch), self.played_steps(batch),
                              held.left_steps.get(place) if self.steps(batch) else None,
                              None if held.started is None else held.started.get(place, 0.0)))
            self.engines[worker].start(found)
            self.engines[worker].admit()
            self.changed(worker)

    def cost(self, batch: str) -> float:
        return self.loads[batch].cost if batch in self.loads else 1.0

    def steps(self, batch: str) -> float | None:
        return self.loads[batch].steps if batch in self.loads else None

    def played_steps(self, batch: str) -> float:
        """A request's steps in the engine: its batch's, or, where they are unknown,
        its whole cost as steps, with no prompt to compute."""
        return self.steps(batch) or self.cost(batch)

    def claim(self, worker: int, batch: str, work: float) -> int:
        self.order += 1
        self.held[self.order] = (worker, batch, work)
        self.holding[worker] += 1
        return self.order

    def changed(self, worker: int) -> None:
        self.versions[worker] += 1
        heapq.heappush(self.ends, (self.engines[worker].next_end(), worker,
                                   self.versions[worker]))

    def hold(self, worker: int, batch: str, work: float) -> None:
        """`worker` claims a chunk now: its requests wait in its engine behind those
        claimed before."""
        engine, cost = self.engines[worker], self.cost(batch)
        engine.at(self.now)
        engine.put(self.claim(worker, batch, work), work / cost, cost, self.played_steps(batch))
        engine.admit()
        self.changed(worker)

    def refill(self) -> None:
        """The dispatcher: the lowest pass's next chunk (the older batch's where level)
        into the window, while it has room."""
        while len(self.queue) < self.state.window and self.passes:
            if self.members != frozenset(self.pending):
                self.members = frozenset(self.pending)
                self.split = self.shares([replace(
                    self.loads[batch], remaining=self.remaining[batch],
                    time_left=None if self.loads[batch].time_left is None
                    else self.loads[batch].time_left - self.now) for batch in self.members])
            passed, created, batch = heapq.heappop(self.passes)
            chunks, requests = self.pending[batch]
            count = self.next_chunk(batch, chunks, requests)
            self.queue.append((batch, count * self.loads[batch].cost))
            if chunks > 1:
                self.pending[batch] = [chunks - 1, requests - count]
                heapq.heappush(self.passes, (passed + count / self.split[batch], created, batch))
            else:
                del self.pending[batch]

    def next_chunk(self, batch: str, chunks: int, requests: float) -> float:
        """The requests of `batch`'s next pending chunk, of `chunks` holding
        `requests`: a batch's chunks are full (Load.chunk) but its last, as
        validation cut them, so its tail is the short last one."""
        load = self.loads[batch]
        if chunks <= 1:
            return requests
        full = load.chunk / load.cost if load.chunk else 0.0
        return max(min(full, requests - (chunks - 1)), requests / chunks)

    def take(self, worker: int) -> None:
        """A free chunk thread of `worker` takes the window's first chunk (the
        dispatcher refills it)."""
        batch, work = self.queue.popleft()
        self.refill()
        self.hold(worker, batch, work)

    def deal(self) -> None:
        """The free chunk threads take the window's chunks a worker at a time, as
        the broker hands its messages round its consumers."""
        while self.queue:
            free = [worker for worker, held in enumerate(self.holding)
                    if held < self.state.workers[worker].threads]
            if not free:
                return
            for worker in free:
                if self.queue:
                    self.take(worker)

    def close(self) -> list[str] | None:
        """Play to the next end of a group of requests on any worker: the batches of
        the chunks that closed then (their workers take others from the window);
        None once no engine runs anything."""
        while self.ends:
            when, worker, version = heapq.heappop(self.ends)
            if version == self.versions[worker]:
                break
        else:
            return None
        if when == math.inf:
            return None
        self.now = when
        engine = self.engines[worker]
        engine.at(when)
        batches = []
        for order in engine.end():
            _, batch, work = self.held.pop(order)
            self.holding[worker] -= 1
            self.left[batch] -= 1
            if batch in self.remaining:
                self.remaining[batch] = max(self.remaining[batch] - work, 0.0)
            batches.append(batch)
        self.changed(worker)
        if self.queue and self.holding[worker] < self.state.workers[worker].threads:
            self.take(worker)
        self.deal()
        return batches


def chunk_finish_times(loads: Sequence[Load], state: Dispatch, worker_rate: float,
                       shares: ShareFunction = fair_shares) -> dict[str, float]:
    """Seconds from now until each batch's last chunk on this model closes, playing the
    dispatcher and the workers forward: the dispatcher keeps `state.window` chunks in
    the broker's window, the lowest stride pass first (a chunk of n requests moves
    its batch's pass by n / share, the shares from `shares` over the batches still
    pending, as dispatch computes them); a worker with a free chunk thread takes the
    window's first chunk; each worker's engine runs its chunks' requests at
    `worker_rate` cost units a second, admitted in the order it claimed them, as
    many at once as its slots, request by request (`_Engine`: with one slot it
    serves its chunks one after another). Exact for a scheduler and engines that
    behave so, whatever the batches' sizes: a small batch's one chunk waits for the
    window ahead of it and for the chunks ahead of it on its worker, which a fluid
    split of the rate cannot say. O(groups × log), the groups a few per chunk, plus
    a share computation each time a batch runs out of pending chunks."""
    if worker_rate <= 0:
        raise ValueError("chunk_finish_times needs a positive rate")
    play = _ChunkPlay(loads, state, worker_rate, shares)
    finish = {batch: 0.0 for batch in play.loads if play.left[batch] <= 0}
    play.refill()
    play.deal()
    while (closed := play.close()) is not None:
        for batch in closed:
            if play.left[batch] <= 0 and batch in play.loads:
                finish[batch] = play.now
    for batch in play.loads:
        finish.setdefault(batch, math.inf)  # no worker can take its chunks
    return finish
