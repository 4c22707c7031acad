"""The ETA model: when will each batch finish, given the work ahead of it and beside
it under the dispatcher's fair share, and each model's measured throughput.

Pure, no database. Two plays of the scheduler (batches/dispatch.py):

- `chunk_finish_times`, the server's ETA: the dispatcher and the workers played
  forward chunk by chunk from where every open chunk is (held by a worker, in the
  broker's window, pending), each worker running its chunks' requests in the order
  it claimed them, as many at once as its slots, at one worker's rate
  (batches/estimates.py measures it). It sees what a split of the rate cannot: a
  chunk keeps its worker, a small batch's chunk waits for the window and the
  chunks ahead of it, and on a worker with many slots a chunk of short answers ends
  before the long ones beside it, as the engine gives each request a token a step.
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

import bisect
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
                  answer: float | None = None) -> float | None:
    """The steps one request of a batch stays in an engine's slots for (Load.steps):
    one plus the output tokens request_cost counts for it (its answers so far, or
    `answer`, left_output's); before any finished, one plus the answer prior
    (`prior`); None without either."""
    if done <= 0:
        return None if prior is None else 1.0 + prior
    return 1.0 + (output_tokens / done if answer is None else answer)


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
    # The cost units its engine did already of the requests it runs now, as the
    # worker says (an engine that tells its steps; none from the others). Counted off
    # only while nothing follows them (_ChunkPlay.counted_off).
    done: float = 0.0
    # The steps the longest of a chunk's requests has left, by the chunk's place in
    # `chunks`, where all the requests it has left are in the engine (from an engine
    # that tells each request's tokens: Engine.progress). Its last request ends
    # after those steps, not a whole request's (_ChunkPlay.settle).
    left_steps: dict[int, float] = field(default_factory=dict)


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


@dataclass(frozen=True, slots=True)
class _Open:
    """What is fixed of a held chunk's close once it is claimed (_Stream.open): when
    its last request is admitted, at position `end`, and the cost units of it and of
    the requests ahead of it in the engine beside it, in `used` of the `limit`
    slot-steps beside its `steps` steps; the requests behind it join as the worker
    claims them (_Stream.close)."""

    admitted: float
    end: float
    steps: float
    work: float
    used: float
    limit: float


class _Stream:
    """One worker's requests in the order its slots admit them (its chunks' claim
    order: inference/slots.py), as positions in a stream done at the worker's rate,
    first in, first out. Each chunk is a segment: its first position, when the
    stream starts on it, its cost a request and its steps a request (Load.steps);
    `ends` and `times` are where and when each segment ends.

    A chunk's last request is admitted once the stream has done all but the
    requests the slots hold with it, and shares the engine with them step by step:
    each step gives every request in it one step, each doing its cost over its
    steps. So it stays for its own steps, and each request beside it (before it,
    still in the engine, and after it, filling the slots that free) shares as many
    of them as it has itself, doing that much of its cost, until the other slots
    are filled for all of its steps (`open`, `close`). With one slot that is the
    stream reaching the chunk's end; with many, a short answer behind long ones ends
    before them, however dear its prompt, and a long answer stays while the short
    ones beside it come and go, as vLLM runs them. Where every request's steps are
    its cost units this is processor sharing.

    The requests behind a chunk's last one are those of the chunks the worker claims
    before it closes, so its close moves later as each is claimed: worked out once
    at its claim, with the slots its worker's later chunks fill beside it counted
    empty, a long answer's chunk read as if the engine ran it alone at the end (on
    the real engine, 18 s early at a median, 14 s now, against 2 s for short
    answers'; docs/benchmarks.md, "A chunk's close, moved by the chunks claimed
    after it")."""

    def __init__(self, slots: int, rate: float, done: float = 0.0) -> None:
        self.slots, self.rate = max(slots, 1), rate
        # Seconds ahead: the engine did `done` cost units of the requests in it now
        # (Held.done), so the stream's first segment started that long before now.
        self.lead = done / rate if rate > 0 else 0.0
        # (first position, start, cost, steps) of each chunk
        self.segments: list[tuple[float, float, float, float]] = []
        self.ends: list[float] = []
        self.times: list[float] = []
        self.head = 0  # the segments before it were done before now
        self.opened: dict[int, _Open] = {}  # its chunks held, by the order they were taken
        self.full: dict[int, float] = {}  # the closes of those whose slots are filled

    @property
    def position(self) -> float:
        return self.ends[-1] if self.ends else 0.0

    def add(self, requests: float, cost: float, at: float, steps: float | None = None) -> float:
        """Append a chunk of `requests` of `cost` and `steps` (None: its cost) each at
        time `at`; its end position."""
        start = max(self.times[-1], at) if self.times else at - (self.lead if at <= 0 else 0.0)
        self.lead = 0.0  # the requests in the engine at the start only
        self.segments.append((self.position, start, cost, steps or cost))
        self.ends.append(self.position + requests)
        self.times.append(start + requests * cost / self.rate)
        return self.ends[-1]

    def done_at(self, when: float) -> float:
        """The stream's position at `when`, no earlier than the last asked (the
        segments done by then are dropped)."""
        while self.head < len(self.times) and self.times[self.head] <= when:
            self.head += 1
        if self.head > 64 and self.head * 2 > len(self.times):
            # Not those behind a chunk held: its close counts them, done or not.
            keep = min([self.head, *(bisect.bisect_left(self.ends, held.end)
                                     for held in self.opened.values())])
            del self.segments[:keep], self.ends[:keep], self.times[:keep]
            self.head -= keep
        if self.head == len(self.times):
            return self.position
        first, start, cost, _ = self.segments[self.head]
        return first if when <= start else first + (when - start) * self.rate / cost

    def reached(self, position: float) -> float:
        """When the stream reaches `position` (one not before the head's)."""
        i = bisect.bisect_left(self.ends, position, lo=self.head)
        if i == len(self.ends):
            return self.times[-1]
        first, start, cost, _ = self.segments[i]
        return start + max(position - first, 0.0) * cost / self.rate

    def beside(self, low: float, high: float, steps: float, limit: float
               ) -> tuple[float, float]:
        """(cost units, slot-steps) of the requests at positions (low, high] beside
        one of `steps` steps: each shares the lesser of its steps and `steps` with it,
        doing its cost over its steps in each, until `limit` slot-steps are filled."""
        work = used = 0.0
        i = bisect.bisect_right(self.ends, low)
        while i < len(self.ends) and used < limit and self.segments[i][0] < high:
            first, _, cost, each = self.segments[i]
            shared = min(each, steps)
            count = min(min(high, self.ends[i]) - max(low, first), (limit - used) / shared)
            used += count * shared
            work += count * shared * cost / each
            i += 1
        return work, used

    def open(self, key: int, end: float, requests: float, cost: float, now: float,
             steps: float | None = None) -> None:
        """Hold the chunk `key` of `requests` of `cost` and `steps` (None: its cost)
        each that ends at position `end`, added at `now`: when its last request is
        admitted and what is ahead of it beside it. Requests found in the engine at
        the start count whole but for what the worker says its engine did of them
        where nothing follows them (`lead`, in seconds, from
        _ChunkPlay.counted_off), not a guess: a chunk's last requests are its
        longest, and taking them as half through read the tails of chunks early on
        the real engine."""
        if requests <= 0:
            self.opened[key] = _Open(now, end, 0.0, 0.0, 0.0, 0.0)
            return
        steps = steps or cost
        done = self.done_at(now)
        admitted = now if end - self.slots <= done else self.reached(end - self.slots)
        limit = (self.slots - 1) * steps
        before, used = self.beside(max(end - self.slots, done), end - 1, steps, limit)
        self.opened[key] = _Open(max(admitted, now), end, steps, cost + before, used, limit)

    def close(self, key: int) -> float:
        """When the held chunk `key` closes, as its stream stands: when its last
        request ends, beside the requests behind it that the worker claimed so far
        (a chunk claimed after it closed is not in it)."""
        if key in self.full:  # no request claimed later can move it
            return self.full[key]
        held = self.opened[key]
        after, used = self.beside(held.end, self.position, held.steps, held.limit - held.used)
        when = held.admitted + (held.work + after) / self.rate
        if held.used + used >= held.limit * (1 - 1e-9):
            self.full[key] = when
        return when

    def forget(self, key: int) -> None:
        """The held chunk `key` closed."""
        del self.opened[key]
        self.full.pop(key, None)


