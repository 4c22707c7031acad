"""ETA accuracy and completion windows kept (issue 36), on a discrete-event model of
the fleet, driven by the deadline policy the server runs (batches/deadlines.py) and
batches/eta.py's fluid play (finish_times), the policy's own view of the future. The
server's ETA is the chunk play (eta.chunk_finish_times), whose fleet to play is the
real one: benchmarks/eta.py measures it there. Use this to check the policy.

What is simulated, and what is not: N workers, each running up to `--chunks-per-worker`
chunks of 200 requests at once, each request costing its output tokens times a
per-token latency plus a prefill cost the estimator does not see (prompt tokens x
--prefill-weight), the worker's speed shared among its running chunks; a
dispatcher that gives each free chunk thread the next chunk by stride scheduling
over the same shares as batches/dispatch.py (and, with the policy on, the deadline
policy's shares); progress counted per request, as the workers' flushes do; the
estimate refresh every 5 s. Not simulated: processes, the database, the broker
(benchmarks/fleet.py measures those); so these figures are the model's accuracy
against a scheduler that behaves as the model assumes, with the workload's
unseen costs (prompt lengths, varied output lengths, chunk granularity, arrivals)
as its only sources of error.

    .venv/bin/python benchmarks/eta_model.py                  # both scenarios, 3 seeds
    .venv/bin/python benchmarks/eta_model.py --quick          # smaller batches, one seed
    .venv/bin/python benchmarks/eta_model.py --forecast 300 --results eta_model-forecast-300
                        # a trial: the last 300 s of arrivals foreseen to come again

Reported: for every batch, the ETA's relative error (|ETA - real completion| / (real
completion - time of the estimate)) while still queued and at 10 %, 25 % and 50 % of
its requests done, median and p90 (goal: 25 %, 15 %, 10 %, 5 % median); and for the
deadline scenario, the windows kept of the windows feasible with the policy on and
off (goal: 100 % on).
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import mark_start, print_table, write_results  # noqa: E402

from batches.deadlines import deadline_shares  # noqa: E402
from batches.eta import Load, fair_shares, finish_times, measured_rate, request_cost  # noqa: E402

CHUNK = 200
THREADS = 4  # chunk threads a worker runs at once
REFRESH = 5.0
LAST_CHUNKS = 50
CHECKPOINTS = (0.10, 0.25, 0.50)
GOALS = {"queued": 0.25, "10%": 0.15, "25%": 0.10, "50%": 0.05}


@dataclass
class SimBatch:
    id: str
    owner: int
    arrive: float
    window: float
    outputs: list[int]  # output tokens per request
    prompts: list[int]
    chunks: list[tuple[int, int]] = field(default_factory=list)  # (start, count) pending
    done: float = 0.0  # requests done (fractional: progress within chunks)
    out_done: float = 0.0  # output tokens of the requests done
    passed: float = 0.0
    finished: float | None = None
    estimates: dict[str, tuple[float, float]] = field(default_factory=dict)  # point -> (at, eta)

    @property
    def total(self) -> int:
        return len(self.outputs)


@dataclass
class Running:
    batch: SimBatch
    count: int
    work: float  # seconds of a whole worker
    left: float
    outputs: int
    claimed: float


class Fleet:
    def __init__(self, *, workers: int, threads: int, token_seconds: float,
                 prefill_weight: float, policy: bool, forecast: float = 0.0,
                 foresee: str = "replay") -> None:
        self.workers, self.threads = workers, threads
        self.forecast, self.foresee = forecast, foresee
        self.token_seconds, self.prefill_weight, self.policy = token_seconds, prefill_weight, policy
        self.running: list[list[Running]] = [[] for _ in range(workers)]
        self.finished_chunks: list[tuple[float, float, int, str, int]] = []
        self.batches: list[SimBatch] = []
        self.now = 0.0
        self.rate: float | None = None
        self.cost_per_request = 1.0

    # --- the rate, as batches/estimates.py measures it -------------------------------
    def measure(self) -> None:
        last = self.finished_chunks[-LAST_CHUNKS:] + [
            (run.claimed, self.now, run.count * (1 - run.left / run.work), run.batch.id, worker)
            for worker, chunks in enumerate(self.running) for run in chunks]
        if not sum(count for _, _, count, _, _ in last):
            return
        by_id = {b.id: b for b in self.batches}
        costs = [count * request_cost(round(by_id[bid].done), round(by_id[bid].out_done))
                 for _, _, count, bid, _ in last]
        rate = measured_rate([(start, end, cost) for (start, end, *_), cost
                              in zip(last, costs, strict=True)])
        if rate is None:
            return
        observed = len({worker for *_, worker in last})
        self.rate = rate * self.workers / observed
        self.cost_per_request = sum(costs) / sum(count for _, _, count, _, _ in last)

    def loads(self) -> list[Load]:
        loads = []
        for batch in self.active():
            cost = request_cost(round(batch.done), round(batch.out_done), self.cost_per_request)
            loads.append(Load(batch_id=batch.id, remaining=(batch.total - batch.done) * cost,
                              owner=batch.owner, time_left=batch.arrive + batch.window - self.now,
                              chunk=CHUNK * cost, cost=cost, created=batch.arrive))
        return loads

    def active(self) -> list[SimBatch]:
        return [b for b in self.batches if b.arrive <= self.now and b.finished is None]

    def refresh(self) -> None:
        self.measure()
        if not self.rate:
            return
        rate = self.rate
        played = finish_times(self.loads(), rate, partial(self.play_shares, rate=rate),
                              worker_rate=rate / self.workers,
                              arrivals=self.arrivals_ahead() if self.forecast else ())
        for batch in self.active():
            eta = self.now + played[batch.id]
            fraction = batch.done / batch.total
            if batch.done == 0 and "queued" not in batch.estimates:
                batch.estimates["queued"] = (self.now, eta)
            for point in CHECKPOINTS:
                key = f"{int(point * 100)}%"
                if fraction >= point and key not in batch.estimates:
                    batch.estimates[key] = (self.now, eta)

    def play_shares(self, active: list[Load], rate: float) -> dict[str, float]:
        """The shares the ETA plays with; a `hold` stand-in gets next to none while
        its key has a batch of its own."""
        owners = {load.owner for load in active if not load.batch_id.startswith("hold-")}
        use = [load for load in active
               if not load.batch_id.startswith("hold-") or load.owner not in owners]
        split = deadline_shares(use, rate) if self.policy else fair_shares(use)
        return {load.batch_id: split.get(load.batch_id, 1e-12) for load in active}

    def arrivals_ahead(self) -> list[tuple[float, Load]]:
        """The `--forecast` trial. `replay`: the batches that arrived over the last
        `forecast` seconds (or since the start, if sooner) arrive again as long after
        now, each of its key and its size at the fleet's mean cost per request.
        `keys`: each key with no batch now but one running over the last `forecast`
        seconds is there now with a batch of its recent batches' mean size (it keeps
        its share, as if it came back). `hold`: each key with a batch over those
        seconds, busy now or not, has such a batch that runs once its own are done
        (play_shares): it holds its share after them, as a key that keeps sending."""
        span = min(self.forecast, self.now)
        cost = self.cost_per_request
        if self.foresee in ("keys", "hold"):
            busy = {batch.owner for batch in self.active()} if self.foresee == "keys" else set()
            sizes: dict[int, list[int]] = {}
            for batch in self.batches:
                if batch.owner not in busy and batch.arrive <= self.now \
                        and (batch.finished or self.now) > self.now - span:
                    sizes.setdefault(batch.owner, []).append(batch.total)
            return [(0.0, Load(batch_id=f"{self.foresee}-{owner}",
                               remaining=statistics.mean(totals) * cost,
                               owner=owner, chunk=CHUNK * cost, cost=cost))
                    for owner, totals in sizes.items()]
        return [(batch.arrive + span - self.now,
                 Load(batch_id=f"again-{batch.id}", remaining=batch.total * cost,
                      owner=batch.owner, chunk=CHUNK * cost, cost=cost))
                for batch in self.batches
                if span > 0 and self.now - span < batch.arrive <= self.now]

    # --- the dispatcher ------------------------------------------------------------
    def shares(self) -> dict[str, float]:
        waiting = [b for b in self.active() if b.chunks]
        loads = [load for load in self.loads() if any(b.id == load.batch_id for b in waiting)]
        if self.policy and self.rate and len(loads) > 1:
            return deadline_shares(loads, self.rate)
        return fair_shares(loads)

    def dispatch(self) -> None:
        for worker in range(self.workers):
            while len(self.running[worker]) < self.threads:
                waiting = [b for b in self.active() if b.chunks]
                if not waiting:
                    return
                shares = self.shares()
                batch = min(waiting, key=lambda b: (b.passed, b.arrive, b.id))  # as dispatch
                start, count = batch.chunks.pop(0)
                outputs = sum(batch.outputs[start:start + count])
                prompts = sum(batch.prompts[start:start + count])
                work = (outputs + count + prompts * self.prefill_weight) * self.token_seconds
                self.running[worker].append(Running(batch, count, work, work, outputs, self.now))
                batch.passed += count / shares[batch.id]

    def arrive(self, batch: SimBatch) -> None:
        low = [b.passed for b in self.active() if b.chunks]
        batch.passed = min(low, default=0.0)
        batch.chunks = [(start, min(CHUNK, batch.total - start))
                        for start in range(0, batch.total, CHUNK)]

    def advance(self, until: float) -> None:
        """Run the workers until `until`, chunk completions as they come."""
        while True:
            step, where = until - self.now, None
            for worker, chunks in enumerate(self.running):
                for run in chunks:
                    need = run.left * len(chunks)
                    if need < step:
                        step, where = need, (worker, run)
            for chunks in self.running:
                for run in chunks:
                    spent = step / len(chunks)
                    fraction = spent / run.work
                    run.left -= spent
                    run.batch.done += run.count * fraction
                    run.batch.out_done += run.outputs * fraction
            self.now += step
            if where is None:
                return
            worker, run = where
            self.running[worker].remove(run)
            self.finished_chunks.append((run.claimed, self.now, run.count, run.batch.id, worker))
            batch = run.batch
            if not batch.chunks and not any(r.batch is batch for c in self.running for r in c):
                batch.done, batch.finished = batch.total, self.now
            self.dispatch()


def simulate(batches: list[SimBatch], **options) -> Fleet:
    fleet = Fleet(**options)
    fleet.batches = batches
    arrivals = sorted(batches, key=lambda b: b.arrive)
    events = [(b.arrive, 0, i) for i, b in enumerate(arrivals)]
    heapq.heapify(events)
    tick = 0.0
    while any(b.finished is None for b in batches):
        next_arrival = events[0][0] if events else float("inf")
        tick += REFRESH
        target = min(tick, next_arrival)
        fleet.advance(target)
        while events and events[0][0] <= fleet.now:
            _, _, index = heapq.heappop(events)
            fleet.arrive(arrivals[index])
            fleet.dispatch()
        if target == next_arrival:
            tick -= REFRESH  # the refresh is still due at its time
            continue
        fleet.refresh()
    return fleet


def lengths(rng: random.Random, n: int, mean_out: int) -> tuple[list[int], list[int]]:
    outputs = [max(1, int(rng.lognormvariate(0, 0.6) * mean_out)) for _ in range(n)]
    prompts = [rng.randint(20, 400) for _ in range(n)]
    return outputs, prompts


def mixed_workload(rng: random.Random, count: int, largest: int, keys: int = 3,
                   arrivals: float = 600.0) -> list[SimBatch]:
    batches = []
    for i in range(count):
        size = int(round(10 ** rng.uniform(math.log10(50), math.log10(largest))))
        size = max(50, min(largest, size))
        outputs, prompts = lengths(rng, size, rng.choice([30, 100, 300]))
        batches.append(SimBatch(id=f"b{i:02d}", owner=i % keys, arrive=rng.uniform(0, arrivals),
                                window=86400, outputs=outputs, prompts=prompts))
    return batches


def errors(batches: list[SimBatch]) -> dict[str, list[float]]:
    """Each point's signed errors, (ETA - end) / time left."""
    found: dict[str, list[float]] = {key: [] for key in GOALS}
    for batch in batches:
        for key, (at, eta) in batch.estimates.items():
            left = batch.finished - at
            if left > REFRESH:  # an estimate made within a refresh of the end says nothing
                found[key].append((eta - batch.finished) / left)
    return found


