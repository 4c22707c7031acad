"""Estimates: each model's measured throughput and each running batch's ETA and
at_risk, cached on the rows. The control worker refreshes them every few seconds
(batches.refresh_estimates) so that a poll reads a column instead of playing the
scheduler: a refresh costs a fixed handful of queries (two per model) plus one
single-row UPDATE per batch whose estimate moved (by 1 s and 1 % of its time to
go), whatever the number of polls.

The model is batches/eta.py (a fluid play of the dispatcher's fair share) under the
deadline policy dispatch applies (batches/deadlines.py). Its inputs, measured here:

- a model's rate, in cost units (a request plus its output tokens) a second: the
  work of its last LAST_CHUNKS finished chunks and of its running ones since the
  earliest of those finished, over the time since then its workers were running at
  least one of them (eta.measured_rate, idle gaps left out), scaled from the
  workers that ran them to the live workers holding the model now. A model that
  no worker holds now (multiplexing) is planned on one worker after a swap (the
  recent swaps' time, fleet.selectors.swap_seconds_estimate).
- each batch's work left on each model: its open chunks' requests not yet done,
  times its cost per request: its own mean so far; before any finished, the
  answer-length prior (eta.answer_prior: what the model's last PRIOR_BATCHES
  finished batches answered for their lines' max_tokens, applied to this batch's
  own, Batch.output_limit_mean); else the model's mean.

The UPDATEs are single-row statements outside any transaction, so they hold no
lock while waiting for another (docs/architecture.md, "Locks")."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db.models import Count, F, Max, Sum
from django.utils import timezone

from batches import deadlines, eta
from batches.dispatch import _model_filter, chunk_model
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus, ModelThroughput
from core.transient import retry_transient
from fleet import selectors as fleet_selectors

# Enough chunks to average over several workers' turns; few enough to follow a
# change of workload within a minute or so.
LAST_CHUNKS = 50
OPEN = (ChunkStatus.PENDING, ChunkStatus.QUEUED, ChunkStatus.RUNNING)
# Finished batches the answer-length prior learns from, per model.
PRIOR_BATCHES = 50
# An estimate that moved less than this, or less than this fraction of the time it
# still has to go, is not written again: a day-long batch's row is not rewritten
# every 5 s for noise.
MOVED = timedelta(seconds=1)
MOVED_FRACTION = 0.01


def model_throughput_measure(*, model: str, live_workers: int,
                             now: datetime) -> ModelThroughput | None:
    """Measure `model`'s rate from its last finished chunks and store it; the last
    stored one (scaled to the live workers) when none finished yet; None if never."""
    rows = list(Chunk.objects.filter(model__in=_model_filter(model), status=ChunkStatus.DONE,
                                     claimed_at__isnull=False, finished_at__isnull=False)
                .order_by("-finished_at")
                .values_list("count", "claimed_at", "finished_at", "worker", "batch__completed",
                             "batch__failed", "batch__usage_output_tokens")[:LAST_CHUNKS])
    finished = len(rows)
    # The chunks running now count with what they did so far: they shared the
    # workers with the finished ones, and leaving them out would take the model for
    # slower than it is (by the work in flight).
    rows += [(done + failed, claimed, now, *rest) for done, failed, claimed, *rest in
             Chunk.objects.filter(model__in=_model_filter(model), status=ChunkStatus.RUNNING,
                                  claimed_at__isnull=False)
             .values_list("completed", "failed", "claimed_at", "worker", "batch__completed",
                          "batch__failed", "batch__usage_output_tokens")[:LAST_CHUNKS]]
    stored = ModelThroughput.objects.filter(model=model).first()
    requests = sum(row[0] for row in rows)
    if not requests:
        return stored
    costs = [eta.request_cost(done + failed, tokens) for *_, done, failed, tokens in rows]
    work = sum(count * cost for (count, *_), cost in zip(rows, costs, strict=True))
    rate = eta.measured_rate([(claimed.timestamp(), finished.timestamp(), count * cost)
                              for (count, claimed, finished, *_), cost
                              in zip(rows, costs, strict=True)])
    if rate is None:
        return stored
    observed = len({row[3] for row in rows}) or 1
    rate *= max(live_workers, 1) / observed
    # One chunk's pace, claim to close: how fast the chunks in flight run out.
    spans = sum((end - start).total_seconds() for _, start, end, *_ in rows[:finished])
    chunk_work = sum(count * cost for (count, *_), cost in zip(rows[:finished], costs,
                                                                strict=False))
    measured, _ = ModelThroughput.objects.update_or_create(model=model, defaults={
        "rate": rate, "cost_per_request": work / requests, "workers": live_workers,
        "chunk_rate": chunk_work / spans if spans > 0 else 0.0, "measured_at": now})
    return measured


def answer_history(model: str) -> list[tuple[float, float, int]]:
    """(mean output limit, output tokens per request, requests) of the model's last
    PRIOR_BATCHES completed batches whose lines named a limit (eta.answer_prior)."""
    rows = (Batch.objects.filter(model=model, status=BatchStatus.COMPLETED, completed__gt=0,
                                 output_limit_mean__isnull=False)
            .order_by("-completed_at")
            .values_list("output_limit_mean", "usage_output_tokens", "completed")[:PRIOR_BATCHES])
    return [(limit, tokens / done, done) for limit, tokens, done in rows]


@dataclass
class Flight:
    """Where a batch's open requests on one model are: not yet claimed by a worker
    (pending or in the broker's window), or in running chunks (the most left in one)."""

    waiting: int = 0
    running_most: int = 0
    queued: int = 0  # of the waiting: published to the broker, not yet claimed
    queued_chunks: int = 0


def open_work(flights: dict | None = None) -> dict[str, dict[str, int]]:
    """Requests not yet done of each running batch, per served model: {model: {batch: n}};
    with `flights`, fills {model: {batch: Flight}} from the same query."""
    left: dict[str, dict[str, int]] = defaultdict(dict)
    rows = (Chunk.objects.filter(status__in=OPEN, batch__status=BatchStatus.IN_PROGRESS)
            .values("batch_id", "model", "status")
            .annotate(left=Sum(F("count") - F("completed") - F("failed")),
                      most=Max(F("count") - F("completed") - F("failed")), chunks=Count("id")))
    for row in rows:
        model, batch_id, count = chunk_model(row["model"]), row["batch_id"], max(row["left"], 0)
        left[model][batch_id] = left[model].get(batch_id, 0) + count
        if flights is not None:
            flight = flights.setdefault(model, {}).setdefault(batch_id, Flight())
            if row["status"] == ChunkStatus.RUNNING:
                flight.running_most = max(flight.running_most, row["most"] or 0)
            else:
                flight.waiting += count
                if row["status"] == ChunkStatus.QUEUED:
                    flight.queued, flight.queued_chunks = count, row["chunks"]
    return left


def window_wait(loads: list[eta.Load], flights: dict[str, Flight], running: list[tuple],
                measured: ModelThroughput) -> float:
    """Seconds until a chunk published now is claimed: the broker's window is first
    in, first out, and each running chunk that closes frees a chunk thread for the
    next one, so it is the (chunks queued + 1)-th close of the running chunks (each
    at one chunk's measured pace); the queued work over the model's rate without a
    pace or running chunks."""
    cost = {load.batch_id: load.cost for load in loads}
    queued = sum(flight.queued_chunks for flight in flights.values())
    closes = sorted(left * cost.get(batch_id, measured.cost_per_request) / measured.chunk_rate
                    for batch_id, left in running) if measured.chunk_rate else []
    if queued < len(closes):
        return closes[queued]
    return sum(flight.queued * cost.get(batch_id, 1.0)
               for batch_id, flight in flights.items()) / measured.rate


def running_chunks() -> dict[str, list[tuple[str, int]]]:
    """Each model's running chunks as (batch, requests left)."""
    found: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for model, batch_id, left in (Chunk.objects.filter(status=ChunkStatus.RUNNING,
                                                       batch__status=BatchStatus.IN_PROGRESS)
                                  .values_list("model", "batch_id", "count")
                                  .annotate(left=F("count") - F("completed") - F("failed"))
                                  .values_list("model", "batch_id", "left")):
        found[chunk_model(model)].append((batch_id, max(left, 0)))
    return found


def batch_seconds(load: eta.Load, played: float, flight: Flight, *, started: bool,
                  wait: float, measured: ModelThroughput) -> float:
    """Seconds until a batch's work on a model is done: the fluid play's answer while
    some of it waits for a worker, after (for a batch none of whose chunks was
    published yet) the chunks already in the broker's window ahead of it; once all
    of it runs, its longest running chunk at one chunk's measured pace (chunks in
    flight keep their worker whatever the shares), never less than that."""
    tail = flight.running_most * load.cost / measured.chunk_rate if measured.chunk_rate else 0.0
    if not flight.waiting:
        return tail
    delay = 0.0 if started else wait
    return max(played + delay, tail)


@retry_transient
def estimates_refresh(now: datetime | None = None) -> int:
    """Refresh every running batch's estimated_completion_at and at_risk; returns
    how many rows moved."""
    now = now or timezone.now()
    batches = {row[0]: row for row in Batch.objects.filter(status=BatchStatus.IN_PROGRESS)
               .values_list("id", "priority", "owner_id", "owner__weight", "expires_at",
                            "completed", "failed", "usage_output_tokens",
                            "estimated_completion_at", "at_risk", "output_limit_mean",
                            "model")}
    histories = {model: answer_history(model) for model in {row[11] for row in batches.values()}}
    live = fleet_selectors.live_workers_by_model()
    finish: dict[str, float | None] = {}
    risky: set[str] = set()
    flights: dict[str, dict[str, Flight]] = {}
    running = running_chunks()
    for model, left in open_work(flights).items():
        measured = model_throughput_measure(model=model, live_workers=live.get(model, 0), now=now)
        loads = [load_of(batches[batch_id], requests, measured, now,
                         histories[batches[batch_id][11]])
                 for batch_id, requests in left.items() if batch_id in batches]
        if measured is None or measured.rate <= 0:
            finish.update((load.batch_id, None) for load in loads)
            continue
        rate = measured.rate
        delay = 0.0 if live.get(model, 0) else fleet_selectors.swap_seconds_estimate()
        played = eta.finish_times(loads, rate,
                                  partial(deadlines.deadline_shares, rate=rate),
                                  worker_rate=rate / max(live.get(model, 0), 1))
        wait = window_wait(loads, flights[model], running.get(model, []), measured)
        for load in loads:
            if deadlines.at_risk(load, rate):
                risky.add(load.batch_id)
            if load.batch_id in finish and finish[load.batch_id] is None:
                continue
            flight, row = flights[model][load.batch_id], batches[load.batch_id]
            started = bool(row[5] + row[6] or flight.running_most or flight.queued)
            seconds = delay + batch_seconds(
                load, played[load.batch_id], flight, started=started,
                wait=wait, measured=measured)
            finish[load.batch_id] = max(finish.get(load.batch_id) or 0.0, seconds)
    moved = 0
    for batch_id, row in batches.items():
        seconds = finish.get(batch_id, 0.0)  # no open work: finalizing next
        estimate = None if seconds is None else now + timedelta(seconds=seconds)
        known, was_at_risk = row[8], row[9]
        if (estimate is None) != (known is None) or was_at_risk != (batch_id in risky) or (
                estimate is not None and abs(estimate - known) >= max(
                    MOVED, (estimate - now) * MOVED_FRACTION)):
            moved += Batch.objects.filter(id=batch_id, status=BatchStatus.IN_PROGRESS).update(
                estimated_completion_at=estimate, at_risk=batch_id in risky)
    return moved


def load_of(row: tuple, requests: int, measured: ModelThroughput | None,
            now: datetime, history: list[tuple[float, float, int]]) -> eta.Load:
    """The ETA model's view of one batch's work on one model (row: the columns
    estimates_refresh reads, the output limit at 10)."""
    batch_id, priority, owner_id, weight, expires_at, completed, failed, tokens = row[:8]
    prior = eta.answer_prior(history, row[10])
    cost = eta.request_cost(completed + failed, tokens, 1.0 + prior if prior is not None
                            else measured.cost_per_request if measured else 1.0)
    return eta.Load(batch_id=batch_id, remaining=requests * cost, priority=priority,
                    owner=owner_id, weight=weight, chunk=settings.BATCHGEN_CHUNK_SIZE * cost,
                    cost=cost,
                    time_left=(expires_at - now).total_seconds())


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
    running batches of `model` under the deadline policy; None while the model's rate
    is unknown (then nothing can be said, and strict admission lets it in)."""
    now = now or timezone.now()
    measured = ModelThroughput.objects.filter(model=model).first()
    if measured is None or measured.rate <= 0:
        return None
    left = open_work().get(model, {})
    rows = {row[0]: row for row in Batch.objects.filter(id__in=list(left))
            .values_list("id", "priority", "owner_id", "owner__weight", "expires_at",
                         "completed", "failed", "usage_output_tokens",
                         "estimated_completion_at", "at_risk", "output_limit_mean")}
    history = answer_history(model)
    loads = [load_of(rows[batch_id], count, measured, now, history)
             for batch_id, count in left.items() if batch_id in rows]
    loads.append(eta.Load(batch_id="", remaining=requests * measured.cost_per_request,
                          priority=priority, owner=owner_id, weight=weight,
                          chunk=settings.BATCHGEN_CHUNK_SIZE * measured.cost_per_request,
                          cost=measured.cost_per_request, time_left=window_seconds))
    rate = measured.rate
    delay = 0.0 if fleet_selectors.live_workers_by_model().get(model) else \
        fleet_selectors.swap_seconds_estimate()
    workers = fleet_selectors.live_workers_by_model().get(model, 0)
    played = eta.finish_times(loads, rate, lambda active: deadlines.deadline_shares(active, rate),
                              worker_rate=rate / max(workers, 1))
    return played[""] + delay
