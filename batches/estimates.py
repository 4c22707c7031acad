"""Estimates: each model's measured throughput and each running batch's ETA and
at_risk, cached on the rows. The control worker refreshes them every few seconds
(batches.refresh_estimates) so that a poll reads a column instead of playing the
scheduler: a refresh costs a fixed handful of queries (a few per model) plus one
single-row UPDATE per batch whose estimate moved (by 1 s and 1 % of its time to
go), whatever the number of polls.

The model is batches/eta.py's chunk play (eta.chunk_finish_times): the dispatcher
and the workers played forward chunk by chunk from where every open chunk is now
(held by a worker, in the broker's window, or pending), under the shares of the
deadline policy dispatch applies (batches/deadlines.py). Its inputs, measured here:

- one worker's rate, in cost units (a request plus its output tokens plus its
  prompt tokens computed at the model's prompt weight, eta.PromptFit) a second:
  what the model's live workers say they did between refreshes (Progress: the
  requests, tokens generated and prompt tokens computed their heartbeats carry,
  step by step from an engine that tells them) over the last PROGRESS_SECONDS it
  had work, over the seconds they held requests. Until PROGRESS_MIN seconds are in
  (a control worker that just started), from the finished chunks: their work over
  their service times (eta.service_rate: a chunk's service starts at the later of
  its claim and the close before it on the same worker), over the model's last
  LAST_CHUNKS finished chunks (CHUNKS_PER_WORKER a live worker, if more); before
  any closed, the higher of the progress seen after the engine's warm-up and the
  running chunks' work so far over their busy time.
  Stored as the model's rate (times its live workers) for the deadline policy. A
  model that no worker holds now (multiplexing) is planned on one worker after a
  swap (the recent swaps' time, fleet.selectors.swap_seconds_estimate).
- where each open chunk is: each live worker's running chunks in the order it
  claimed them, its chunk threads and its slots, the broker's window in the order
  it was published, and each batch's pending chunks and stride pass.
- each batch's work left on each model: its open chunks' requests not yet done,
  times its cost per request: its own mean so far, its answers costed by the
  output limits of the requests left where its lines name them (eta.left_output:
  the requests of a small max_tokens end first); before any finished, the
  answer-length prior (eta.answer_prior: what the model's last PRIOR_BATCHES
  finished batches answered for their lines' max_tokens, applied to this batch's
  own, Batch.output_limit_mean) and their prompt tokens (eta.prompt_prior); else
  the model's mean.

The UPDATEs are single-row statements outside any transaction, so they hold no
lock while waiting for another (docs/architecture.md, "Locks")."""

from __future__ import annotations

import math
import threading
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db.models import Count, F, Sum
from django.db.models.functions import Greatest
from django.utils import timezone

from batches import deadlines, eta, eta_record
from batches.dispatch import MIN_WINDOW, _model_filter, chunk_model, starting_pass
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus, ModelThroughput
from core.transient import retry_transient
from fleet import selectors as fleet_selectors

# Enough chunks to average over several workers' turns; few enough to follow a
# change of workload within a minute or so.
LAST_CHUNKS = 50
# ... and a few of each live worker's, however many (eta.service_rate measures a
# worker's chunks against the close before them on the same worker).
CHUNKS_PER_WORKER = 8
# What estimates_refresh reads of each running batch (load_of reads all but 8, 9, 11
# and 12).
COLUMNS = ("id", "priority", "owner_id", "owner__weight", "expires_at", "completed", "failed",
           "usage_output_tokens", "estimated_completion_at", "at_risk", "output_limit_mean",
           "model", "dispatch_pass", "usage_input_tokens", "usage_cached_tokens", "total",
           "output_limit_done", "created_at")