class _ChunkPlay:
    """chunk_finish_times' state as it plays forward (one model)."""

    def __init__(self, loads: Sequence[Load], state: Dispatch, worker_rate: float,
                 shares: ShareFunction) -> None:
        self.loads = {load.batch_id: load for load in loads}
        self.state, self.shares = state, shares
        self.holding = [0] * len(state.workers)  # chunks each worker holds
        self.queue = deque(state.queued)
        self.pending = {batch: [chunks, requests] for batch, (chunks, requests)
                        in state.pending.items() if chunks > 0 and batch in self.loads}
        self.streams = [_Stream(held.slots, worker_rate, self.counted_off(held))
                        for held in state.workers]
        self.left = Counter(batch for held in state.workers for batch, _ in held.chunks)
        self.left.update(batch for batch, _ in self.queue)
        self.left.update({batch: chunks for batch, (chunks, _) in self.pending.items()})
        self.remaining = {batch: load.remaining for batch, load in self.loads.items()}
        self.passes = [(state.passes.get(batch, 0.0), batch) for batch in self.pending]
        heapq.heapify(self.passes)
        self.split: dict[str, float] = {}
        self.members: frozenset[str] = frozenset()
        # (when it closes, order taken) of the chunks held, an entry no longer its
        # chunk's close (`when`) once a chunk claimed after it moved it
        self.closes: list[tuple[float, int]] = []
        self.when: dict[int, float] = {}
        self.held: dict[int, tuple[int, str, float]] = {}  # order: (worker, batch, cost units)
        # this instant's, unsettled: (worker, batch, cost units, end, steps left)
        self.taken: list[tuple[int, str, float, float, float | None]] = []
        self.order = 0
        self.now = 0.0
        for worker, held in enumerate(state.workers):
            for place, (batch, work) in enumerate(held.chunks):
                self.hold(worker, batch, work, held.left_steps.get(place))

    def cost(self, batch: str) -> float:
        return self.loads[batch].cost if batch in self.loads else 1.0

    def steps(self, batch: str) -> float | None:
        return self.loads[batch].steps if batch in self.loads else None

    def counted_off(self, held: Held) -> float:
        """What `held`'s engine did of the requests in it (Held.done), counted off its
        stream only while no request follows them: none waits for its slots, none is
        in the broker's window or pending. Then the engine has just their work left.
        While requests follow, the engine prefills each as a slot frees, in the same
        steps as it decodes the ones in it, so those go no faster for the prompts
        they had computed: with their admissions staggered, the one admitted k-th
        ends about when the stream, started now, reaches it (a request's time in
        full slots is the slots' work over the rate, and the k-th has k of those
        parts left). Counting the work done off there read the real engine's ETAs of
        running batches early by a median 15 % (5 % on larger batches), against 8 %
        (3 %) without (docs/benchmarks.md, "The work in the engine"). Nor where the
        worker tells its chunks' steps left (Held.left_steps): those close from what
        each has left already, and counting the work done off as well read a chunk
        half done at half its time left."""
        follows = self.queue or self.pending or \
            sum(work / self.cost(batch) for batch, work in held.chunks) > held.slots
        return 0.0 if follows or held.left_steps else held.done

    def hold(self, worker: int, batch: str, work: float, left: float | None = None) -> None:
        """`worker` holds a chunk from now: its requests join the worker's stream
        (`left`: the steps its longest request has left, all of them in the engine)."""
        end = self.streams[worker].add(work / self.cost(batch), self.cost(batch), self.now,
                                       self.steps(batch))
        self.holding[worker] += 1
        self.taken.append((worker, batch, work, end, left))

    def settle(self) -> None:
        """When the chunks taken at this instant close, worked out once all of them
        are in (they share their worker's engine), and when those their workers held
        before close now: the requests just taken fill the slots beside theirs."""
        for worker, batch, work, end, left in self.taken:
            cost, steps = self.cost(batch), self.steps(batch)
            # A chunk all in the engine: its last request stays for the steps its
            # longest has left, doing that part of its cost, beside the others for as
            # many (a whole request's at most).
            part = 1.0 if left is None or not steps else min(left / steps, 1.0)
            self.order += 1
            self.streams[worker].open(self.order, end, work / cost, cost * part, self.now,
                                      None if steps is None else steps * part)
            self.held[self.order] = (worker, batch, work)
        for worker in {worker for worker, *_ in self.taken}:
            for order in self.streams[worker].opened:
                when = self.streams[worker].close(order)
                if self.when.get(order) != when:
                    self.when[order] = when
                    heapq.heappush(self.closes, (when, order))
        self.taken.clear()

    def refill(self) -> None:
        """The dispatcher: the lowest pass's next chunk into the window, while it has room."""
        while len(self.queue) < self.state.window and self.passes:
            if self.members != frozenset(self.pending):
                self.members = frozenset(self.pending)
                self.split = self.shares([replace(
                    self.loads[batch], remaining=self.remaining[batch],
                    time_left=None if self.loads[batch].time_left is None
                    else self.loads[batch].time_left - self.now) for batch in self.members])
            passed, batch = heapq.heappop(self.passes)
            chunks, requests = self.pending[batch]
            count = self.next_chunk(batch, chunks, requests)
            self.queue.append((batch, count * self.loads[batch].cost))
            if chunks > 1:
                self.pending[batch] = [chunks - 1, requests - count]
                heapq.heappush(self.passes, (passed + count / self.split[batch], batch))
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

    def close(self) -> str:
        """The next chunk to close; its worker takes another from the window. Returns
        its batch."""
        while True:
            when, order = heapq.heappop(self.closes)
            if self.when.get(order) == when:  # else a close a later claim moved
                break
        del self.when[order]
        worker, batch, work = self.held.pop(order)
        self.streams[worker].forget(order)
        self.now = when
        self.holding[worker] -= 1
        self.left[batch] -= 1
        if batch in self.remaining:
            self.remaining[batch] = max(self.remaining[batch] - work, 0.0)
        if self.queue and self.holding[worker] < self.state.workers[worker].threads:
            self.take(worker)
        self.deal()
        self.settle()
        return batch


