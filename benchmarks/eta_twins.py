"""How repeatable a recorded workload is: the same seed run twice, each run's time
from a point to a batch's end against its twin's, and whether the ETA errs the same
way in both.

Two runs of one seed create the same batches of the same lines at the same moments
(benchmarks/eta.py --seed); what differs is how the engine's steps fell, and what
that did to the schedule (which batch's chunk the dispatcher sent first when a batch
came, ties between passes broken by the batches' random ids in the runs kept, which
dispatch now breaks by creation). So a batch's time from
its 50 % reading to its end in one run, taken as the prediction of that time in the
other, is a predictor that knows the whole workload and every batch created after
the reading, but not the run's own state. Where the twins' times agree (their
schedules did not part), an ETA's error is the model's, and it should repeat batch
by batch; where they part, the workload itself is not repeatable and one run's
figures say little of the next's.

Each point's reading is the first poll at or after it (queued: the first poll), as
benchmarks/eta.py reads the API's ETA; the error is |D_twin - D| / D, D the seconds
from the reading to `completed_at`, read both ways round for each pair, as is and
with the twin's times scaled by the pair's speed (the median ratio of the batches'
create-to-end times: over 1, the first run slower; hindsight, for runs on machines
of different speeds). Beside it, the API's ETA error at the same readings
(eta.errors), and the rank correlation of its signed errors at 50 % between the
twins.

    .venv/bin/python benchmarks/eta_twins.py \\
        --twins benchmarks/results/eta-recordings/twin-{a,b}-s8 \\
        --twins benchmarks/results/eta-recordings/twin-{a,b}-s10 \\
        --twins benchmarks/results/eta-recordings/twin-{a,b}-s11   # the runs of 2026-12-07
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import mark_start, print_table, write_results  # noqa: E402
from eta import (  # noqa: E402
    MIN_LEFT,
    POINTS,
    Watched,
    errors,
    median,
    read_polls,
    readings,
    run_interval,
    scored,
)
from eta_replay import recording_file  # noqa: E402


def left_at_points(batch: Watched) -> dict[str, float]:
    """Seconds from each point's reading (the first poll at or after it; queued: the
    first poll with nothing done) to the batch's end; {} for a batch that did not
    complete."""
    if not batch.final or batch.final["status"] != "completed":
        return {}
    return {point: batch.final["completed_at"] - at
            for point, (at, _) in readings(batch, shown=False).items()}


def by_creation(batches: list[Watched]) -> list[Watched]:
    """A run's batches in the order they were created: the seed's order, the same in
    every run of it."""
    return sorted(batches, key=lambda batch: batch.created)


def speed(run: list[Watched], twin: list[Watched]) -> float:
    """The median ratio of the batches' create-to-end seconds, run over twin."""
    ratios = [(a.final["completed_at"] - a.created) / (b.final["completed_at"] - b.created)
              for a, b in zip(run, twin, strict=True)
              if a.final and b.final and a.final.get("completed_at")
              and b.final.get("completed_at")]
    return statistics.median(ratios) if ratios else float("nan")


def twin_errors(run: list[Watched], twin: list[Watched],
                scale: float = 1.0) -> dict[str, list[float]]:
    """Each point's |D_twin * scale - D| / D over the batches both runs completed, D
    the seconds left at the point in `run` (those under MIN_LEFT left out, as
    eta.errors does)."""
    found: dict[str, list[float]] = {point: [] for point in POINTS}
    for mine, theirs in zip(run, twin, strict=True):
        left, other = left_at_points(mine), left_at_points(theirs)
        for point in POINTS:
            if point in left and point in other and left[point] >= MIN_LEFT:
                found[point].append(abs(other[point] * scale - left[point]) / left[point])
    return found


def signed_errors(run: list[Watched]) -> list[dict[str, float]]:
    """Each batch's API ETA error at each point, signed (eta.scored); a batch's dict
    is empty where it has no reading."""
    return [{point: sign for point, (_, _, sign) in scored(batch).items()} for batch in run]