# Finished batches the answer-length prior learns from, per model.
PRIOR_BATCHES = 50
# The model's rate now: the cost units its workers did between refreshes (their
# heartbeats carry their figures every few seconds), over the last PROGRESS_SECONDS
# it had work, once PROGRESS_MIN seconds of them are in. Unlike the finished chunks'
# rate it counts the work in flight, which a worker running several chunks side by
# side (many slots) holds a good part of its work in.
PROGRESS_SECONDS = 120.0
PROGRESS_MIN = 10.0


@dataclass
class Progress:
    """What the refreshing process remembers from one refresh to the next: each live
    worker's model and work figures as it last saw them (fleet_selectors.WorkerWork:
    seconds busy, requests, prompt tokens computed, tokens generated), and per model
    the intervals its workers had work in, as (start, end, decode units done,
    prompt tokens computed, worker-seconds busy), and what a prompt token costs
    there (eta.PromptFit). In memory: the control worker refreshes, and one that
    starts afresh measures from the finished chunks until it has PROGRESS_MIN
    seconds of its own (and the stored prompt weight until it has fitted one).

    The workers' own figures, not the chunks' requests done: an engine that tells
    its work step by step (vLLM, serving.engines.base.Engine.reports_work) gives the
    work as it is done, where the answers come back in waves a request's time
    after it (with 64 slots on the CPU engine that lag read a prompt token at a
    fifth of its cost, and the rate low by as much while short answers ran), and a
    request done counts with the tokens it took, not its batch's mean so far (the
    short answers of a batch end first)."""

    at: datetime | None = None
    refreshed: float = 0.0  # when the last refresh began, Unix seconds
    workers: dict[str, tuple[str, fleet_selectors.WorkerWork]] = field(default_factory=dict)
    spans: dict[str, deque[tuple[float, float, float, float, float]]] = field(
        default_factory=lambda: defaultdict(deque))
    fits: dict[str, eta.PromptFit] = field(default_factory=lambda: defaultdict(eta.PromptFit))

    def observe(self, now: datetime,
                figures: dict[str, dict[str, fleet_selectors.WorkerWork]]) -> None:
        """Take in what the live workers of each model (`figures`: {model: {worker:
        WorkerWork}}) did since the last refresh. A model's first intervals busy
        without work done (an engine warming up) are not its rate."""
        start, end = (self.at or now).timestamp(), now.timestamp()
        for spans in self.spans.values():  # a model idle this long starts afresh
            while spans and spans[0][1] < end - PROGRESS_SECONDS:
                spans.popleft()
        if self.at is not None and end > start:
            for model, (busy, decode, prompt) in self.work_since(figures).items():
                spans = self.spans[model]
                if spans or decode > 0:
                    spans.append((start, end, decode, prompt, busy))
                if decode > 0:
                    self.fits[model].add(end - start, decode, prompt, busy)
        self.workers = {worker: (model, seen) for model, workers in figures.items()
                        for worker, seen in workers.items()}
        self.at = now

    def work_since(self, figures: dict[str, dict[str, fleet_selectors.WorkerWork]]
                   ) -> dict[str, tuple[float, float, float]]:
        """Per model, what its workers did since the last refresh: (worker-seconds
        busy, decode units: a request plus each token generated, prompt tokens
        computed). A worker seen for the first time, or that changed model (a swap)
        or whose figures went back (its engine's started afresh), is left out this
        once."""
        total: dict[str, tuple[float, float, float]] = {}
        for model, workers in figures.items():
            for worker, now in workers.items():
                seen = self.workers.get(worker)
                if seen is None or seen[0] != model:
                    continue
                was = seen[1]
                busy, requests, prompt, output = (
                    now.busy - was.busy, now.requests - was.requests,
                    now.prompt - was.prompt, now.output - was.output)
                if busy > 0 and min(requests, prompt, output) >= 0:
                    was = total.get(model, (0.0, 0.0, 0.0))
                    total[model] = (was[0] + busy, was[1] + requests + output, was[2] + prompt)
        return total

    def forget(self) -> None:
        self.at, self.workers = None, {}
        self.spans, self.fits = defaultdict(deque), defaultdict(eta.PromptFit)

    def prompt_weight(self, model: str) -> float | None:
        """A prompt token's worth in output tokens on `model` (eta.PromptFit); None
        until the intervals tell."""
        fit = self.fits.get(model)
        return fit.weight() if fit else None

    def rate(self, model: str, least: float = PROGRESS_MIN,
             prompt_weight: float = 0.0) -> float | None:
        """One worker's cost units a second (a prompt token at `prompt_weight`): the
        model's over its recent intervals with work, over its workers' busy time in
        them; None before `least` seconds of them."""
        spans = self.spans.get(model) or ()
        if sum(end - start for start, end, *_ in spans) < least:
            return None
        return eta.span_rate(spans, prompt_weight)