def p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def accuracy(args) -> dict:
    pooled: dict[str, list[float]] = {key: [] for key in GOALS}
    signed: dict[str, list[float]] = {key: [] for key in GOALS}
    for seed in range(args.seeds):
        rng = random.Random(seed)
        for workers in (2, 4):
            batches = mixed_workload(rng, args.batches, args.largest, args.keys, args.arrivals)
            simulate(batches, workers=workers, threads=THREADS,
                     token_seconds=args.token_seconds, prefill_weight=args.prefill_weight,
                     policy=True, forecast=args.forecast, foresee=args.foresee)
            for key, values in errors(batches).items():
                signed[key].extend(values)
                pooled[key].extend(abs(error) for error in values)
    rows = [[key, len(values), statistics.median(values) if values else float("nan"),
             p(values, 0.9), GOALS[key], statistics.median(signed[key]) if values else None]
            for key, values in pooled.items()]
    print_table(f"ETA relative error (all seeds, 2 and 4 workers; foreseen: {args.foresee} "
                f"over {args.forecast:.0f} s)" if args.forecast else
                "ETA relative error (all seeds, 2 and 4 workers)",
                ["point", "estimates", "median", "p90", "goal (median)", "signed median"], rows)
    return {key: {"n": len(v), "median": statistics.median(v) if v else None, "p90": p(v, 0.9),
                  "signed_median": statistics.median(signed[key]) if v else None}
            for key, v in pooled.items()}