def repeated(run: list[Watched], twin: list[Watched], point: str) -> float | None:
    """The rank correlation (Spearman's) of the ETA's signed errors at `point` batch
    by batch between two runs of one seed: near 1, the ETA errs on the same batches
    the same way in both (the model's error, not the engine's noise); ranks, so that
    one batch's large error does not decide it. None with under three pairs."""
    pairs = [(mine[point], theirs[point])
             for mine, theirs in zip(signed_errors(run), signed_errors(twin), strict=True)
             if point in mine and point in theirs]
    if len(pairs) < 3:
        return None
    try:
        return statistics.correlation(*(ranks(side) for side in zip(*pairs, strict=True)))
    except statistics.StatisticsError:  # one of them constant
        return None


def ranks(values: tuple[float, ...]) -> list[float]:
    """Each value's rank among `values` (ties at their mean rank)."""
    order = sorted(values)
    return [order.index(value) + (order.count(value) - 1) / 2 for value in values]


WAYS = ("twin", "twin at the run's speed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--twins", nargs="+", action="append", required=True,
                        metavar="PREFIX", help="the recordings of one seed (eta.py --record; "
                                               "two or more); repeat for other seeds")
    parser.add_argument("--results", default="eta-twins")
    args = parser.parse_args()
    mark_start()
    api: dict[str, list[float]] = {point: [] for point in POINTS}
    per_pair = {way: {point: [] for point in POINTS} for way in WAYS}
    pairs = []
    for group in args.twins:
        runs = {prefix: by_creation(read_polls(recording_file(prefix, ".json")))
                for prefix in group}
        sizes = {tuple(batch.samples[-1][3] for batch in run if batch.samples)
                 for run in runs.values()}
        if len(sizes) != 1:
            raise SystemExit(f"not the same workload (the batches' sizes differ): {group}")
        for prefix in group:
            for point, found in errors(runs[prefix])[0].items():
                api[point] += found
        for a, b in itertools.permutations(group, 2):
            pace = speed(runs[a], runs[b])
            row = {"run": a, "twin": b, "speed": pace,
                   "eta_repeats": {point: repeated(runs[a], runs[b], point) for point in POINTS}}
            for way, scale in zip(WAYS, (1.0, pace), strict=True):
                for point, found in twin_errors(runs[a], runs[b], scale).items():
                    per_pair[way][point].append(found)
                    row[f"{way} {point}"] = median(found)
            pairs.append(row)
    print_table("Each run against its twin (|D_twin - D| / D, medians; then at the run's speed)",
                ["run", "twin", "speed", *POINTS, *POINTS, "ETA's errors repeat (r, 50%)"],
                [[Path(row["run"]).name, Path(row["twin"]).name, row["speed"],
                  *(row[f"{way} {point}"] for way in WAYS for point in POINTS),
                  row["eta_repeats"]["50%"]] for row in pairs])
    pooled = {way: {point: {"n": sum(map(len, runs)),
                            "median": median([e for run in runs for e in run]),
                            "interval": run_interval(runs)}
                    for point, runs in found.items()} for way, found in per_pair.items()}
    print_table("Pooled: the twin as predictor, and the API's ETA on the same runs "
                "(90 % interval by resampling pairs)",
                ["point", "readings", *(f"{way}: median (interval)" for way in WAYS),
                 "ETA readings", "ETA: median", "goal"],
                [[point, pooled[WAYS[0]][point]["n"],
                  *(f"{pooled[way][point]['median']:.3f} {fmt(pooled[way][point]['interval'])}"
                    for way in WAYS), len(api[point]), median(api[point]), goal]
                 for point, goal in POINTS.items()])
    write_results(args.results, {
        "options": {"twins": args.twins}, "pairs": pairs, "pooled": pooled,
        "eta": {point: {"n": len(v), "median": median(v)} for point, v in api.items()},
        "note": "a run's seconds from a point to a batch's end against its twin's, the same "
                "seed; speed over 1: the run slower"})


def fmt(interval: tuple[float, float] | None) -> str:
    return f"({interval[0]:.3f}-{interval[1]:.3f})" if interval else ""


if __name__ == "__main__":
    main()
