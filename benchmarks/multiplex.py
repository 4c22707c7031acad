"""Model multiplexing's throughput (issue 27): W workers serving M models through the
residency policy, against the pinned layout with the same W workers and against the
ideal (the same work with swaps that cost nothing: W workers busy until the end).
Each layout's first loads are left out of all three (every layout pays them once).

This is a simulation of the workers, not a run of real processes: the decisions are
made by the real policy (`fleet.residency.plan`, the function the control worker
runs every second), ticking once a second, while each worker runs `--rate` requests a
second of the model it holds and a swap costs `--swap-seconds` (stop + start, no
request runs meanwhile). Every batch is submitted at the start, each model's queue
holding `--minutes` of one worker's work. The swap costs to try are measured ones:
about 40 s for a vLLM stop and start on this 2-core CPU (SmolLM2 or MiniLM; the
real-engine e2e and docs/benchmarks.md), a few seconds for a wake-up from vLLM's
sleep mode on a GPU (a copy of the weights from host memory, docs/deployment.md).

    .venv/bin/python benchmarks/multiplex.py                   # 2, 4, 8 models on 2 workers
    .venv/bin/python benchmarks/multiplex.py --swap-seconds 40 --minutes 3,10
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, mark_start, print_table, write_results  # noqa: E402

sys.path.insert(0, str(ROOT))


def _plan():
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batchgen_site.settings")
    django.setup()
    from fleet import residency

    return residency


@dataclass
class SimWorker:
    name: str
    model: str = ""
    since: float = 0.0
    ready_at: float = 0.0  # the swap's end


def simulate(*, workers: int, models: int, minutes: float, rate: float, swap: float,
             stretch: float, max_wait: float, tick: float = 1.0) -> dict:
    """Run the policy until every queue is empty: makespan, swaps, loads, and the
    longest any model waited for its first residency."""
    residency = _plan()
    names = [f"model{i}" for i in range(models)]
    left = {name: minutes * 60 * rate for name in names}
    evicted: dict[str, float] = {}
    first_resident: dict[str, float] = {}
    fleet = [SimWorker(f"w{i}") for i in range(workers)]
    now, swaps, loads = 0.0, 0, 0
    while any(n > 0 for n in left.values()):
        states = [residency.WorkerState(w.name, w.model, w.since, settled=now >= w.ready_at)
                  for w in fleet]
        demand = [residency.ModelDemand(m, int(round(n)), evicted.get(m, 0.0))
                  for m, n in left.items() if n > 0]
        for decision in residency.plan(states, demand, now=now, stretch=stretch,
                                       max_wait=max_wait, swap_seconds=swap, rate=rate):
            worker = next(w for w in fleet if w.name == decision.worker)
            if worker.model:
                swaps += 1
                evicted[worker.model] = now
            else:
                loads += 1
            worker.model, worker.since, worker.ready_at = decision.model, now, now + swap
        for worker in fleet:
            if worker.model and now >= worker.ready_at and left[worker.model] > 0:
                first_resident.setdefault(worker.model, now)
                left[worker.model] = max(left[worker.model] - rate * tick, 0.0)
        now += tick
    total = models * minutes * 60 * rate
    ideal = total / (workers * rate)
    # Every layout loads its first models before any request runs, the pinned one
    # too: that first load is left out of the makespan, as it is of the ideal's and
    # the pinned layout's, so the ratio counts what multiplexing adds (its swaps).
    after_start = now - swap
    return {"workers": workers, "models": models, "minutes_per_model": minutes,
            "swap_seconds": swap, "makespan_seconds": now, "ideal_seconds": ideal,
            "vs_ideal": round(ideal / after_start, 3), "swaps": swaps, "loads": loads,
            "longest_wait_for_residency": max(first_resident.values()),
            # Pinned, the same W workers: with M > W, W models have a worker each and
            # the others never run, so it does W/M of the ideal's work (its own start
            # aside, as the ideal's); with M <= W, all of it.
            "pinned_models_served": min(workers, models),
            "pinned_vs_ideal": round(min(workers, models) / models, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--models", default="2,4,8")
    parser.add_argument("--minutes", default="3,10", help="one worker's minutes of work "
                        "in each model's queue")
    parser.add_argument("--swap-seconds", default="40,5", help="a swap's cost: 40 s for a "
                        "CPU vLLM stop and start here, 5 s for a GPU sleep-mode wake-up")
    parser.add_argument("--rate", type=float, default=20.0, help="requests a second a worker")
    parser.add_argument("--stretch", type=float, default=300.0)
    parser.add_argument("--max-wait", type=float, default=900.0)
    args = parser.parse_args()
    mark_start()
    runs = [simulate(workers=args.workers, models=m, minutes=minutes, rate=args.rate, swap=s,
                     stretch=args.stretch, max_wait=args.max_wait)
            for s in map(float, args.swap_seconds.split(","))
            for minutes in map(float, args.minutes.split(","))
            for m in map(int, args.models.split(","))]
    print_table(f"multiplexing {args.workers} workers (simulated workers, the real policy; "
                f"stretch {args.stretch:g} s, bound {args.max_wait:g} s)",
                ["swap s", "min/model", "models", "vs ideal", "swaps", "loads",
                 "longest wait s", "pinned serves", "pinned vs ideal"],
                [[r["swap_seconds"], r["minutes_per_model"], r["models"], r["vs_ideal"],
                  r["swaps"], r["loads"], r["longest_wait_for_residency"],
                  f"{r['pinned_models_served']}/{r['models']}",
                  r["pinned_vs_ideal"]] for r in runs])
    write_results("multiplex", {"settings": vars(args), "runs": runs})


if __name__ == "__main__":
    main()
