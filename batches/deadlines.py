"""The deadline policy: which share of a model's workers each batch gets when some
batch would miss its completion window under fair share.

Promise (`deadline_shares`, pure, over the frozen `eta.Load`s of one model):

1. While every batch finishes inside its window under fair share (the ETA model's
   play, batches/eta.py), the shares are the fair shares, unchanged.
2. Otherwise each batch that keeps its window under fair share is held to the share
   that still finishes it in time at a steady pace (`needed`: remaining work over
   the model's rate times its time left; nothing for a batch without a window), and
   the batches that would miss are served least slack first (time left minus the
   time their work takes with the whole model): each gets the steady share that
   finishes it in time if what the others are held to leaves room for it, else
   nothing is set aside for it (it cannot be saved without breaking another
   window: "where capacity allows"), and it is shown `at_risk` when even the
   whole model could not finish it in time.
3. What is left over goes to the batches that would miss their windows, by their
   fair shares (for those being saved, a margin for what a steady pace does not
   see: a chunk thread to free up first, the chunks already running). No batch
   starves (every share stays at 1 % of its fair share or more), and the windows
   kept under fair share are still kept (each is held to what keeps it).
4. The shares returned sum to the fair shares' sum (dispatch's passes keep their
   scale), and the answer depends only on the loads and the rate.

A batch takes share only from batches that keep their windows, never from another
that would miss one with less slack. Dispatch (batches/dispatch.py) applies it on
each model's race for its window; the ETA model plays it forward for the ETAs.
"""

from __future__ import annotations

from collections.abc import Sequence

from batches.eta import Load, fair_finish_times, fair_shares

# A share below this fraction of its fair share is lifted to it: no batch starves.
FLOOR = 0.01


def needed(load: Load, rate: float) -> float:
    """The fraction of the model a batch needs at a steady pace to finish by its
    window's end (0 without a window; above 1 when even the whole model is too
    slow; infinite once its window has passed)."""
    if load.time_left is None or load.remaining <= 0:
        return 0.0
    if load.time_left <= 0:
        return float("inf")
    return load.remaining / (rate * load.time_left)


def late(loads: Sequence[Load], rate: float) -> set[str]:
    """The batches that miss their windows under fair share."""
    finish = fair_finish_times(loads, rate)
    return {load.batch_id for load in loads
            if load.time_left is not None and finish.get(load.batch_id, 0.0) > load.time_left}


def deadline_shares(loads: Sequence[Load], rate: float) -> dict[str, float]:
    """Each batch's share of the model (see the module's promise)."""
    fair = fair_shares(loads)
    if rate <= 0 or not loads:
        return fair
    missing = late(loads, rate)
    if not missing:
        return fair
    # Fractions of the model's cost units: dispatch shares requests, so a batch's
    # part of the workers' time is its share times its cost per request.
    cost = {load.batch_id: load.cost for load in loads}
    fair_total = sum(fair.values())
    weighted = sum(share * cost[batch_id] for batch_id, share in fair.items())
    fraction = {batch_id: share * cost[batch_id] / weighted for batch_id, share in fair.items()}
    given = {load.batch_id: needed(load, rate) for load in loads
             if load.batch_id not in missing}
    budget = 1.0 - sum(given.values())
    by_slack = sorted((load for load in loads if load.batch_id in missing),
                      key=lambda load: (load.time_left - load.remaining / rate, load.batch_id))
    for load in by_slack:
        want = needed(load, rate)
        if want <= budget:
            given[load.batch_id] = want
            budget -= want
        else:
            given[load.batch_id] = 0.0  # it shares what is left over
    # The rest goes to the batches that would miss their windows, so those being
    # saved finish with a margin for what the steady pace does not see (a chunk
    # thread to free up first, the chunks already running), and those that cannot
    # be saved miss by as little as the others' windows allow.
    saved = missing
    saved_total = sum(fraction[batch_id] for batch_id in saved)
    leftover = max(budget, 0.0)
    shares = {load.batch_id: max(given[load.batch_id] + (leftover * fraction[load.batch_id]
                                                         / saved_total
                                                         if load.batch_id in saved else 0.0),
                                 FLOOR * fraction[load.batch_id]) for load in loads}
    # Back to request shares for dispatch, with the fair shares' sum.
    shares = {batch_id: share / cost[batch_id] for batch_id, share in shares.items()}
    total = sum(shares.values())
    return {batch_id: share / total * fair_total for batch_id, share in shares.items()}


def at_risk(load: Load, rate: float) -> bool:
    """A batch that cannot meet its window even with the whole model."""
    return load.time_left is not None and load.remaining > 0 and needed(load, rate) > 1.0