def deadlines(args) -> dict:
    """Three long 24 h batches, then a short-window batch behind them."""
    results = {}
    for policy in (False, True):
        kept = feasible = 0
        detail = []
        for seed in range(args.seeds):
            rng = random.Random(100 + seed)
            long = []
            for i in range(3):
                outputs, prompts = lengths(rng, args.long_requests, 100)
                long.append(SimBatch(id=f"long{i}", owner=i, arrive=0.0, window=86400,
                                     outputs=outputs, prompts=prompts))
            outputs, prompts = lengths(rng, args.short_requests, 100)
            work = (sum(outputs) + len(outputs) + args.prefill_weight * sum(prompts)) \
                * args.token_seconds
            # Feasible: --short-slack times what the batch takes with the whole
            # fleet, plus a chunk's time for a chunk thread to free up; short of
            # its fair quarter share.
            chunk_time = work / len(outputs) * CHUNK * THREADS
            short = SimBatch(id="short", owner=3, arrive=60.0,
                             window=args.short_slack * work / args.workers + chunk_time,
                             outputs=outputs, prompts=prompts)
            batches = [*long, short]
            simulate(batches, workers=args.workers, threads=THREADS,
                     token_seconds=args.token_seconds, prefill_weight=args.prefill_weight,
                     policy=policy)
            for batch in batches:
                feasible += 1
                ok = batch.finished <= batch.arrive + batch.window
                kept += ok
                detail.append({"batch": batch.id, "seed": seed, "window": batch.window,
                               "took": batch.finished - batch.arrive, "kept": ok})
        results["on" if policy else "off"] = {"kept": kept, "feasible": feasible,
                                              "batches": detail}
    rows = [[name, r["kept"], r["feasible"], 100.0 * r["kept"] / r["feasible"],
             ", ".join(f"{d['batch']}:{d['took']:.0f}/{d['window']:.0f}s" for d in r["batches"]
                       if d["batch"] == "short")]
            for name, r in results.items()]
    print_table("Windows kept of windows feasible (short batch: took/window)",
                ["policy", "kept", "feasible", "%", "short"], rows)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--largest", type=int, default=50_000)
    parser.add_argument("--keys", type=int, default=3, help="keys the batches take turns on")
    parser.add_argument("--arrivals", type=float, default=600.0,
                        help="the batches arrive over these seconds")
    parser.add_argument("--token-seconds", type=float, default=0.001,
                        help="a worker's seconds per output token (its whole speed)")
    parser.add_argument("--prefill-weight", type=float, default=0.02,
                        help="cost of a prompt token against an output token (unseen)")
    parser.add_argument("--workers", type=int, default=4, help="workers (deadline scenario)")
    parser.add_argument("--forecast", type=float, default=0.0,
                        help="a trial: the ETA's play takes the batches that arrived over the "
                             "last FORECAST seconds to arrive again as long after now "
                             "(0: no arrivals foreseen, as the server plays)")
    parser.add_argument("--foresee", choices=["replay", "keys", "hold"], default="replay",
                        help="with --forecast: the arrivals replayed; each key idle now but "
                             "busy over those seconds taken to be back now; or each key busy "
                             "over those seconds holding its share after its batches end")
    parser.add_argument("--results", default="eta_model")
    parser.add_argument("--long-requests", type=int, default=10_000)
    parser.add_argument("--short-requests", type=int, default=4_000)
    parser.add_argument("--short-slack", type=float, default=1.5,
                        help="the short window: this times its work on the whole fleet, "
                             "plus a chunk's time")
    args = parser.parse_args()
    mark_start()
    if args.quick:
        args.seeds, args.largest, args.long_requests = 1, 5_000, 2_000
    results = {"accuracy": accuracy(args), "deadlines": deadlines(args),
               "options": vars(args)}
    write_results(args.results, results)


if __name__ == "__main__":
    main()