def chunk_finish_times(loads: Sequence[Load], state: Dispatch, worker_rate: float,
                       shares: ShareFunction = fair_shares) -> dict[str, float]:
    """Seconds from now until each batch's last chunk on this model closes, playing the
    dispatcher and the workers forward chunk by chunk: the dispatcher keeps
    `state.window` chunks in the broker's window, the lowest stride pass first (a
    chunk of n requests moves its batch's pass by n / share, the shares from
    `shares` over the batches still pending, as dispatch computes them); a worker
    with a free chunk thread takes the window's first chunk; each worker runs its
    chunks' requests at `worker_rate` cost units a second, in the order it claimed
    them, as many at once as its slots (`_Stream`: one slot serves its chunks one
    after another). Exact for a scheduler that behaves so, whatever the batches'
    sizes: a small batch's one chunk waits for the window ahead of it and for the
    chunks ahead of it on its worker, which a fluid split of the rate cannot say.
    O(chunks × log) plus a share computation each time a batch runs out of pending
    chunks."""
    if worker_rate <= 0:
        raise ValueError("chunk_finish_times needs a positive rate")
    play = _ChunkPlay(loads, state, worker_rate, shares)
    finish = {batch: 0.0 for batch in play.loads if play.left[batch] <= 0}
    play.refill()
    play.deal()
    play.settle()
    while play.when:
        batch = play.close()
        if play.left[batch] <= 0 and batch in play.loads:
            finish[batch] = play.now
    for batch in play.loads:
        finish.setdefault(batch, math.inf)  # no worker can take its chunks
    return finish
