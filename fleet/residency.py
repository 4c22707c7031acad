"""Model multiplexing's policy: which model each multiplexing inference worker is
to hold next, as a pure function of the figures (`plan`, over frozen dataclasses).

Who runs it: one decider, `batches/residency.py:residency_decide`, on the control
worker's beat every second; it reads the figures (batches' open chunks, these
records) and writes the decisions to the Residency rows. Workers obey
(inference/swap.py): they never choose a model themselves. The policy is here, below
`batches`, so that the decider and benchmarks/multiplex.py run the same function.

The policy, in order:

1. A model with open requests and no worker assigned *waits*; its wait began when its
   oldest open batch started running, or when the model was last taken off a worker,
   whichever is later. Waiting models are served longest wait first.
2. A worker that holds nothing, or a model that ran dry (no open request), takes the
   longest-waiting model. A worker whose model ran dry and for which nothing waits
   keeps its model loaded: a later batch of it costs no swap.
3. A waiting model takes a busy worker when that worker's stretch has ended
   (BATCHGEN_MODEL_STRETCH_SECONDS since its model became resident, but never less
   than MIN_STRETCH_SWAPS swaps' time, so swapping takes at most about a tenth of a
   worker's time however costly a swap is here) or when the
   model's wait reaches its deadline (BATCHGEN_MAX_MODEL_WAIT_SECONDS less what a
   swap takes), whatever the stretch. Of the candidates it takes first a worker whose
   model another worker also holds (that model stays resident), then the longest
   stretch.
4. A worker left idle joins the model with the most open requests per worker when
   that pays for its swap: the time the model's queue takes drops by more than a
   swap costs (measured from the workers' rate; SPREAD_MIN_REQUESTS before any rate
   is known). A second worker on a large batch, not on its last few chunks.

A worker is never given a model whose engine it found can never start with its
settings (Residency.cannot_start, written by the worker: inference/swap.py); a model
no live worker can start is given to none, and its batches fail with
`model_unavailable` at BATCHGEN_MODEL_UNAVAILABLE_SECONDS (batches/availability.py).

What it promises: with one worker and every batch submitted together, each model with
work becomes resident once (as many loads as models, one swap fewer), as long as each
model's work fits in a stretch; and no model waits longer than the bound for a worker,
as long as the bound exceeds what the swaps ahead of it take (docs/architecture.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# An idle worker joins a model already resident elsewhere only for this much work per
# worker: a swap for a few requests' worth would cost more than it gains.
SPREAD_MIN_REQUESTS = 400
# A stretch lasts at least this many swaps' time: swaps then cost at most 1/11 of a
# busy worker's time (benchmarks/multiplex.py: >= 0.9x the ideal).
MIN_STRETCH_SWAPS = 10
# A swap's cost before any has been measured (a CPU vLLM stop and start, measured).
DEFAULT_SWAP_SECONDS = 40.0


class Reason(enum.StrEnum):
    IDLE = "idle"  # the worker held nothing, or a model with no open request
    STRETCH = "stretch"  # the resident model's stretch ended while another waited
    DEADLINE = "deadline"  # the waiting model reached its wait bound
    SPREAD = "spread"  # an idle worker joins a large queue


@dataclass(frozen=True, slots=True)
class WorkerState:
    name: str
    model: str  # assigned ("" none)
    since: float  # when the assignment was made (seconds, epoch)
    settled: bool  # it holds its assigned model with its engine ready
    # Models whose engine can never start on it (Residency.cannot_start): never given it.
    cannot: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ModelDemand:
    model: str
    requests: int  # open requests (pending, queued or running)
    waiting_since: float  # see the module docstring, 1.


@dataclass(frozen=True, slots=True)
class Decision:
    worker: str
    model: str
    reason: Reason


def plan(workers: list[WorkerState], demand: list[ModelDemand], *, now: float,
         stretch: float, max_wait: float, swap_seconds: float,
         rate: float | None = None) -> list[Decision]:
    """What each worker that must change model is to hold next (the policy above)."""
    open_requests = {d.model: d.requests for d in demand if d.requests > 0}
    assigned = {w.name: w.model for w in workers}
    stretch = max(stretch, MIN_STRETCH_SWAPS * swap_seconds)
    waiting = sorted((d for d in demand if d.requests > 0 and d.model not in assigned.values()),
                     key=lambda d: (d.waiting_since, d.model))
    decisions: list[Decision] = []

    def assign(worker: WorkerState, model: str, reason: Reason) -> None:
        assigned[worker.name] = model
        decisions.append(Decision(worker.name, model, reason))

    idle = sorted((w for w in workers if w.model not in open_requests),
                  key=lambda w: (w.model != "", w.since, w.name))
    for worker in idle:
        model = next((d for d in waiting if d.model not in worker.cannot), None)
        if model is not None:
            waiting.remove(model)
            assign(worker, model.model, Reason.IDLE)
    for model in waiting:
        deadline = now - model.waiting_since >= max(max_wait - swap_seconds, 0)
        worker = _preemptible([w for w in workers if model.model not in w.cannot], assigned,
                              open_requests, now=now, stretch=stretch, deadline=deadline)
        if worker is not None:
            assign(worker, model.model, Reason.DEADLINE if deadline and
                   now - worker.since < stretch else Reason.STRETCH)
    for worker in idle:
        if assigned[worker.name] != worker.model:
            continue
        target = _worth_joining(open_requests, assigned, swap_seconds=swap_seconds, rate=rate)
        if target is not None and target != worker.model and target not in worker.cannot:
            assign(worker, target, Reason.SPREAD)
    return decisions


def _preemptible(workers: list[WorkerState], assigned: dict[str, str],
                 open_requests: dict[str, int], *, now: float, stretch: float,
                 deadline: bool) -> WorkerState | None:
    """The busy worker a waiting model may take (3. above), or None."""
    holders: dict[str, int] = {}
    for model in assigned.values():
        holders[model] = holders.get(model, 0) + 1
    candidates = [w for w in workers
                  if w.settled and assigned[w.name] == w.model and w.model in open_requests
                  and (deadline or now - w.since >= stretch)]
    if not candidates:
        return None
    return min(candidates, key=lambda w: (holders[w.model] < 2, w.since, w.name))


def _worth_joining(open_requests: dict[str, int], assigned: dict[str, str], *,
                   swap_seconds: float, rate: float | None) -> str | None:
    """The model with the most open requests per worker, if one more worker on it
    saves more time than its swap costs (`rate`: requests a second one worker runs):
    with h workers, N requests take N/(h·rate) s, with h+1 a swap plus N/((h+1)·rate)."""
    holders: dict[str, int] = {}
    for model in assigned.values():
        holders[model] = holders.get(model, 0) + 1
    best = max(open_requests, default=None,
               key=lambda m: (open_requests[m] / (holders.get(m, 0) + 1), m))
    if best is None:
        return None
    held = holders.get(best, 0)
    if rate and held:
        saved = open_requests[best] / rate * (1 / held - 1 / (held + 1))
        return best if saved > swap_seconds else None
    return best if open_requests[best] / (held + 1) >= SPREAD_MIN_REQUESTS else None