PROGRESS = Progress()
# A chunk's batch's prompt tokens the engine computed: prefix-cached ones cost
# next to nothing.
PROMPT_COMPUTED = F("batch__usage_input_tokens") - F("batch__usage_cached_tokens")


def model_throughput_measure(*, model: str, live_workers: int, now: datetime,
                             stored: ModelThroughput | None,
                             progress: float | None = None, early: float | None = None,
                             prompt_weight: float = 0.0) -> ModelThroughput | None:
    """Measure `model`'s rate and store it: one worker's `progress` (cost units a
    second, Progress.rate) when there is one, else from its last finished chunks;
    before any closed, the higher of the `early` progress (under PROGRESS_MIN
    seconds of it, after the engine's warm-up) and the running chunks' work so far
    over their time; the last stored one (scaled to the live workers) when none
    finished yet (`stored`); None if never. A prompt token costs `prompt_weight`
    (eta.PromptFit), stored with the rate so that every reader of it costs work
    alike."""
    rows = list(Chunk.objects.filter(model__in=_model_filter(model), status=ChunkStatus.DONE,
                                     claimed_at__isnull=False, finished_at__isnull=False)
                .order_by("-finished_at")
                .values_list("count", "claimed_at", "finished_at", "worker", "batch__completed",
                             "batch__failed", "batch__usage_output_tokens", PROMPT_COMPUTED)
                [:max(LAST_CHUNKS, CHUNKS_PER_WORKER * live_workers)])
    finished = len(rows)
    # Before any chunk closed, the running ones count with what they did so far.
    rows += [(done + failed, claimed, now, *rest) for done, failed, claimed, *rest in
             Chunk.objects.filter(model__in=_model_filter(model), status=ChunkStatus.RUNNING,
                                  claimed_at__isnull=False)
             .values_list("completed", "failed", "claimed_at", "worker", "batch__completed",
                          "batch__failed", "batch__usage_output_tokens", PROMPT_COMPUTED)
             [:LAST_CHUNKS]
             ] if not finished else []
    requests = sum(row[0] for row in rows)
    if not requests:
        return stored
    costs = [eta.request_cost(done + failed, tokens, 1.0, prompt, prompt_weight)
             for *_, done, failed, tokens, prompt in rows]
    work = [(worker, claimed.timestamp(), end.timestamp(), count * cost)
            for (count, claimed, end, worker, *_), cost in zip(rows, costs, strict=True)]
    one = progress or None
    if one is None and finished:
        one = eta.service_rate(work)
    if one is None:  # nothing closed yet: both read low (the first answers take a
        # request's time to come back, and the work so far counts a warm-up): the higher
        whole = eta.measured_rate([row[1:] for row in work])
        one = max(early or 0.0, whole / (len({row[0] for row in work}) or 1) if whole else 0.0)
        one = one or None
    if one is None:
        return stored
    measured, _ = ModelThroughput.objects.update_or_create(model=model, defaults={
        "rate": one * max(live_workers, 1), "workers": live_workers, "measured_at": now,
        "cost_per_request": sum(row[3] for row in work) / requests,
        "prompt_weight": prompt_weight})
    return measured


