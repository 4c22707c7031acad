"""Model multiplexing's policy (fleet/residency.py:plan): a pure function of the
figures, so its promises are tested without a database."""

from __future__ import annotations

from fleet.residency import ModelDemand, Reason, WorkerState, plan

POLICY = {"stretch": 300.0, "max_wait": 900.0, "swap_seconds": 40.0}


def worker(name: str, model: str = "", since: float = 0.0, settled: bool = True,
           cannot: frozenset[str] = frozenset()) -> WorkerState:
    return WorkerState(name, model, since, settled, cannot)


def demand(model: str, requests: int, waiting_since: float = 0.0) -> ModelDemand:
    return ModelDemand(model, requests, waiting_since)


def test_an_idle_worker_takes_the_model_that_has_waited_longest():
    decisions = plan([worker("w1")], [demand("b", 10, 50.0), demand("a", 10, 20.0)],
                     now=100.0, **POLICY)
    assert [(d.worker, d.model, d.reason) for d in decisions] == [("w1", "a", Reason.IDLE)]


def test_a_resident_model_keeps_its_worker_within_its_stretch():
    decisions = plan([worker("w1", "a", since=0.0)], [demand("a", 10), demand("b", 10, 10.0)],
                     now=200.0, **POLICY)
    assert decisions == []


def test_a_waiting_model_takes_the_worker_once_the_stretch_ends():
    workers, work = [worker("w1", "a", since=0.0)], [demand("a", 10), demand("b", 10, 10.0)]
    decisions = plan(workers, work, now=301.0, **{**POLICY, "swap_seconds": 5.0})
    assert [(d.model, d.reason) for d in decisions] == [("b", Reason.STRETCH)]
    # a stretch lasts at least ten swaps' time: with 40 s swaps, 400 s
    assert plan(workers, work, now=399.0, **POLICY) == []
    assert plan(workers, work, now=400.0, **POLICY)[0].reason == Reason.STRETCH


def test_the_wait_bound_preempts_within_the_stretch_allowing_for_the_swap():
    # b has waited max_wait - swap_seconds: a swap now makes it resident within the bound
    policy = {**POLICY, "stretch": 10_000.0}
    workers = [worker("w1", "a", since=0.0)]
    assert plan(workers, [demand("a", 10), demand("b", 5, 0.0)], now=859.0, **policy) == []
    decisions = plan(workers, [demand("a", 10), demand("b", 5, 0.0)], now=860.0, **policy)
    assert [(d.model, d.reason) for d in decisions] == [("b", Reason.DEADLINE)]


def test_a_worker_that_is_still_swapping_is_not_taken():
    decisions = plan([worker("w1", "a", since=0.0, settled=False)],
                     [demand("a", 10), demand("b", 5, 0.0)], now=5000.0, **POLICY)
    assert decisions == []


def test_preemption_takes_a_worker_whose_model_another_worker_also_holds():
    workers = [worker("w1", "a", since=0.0), worker("w2", "b", since=10.0),
               worker("w3", "b", since=20.0)]
    decisions = plan(workers, [demand("a", 10), demand("b", 10), demand("c", 5, 0.0)],
                     now=1000.0, **POLICY)
    assert [(d.worker, d.model) for d in decisions] == [("w2", "c")]


def test_a_dry_model_stays_loaded_while_nothing_waits():
    assert plan([worker("w1", "a")], [demand("a", 0)], now=1000.0, **POLICY) == []


def test_an_idle_worker_joins_a_large_queue_but_not_a_small_one():
    workers = [worker("w1", "a"), worker("w2", "b")]
    assert plan(workers, [demand("a", 10_000)], now=1.0, **POLICY)[0].model == "a"
    assert plan(workers, [demand("a", 100)], now=1.0, **POLICY) == []


def test_joining_a_queue_must_save_more_time_than_the_swap_costs():
    # 10 requests/s a worker: 1,000 requests on one worker take 100 s, on two 50 s,
    # which saves 50 s: worth a 40 s swap, not a 60 s one
    workers = [worker("w1", "a"), worker("w2", "b")]
    joins = plan(workers, [demand("a", 1_000)], now=1.0, **{**POLICY, "swap_seconds": 40.0},
                 rate=10.0)
    assert [(d.worker, d.model, d.reason) for d in joins] == [("w2", "a", Reason.SPREAD)]
    assert plan(workers, [demand("a", 1_000)], now=1.0, **{**POLICY, "swap_seconds": 60.0},
                rate=10.0) == []


def simulate_one_worker(work: dict[str, int], *, rate: float, swap: float) -> list[str]:
    """Run the policy against one worker until every model's work is done; the models
    it loaded, in order."""
    now, held, since, loads = 0.0, "", 0.0, []
    left = dict(work)
    while any(left.values()):
        decisions = plan([worker("w1", held, since)],
                         [demand(m, n, 0.0) for m, n in left.items()], now=now, **POLICY)
        if decisions:
            held, since = decisions[0].model, now + swap
            loads.append(held)
            now += swap
        step = min(left[held], rate)
        left[held] -= step
        now += 1.0
    return loads


def test_one_worker_loads_each_model_once_when_all_work_is_submitted_together():
    loads = simulate_one_worker({"chat": 300, "embed": 200, "other": 50}, rate=10, swap=40)
    assert sorted(loads) == ["chat", "embed", "other"]


def test_a_worker_is_never_given_a_model_it_cannot_start_and_another_worker_is():
    cannot = frozenset({"a"})
    workers = [worker("w1", cannot=cannot)]
    assert plan(workers, [demand("a", 10, 0.0)], now=100.0, **POLICY) == []
    decisions = plan(workers, [demand("a", 10, 0.0), demand("b", 10, 50.0)], now=100.0,
                     **POLICY)
    assert [(d.worker, d.model) for d in decisions] == [("w1", "b")]
    both = [worker("w1", cannot=cannot), worker("w2", "c", since=0.0)]
    decisions = plan(both, [demand("a", 10, 0.0), demand("c", 10)], now=5000.0, **POLICY)
    assert [(d.worker, d.model) for d in decisions] == [("w2", "a")]
    # not by preemption, and not to join a large queue either
    busy = [worker("w1", "c", since=0.0, cannot=cannot)]
    assert plan(busy, [demand("a", 10, 0.0), demand("c", 10)], now=5000.0, **POLICY) == []
    idle = [worker("w1", "b", cannot=cannot), worker("w2", "a")]
    assert plan(idle, [demand("a", 10_000)], now=1.0, **POLICY) == []