def answer_history(model: str) -> list[tuple[float, float, int, float]]:
    """(mean output limit, output tokens per request, requests, prompt tokens
    computed per request) of the model's last PRIOR_BATCHES completed batches whose
    lines named a limit (eta.answer_prior, eta.prompt_prior)."""
    rows = (Batch.objects.filter(model=model, status=BatchStatus.COMPLETED, completed__gt=0,
                                 output_limit_mean__isnull=False)
            .order_by("-completed_at")
            .values_list("output_limit_mean", "usage_output_tokens", "completed",
                         F("usage_input_tokens") - F("usage_cached_tokens"))[:PRIOR_BATCHES])
    return [(limit, tokens / done, done, prompt / done) for limit, tokens, done, prompt in rows]


@dataclass
class OpenChunks:
    """A model's open chunks of running batches, as the chunk play needs them:
    requests left per batch, the running ones (worker, batch, requests left, index)
    in the order they were claimed, the queued ones in the order they were published, and
    the pending ones per batch (chunks, requests)."""

    left: dict[str, int] = field(default_factory=dict)
    running: list[tuple[str, str, int, int]] = field(default_factory=list)
    queued: list[tuple[str, int]] = field(default_factory=list)
    pending: dict[str, tuple[int, int]] = field(default_factory=dict)

    def add(self, batch_id: str, requests: int) -> None:
        self.left[batch_id] = self.left.get(batch_id, 0) + requests

    def dispatch(self, loads: list[eta.Load], slots: dict[str, int],
                 passes: dict[str, float],
                 tails: dict[str, dict[str, list]] | None = None) -> eta.Dispatch:
        """The play's view of the workers with these `slots`: its cost units from
        `loads`; a running chunk of a worker that is not live for this model first in
        the window (it is taken again); the steps the longest of a chunk's requests has
        left where all those left are in its worker's engine, and the requests of each
        chunk there with a token (`tails`: Worker.chunk_tails by worker,
        Held.left_steps, Held.started)."""
        cost = {load.batch_id: load.cost for load in loads}
        held: dict[str, list[tuple[str, float]]] = {worker: [] for worker in slots}
        left_steps: dict[str, dict[int, float]] = {worker: {} for worker in slots}
        # A worker tells the requests started where its engine tells their tokens
        # (a tail of three: one of an older version has two).
        started: dict[str, dict[int, float] | None] = {
            worker: {} if (told := (tails or {}).get(worker)) and
            all(len(tail) > 2 for tail in told.values()) else None for worker in slots}
        orphans = []
        for worker, batch_id, left, index in self.running:
            work = (batch_id, left * cost.get(batch_id, 1.0))
            if worker not in held:
                orphans.append(work)
                continue
            tail = (tails or {}).get(worker, {}).get(f"{batch_id}-{index}")
            if tail and tail[0] >= left > 0 and tail[1] is not None:
                # Its prefill done or not, one step more than the tokens it may add.
                left_steps[worker][len(held[worker])] = tail[1] + 1.0
            if tail and started[worker] is not None:
                started[worker][len(held[worker])] = float(tail[2])
            held[worker].append(work)
        if not slots:  # no live worker holds the model: one will, after a swap
            slots, held = {"": settings.BATCHGEN_MAX_POOL_SIZE}, {"": []}
        threads = {worker: fleet_selectors.chunk_threads(count) for worker, count in slots.items()}
        return eta.Dispatch(
            workers=tuple(eta.Held(threads[worker], tuple(held[worker]), slots[worker],
                                   left_steps.get(worker, {}), started.get(worker))
                          for worker in slots),
            queued=tuple(orphans + [(batch_id, left * cost.get(batch_id, 1.0))
                                    for batch_id, left in self.queued]),
            window=max(MIN_WINDOW, fleet_selectors.window_for(threads.values())),
            pending=self.pending, passes=passes)


def open_chunks() -> dict[str, OpenChunks]:
    """Each served model's OpenChunks, in two queries: the running and queued chunks
    one by one (a few per worker), the pending ones summed per batch."""
    found: dict[str, OpenChunks] = defaultdict(OpenChunks)
    flying = (Chunk.objects.filter(status__in=(ChunkStatus.RUNNING, ChunkStatus.QUEUED),
                                   batch__status=BatchStatus.IN_PROGRESS)
              .annotate(left=Greatest(F("count") - F("completed") - F("failed"), 0))
              .order_by(F("claimed_at").asc(nulls_last=True),
                        F("published_at").asc(nulls_last=True), "id")
              .values_list("model", "batch_id", "status", "worker", "left", "index"))
    for model, batch_id, status, worker, left, index in flying:
        chunks = found[chunk_model(model)]
        chunks.add(batch_id, left)
        if status == ChunkStatus.RUNNING:
            chunks.running.append((worker, batch_id, left, index))
        else:
            chunks.queued.append((batch_id, left))
    for row in (Chunk.objects.filter(status=ChunkStatus.PENDING,
                                     batch__status=BatchStatus.IN_PROGRESS)
                .values("model", "batch_id")
                .annotate(requests=Sum(F("count") - F("completed") - F("failed")),
                          chunks=Count("id"))):
        chunks, requests = found[chunk_model(row["model"])], max(row["requests"], 0)
        chunks.add(row["batch_id"], requests)
        pending = chunks.pending.get(row["batch_id"], (0, 0))
        chunks.pending[row["batch_id"]] = (pending[0] + row["chunks"], pending[1] + requests)
    return found


def play(loads: list[eta.Load], chunks: OpenChunks, measured: ModelThroughput,
         passes: dict[str, float], workers: dict[str, fleet_selectors.WorkerWork],
         at: float | None = None) -> dict[str, float]:
    """Seconds until each batch's work on `model` is done: the chunk play (eta.
    chunk_finish_times) under the shares dispatch applies (the deadline policy's, or
    fair share with it off), at one worker's measured rate over the model's live
    `workers` and their slots, after a swap when none holds the model; a chunk all
    in its worker's engine ended as its longest request will (WorkerWork.tails,
    eta.Held.left_steps). A refresh's play, made `at` (Unix seconds), is recorded
    where BATCHGEN_ETA_RECORD says (batches/eta_record.py)."""
    slots = {worker: seen.slots for worker, seen in workers.items()}
    rate = measured.rate
    one = rate / max(len(slots), 1)
    delay = 0.0 if slots else fleet_selectors.swap_seconds_estimate()
    shares = partial(deadlines.deadline_shares, rate=rate) if settings.BATCHGEN_DEADLINE_POLICY \
        else eta.fair_shares
    tails = {worker: seen.tails or {} for worker, seen in workers.items()}
    state = chunks.dispatch(loads, slots, passes, tails)
    played = {batch_id: seconds + delay for batch_id, seconds in
              eta.chunk_finish_times(loads, state, one, shares).items()}
    if at is not None and settings.BATCHGEN_ETA_RECORD:
        eta_record.write(settings.BATCHGEN_ETA_RECORD, eta_record.Recorded(
            at=at, model=measured.model, one=one, rate=rate, delay=delay,
            policy=settings.BATCHGEN_DEADLINE_POLICY, loads=tuple(loads), state=state,
            played=played, prompt_weight=measured.prompt_weight,
            spans=tuple(PROGRESS.spans.get(measured.model, ()))))
    return played


# The control worker's threads take turns to refresh, the beat's tick and those an
# event asks for: PROGRESS is the process's memory of the ticks before.
REFRESHING = threading.Lock()


@retry_transient
def estimates_refresh(now: datetime | None = None) -> int:
    """Refresh every running batch's estimated_completion_at and at_risk, taking in
    what the workers did since the last refresh (PROGRESS); returns how many rows
    moved. The beat's tick, every few seconds."""
    with REFRESHING:
        return _refresh(now or timezone.now(), observe=True)


@retry_transient
def estimates_refresh_after(event: float) -> int:
    """Refresh for what the play cannot foresee, a batch admitted, cancelled or
    expired at `event` (Unix seconds), unless a refresh began after it: a burst of
    admissions costs about one refresh per refresh's time, not one each. Without it
    every other batch's ETA, and the new batch's own, waited up to a tick. It plays the
    tick's measurements again, without taking in the workers' figures (the
    intervals the rate and the prompt fit learn from stay the tick's), but in a
    process that has not measured yet. A publisher's clock ahead of this one's
    costs a refresh more, one behind it at worst leaves the event to the next
    tick."""
    with REFRESHING:
        if PROGRESS.refreshed >= event:
            return 0
        return _refresh(timezone.now(), observe=PROGRESS.at is None)


def _refresh(now: datetime, *, observe: bool) -> int:
    batches = {row[0]: row for row in Batch.objects.filter(status=BatchStatus.IN_PROGRESS)
               .values_list(*COLUMNS)}
    histories = {model: answer_history(model) for model in {row[11] for row in batches.values()}}
    work = fleet_selectors.live_worker_work()
    if observe:
        PROGRESS.observe(now, work)
    finish: dict[str, float | None] = {}
    risky: set[str] = set()
    stored = {row.model: row for row in ModelThroughput.objects.all()}
    for model, chunks in open_chunks().items():
        weight = prompt_weight(model, stored.get(model), work.get(model, {}))
        measured = model_throughput_measure(
            model=model, live_workers=len(work.get(model, {})), now=now,
            stored=stored.get(model),
            progress=PROGRESS.rate(model, prompt_weight=weight),
            early=PROGRESS.rate(model, least=0.0, prompt_weight=weight), prompt_weight=weight)
        loads = [load_of(batches[batch_id], requests, measured, now,
                         histories[batches[batch_id][11]])
                 for batch_id, requests in chunks.left.items() if batch_id in batches]
        if measured is None or measured.rate <= 0:
            finish.update((load.batch_id, None) for load in loads)
            continue
        risky.update(load.batch_id for load in loads if deadlines.at_risk(load, measured.rate))
        played = play(loads, chunks, measured,
                      {batch_id: batches[batch_id][12] for batch_id in chunks.left
                       if batch_id in batches}, work.get(model, {}), at=now.timestamp())
        for batch_id, seconds in played.items():
            if finish.get(batch_id, 0.0) is not None:  # of several models: the last one's
                finish[batch_id] = max(finish.get(batch_id) or 0.0, seconds)
    moved = 0
    for batch_id, row in batches.items():
        seconds = finish.get(batch_id, 0.0)  # no open work: finalizing next
        estimate = None if seconds is None or math.isinf(seconds) else \
            now + timedelta(seconds=seconds)
        known, was_at_risk = row[8], row[9]
        if (estimate is None) != (known is None) or was_at_risk != (batch_id in risky) or (
                estimate is not None and eta.moved((estimate - known).total_seconds(),
                                                   seconds)):
            moved += Batch.objects.filter(id=batch_id, status=BatchStatus.IN_PROGRESS).update(
                estimated_completion_at=estimate, at_risk=batch_id in risky)
    PROGRESS.refreshed = now.timestamp()  # once done: one that failed saw nothing
    return moved


def prompt_weight(model: str, stored: ModelThroughput | None,
                  workers: dict[str, fleet_selectors.WorkerWork]) -> float:
    """What a prompt token costs on `model`, in output tokens: the refresh's own fit
    of its workers' intervals (PROGRESS); until that tells, the last one stored;
    for a model never fitted (none stored, or 0), the median of what its live
    workers' engines tell from their steps (Worker.engine_prompt_weight), which
    they do within their first seconds; else 0. Without a prior, prompts cost
    nothing until batches of other answer lengths give the intervals' fit its
    spread: on the CPU engine that took two minutes, and the batches of longer
    answers queued meanwhile read 20-30 % late (docs/benchmarks.md, "The real
    engine's first two minutes, traced")."""
    fitted = PROGRESS.prompt_weight(model)
    if fitted is not None:
        return fitted
    if stored is not None and stored.prompt_weight > 0:
        return stored.prompt_weight
    told = sorted(seen.prompt_weight for seen in workers.values()
                  if seen.prompt_weight is not None)
    return told[len(told) // 2] if told else 0.0


def load_of(row: tuple, requests: int, measured: ModelThroughput | None,
            now: datetime, history: list[tuple[float, float, int]]) -> eta.Load:
    """The ETA model's view of one batch's work on one model (row: COLUMNS)."""
    batch_id, priority, owner_id, weight, expires_at, completed, failed, tokens = row[:8]
    prior = eta.answer_prior(history, row[10])
    prompt_weight = measured.prompt_weight if measured else 0.0
    fallback = (1.0 + prior + prompt_weight * eta.prompt_prior(history) if prior is not None
                else measured.cost_per_request if measured else 1.0)
    done = completed + failed
    answer = eta.left_output(done, row[15] - done, tokens, row[16], row[10])
    cost = eta.request_cost(done, tokens, fallback, row[13] - row[14], prompt_weight,
                            answer=answer)
    return eta.Load(batch_id=batch_id, remaining=requests * cost, priority=priority,
                    owner=owner_id, weight=weight, chunk=settings.BATCHGEN_CHUNK_SIZE * cost,
                    cost=cost, steps=eta.request_steps(done, tokens, prior, answer,
                                                       limit=row[10], cost=cost),
                    time_left=(expires_at - now).total_seconds(), created=row[17].timestamp())


def at_risk_count() -> int:
    """Running batches whose window cannot be kept even with all capacity (/metrics)."""
    return Batch.objects.filter(status=BatchStatus.IN_PROGRESS, at_risk=True).count()



# The head of an input file read to estimate its number of requests at create (a
# millisecond or so); validation counts them exactly later.
SAMPLE_BYTES = 1 << 20


def requests_estimate(*, path, size: int) -> int:
    """The requests of an input file, from the lines in its first SAMPLE_BYTES."""
    with open(path, "rb") as handle:
        head = handle.read(SAMPLE_BYTES)
    if not head:
        return 0
    lines = head.count(b"\n") + (0 if head.endswith(b"\n") else 1)
    return max(1, round(lines * size / len(head)))


def admission_eta(*, model: str, requests: int, window_seconds: float, priority: int = 1,
                  owner_id: int | None = None, weight: int | None = None,
                  now: datetime | None = None) -> float | None:
    """Seconds until a batch of `requests` created now would finish, played among the
    running batches of `model` under the deadline policy (its chunks pending at the
    lowest pass, as dispatch starts a batch); None while the model's rate is unknown
    (then nothing can be said, and strict admission lets it in)."""
    now = now or timezone.now()
    measured = ModelThroughput.objects.filter(model=model).first()
    if measured is None or measured.rate <= 0:
        return None
    chunks = open_chunks().get(model, OpenChunks())
    rows = {row[0]: row for row in Batch.objects.filter(id__in=list(chunks.left))
            .values_list(*COLUMNS)}
    history = answer_history(model)
    loads = [load_of(rows[batch_id], count, measured, now, history)
             for batch_id, count in chunks.left.items() if batch_id in rows]
    passes = {batch_id: row[12] for batch_id, row in rows.items()}
    size = settings.BATCHGEN_CHUNK_SIZE
    loads.append(eta.Load(batch_id="", remaining=requests * measured.cost_per_request,
                          priority=priority, owner=owner_id, weight=weight,
                          chunk=size * measured.cost_per_request,
                          cost=measured.cost_per_request, time_left=window_seconds,
                          created=now.timestamp()))
    chunks.pending[""] = (max(1, math.ceil(requests / size)), requests)
    passes[""] = starting_pass()  # as batch_validate will give it
    played = play(loads, chunks, measured, passes,
                  fleet_selectors.live_worker_work().get(model, {}))
    return None if math.isinf(played[""]) else played[""]
