"""The ETAs of recorded runs, played again by this checkout's chunk play.

`benchmarks/eta.py --record PREFIX` has the server write every refresh's play, its
inputs and result (BATCHGEN_ETA_RECORD, batches/eta_record.py), and itself every
poll of every batch. This script plays each refresh's inputs again with this
checkout's batches/eta.py and reads the ETAs at the polls as eta.py reads the API's:
the same points (queued, 10 %, 25 %, 50 % done), the same errors against the
batches' real completion, pooled over the runs given, beside what the server played
in the run and what the API showed, and each point's pooled median with its 90 %
interval by resampling whole runs (`run_interval`). So a change to the play is
measured on real runs' states in seconds, side by side with the code that ran, where
a run of the real engine takes a quarter of an hour and moves with this machine's
speed.

What it cannot replay: anything before the play (the rate, the prompt weight, the
loads' costs, where the chunks were). Those are the recorded inputs; a change there
needs a run.

    .venv/bin/python benchmarks/eta.py --engine vllm --only accuracy --workers 1 \\
        --slots 64 --batches 10 --largest 600 --arrivals 150 --kinds 8,16,32 \\
        --timeout 1500 --seed 8 --record /tmp/rec/run      # writes run-this-s8.json{,l}
    .venv/bin/python benchmarks/eta_replay.py /tmp/rec/run-this-s8 /tmp/rec/run-this-s9
    .venv/bin/python benchmarks/eta_replay.py /tmp/rec/run-this-s8 --next   # the
        # first refresh after each poll, not the one before it (the API's)
    .venv/bin/python benchmarks/eta_replay.py benchmarks/results/eta-recordings/vllm-s{8,9,10,11}
        # the four real-engine runs of 2026-12-07, kept gzip'd: a change replayed at once
    .venv/bin/python benchmarks/eta_replay.py /tmp/rec/run-this-s8 --ticks-only
        # the same run as a server refreshing only on its tick and at admissions
        # would have shown it: the refreshes chunks' closes asked for left out
    .venv/bin/python benchmarks/eta_replay.py /tmp/rec/run-this-s11 --future-rate 120
        # each refresh played at the rate its model's workers went on to do over the
        # next 120 s (an oracle: what a perfect rate estimator could gain at most)
    .venv/bin/python benchmarks/eta_replay.py /tmp/rec/run-this-s8 --without-started
        # the requests in the engines all played with their prompts computed, as
        # before the workers told which have a token (Held.started): side by side
    .venv/bin/python benchmarks/eta_replay.py benchmarks/results/eta-recordings/oos-s16 \
        --unstarted 10    # a run recorded before they told it, with a stand-in
    .venv/bin/python benchmarks/eta_replay.py benchmarks/results/eta-recordings/vllm-s8 \
        --limits-from-seed --batches 10 --largest 600 --kinds 8,16,32
        # the loads recorded with unknown steps (before their model had a history, on
        # a checkout that left them unknown) given one plus their batch's mean
        # max_tokens, as estimates.load_of now does: the recordings do not carry the
        # limits, so each batch's lines are made again from the run's seed (its -sN)
        # and the workload options it ran with
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import mark_start, write_results  # noqa: E402
from eta import (  # noqa: E402
    KINDS,
    POINTS,
    TERMINAL,
    Watched,
    errors,
    last_minute,
    print_intervals,
    read_polls,
    run_interval,
    summary,
    workload,
)

from batches import eta_record  # noqa: E402
from batches.eta import moved, request_steps, span_rate  # noqa: E402

Plays = list[tuple[float, dict[str, float]]]  # (refresh, batch -> seconds), oldest first
TICK = 5.0  # the beat's refresh tick (core.celery.ESTIMATES_SECONDS)
TICK_SLACK = 0.6  # how far from its place a tick's refresh may begin (a queue, a lock)


def ticks_and_admissions(recorded: list[eta_record.Recorded]) -> set[float]:
    """The refreshes of a run that a server refreshing only on its tick and at each
    admission would have made too: those on the beat's cadence (each the one nearest
    a tick after the one before it, the cadence taken up again after a gap), and the
    first to play each batch. The recording does not say what asked for a refresh;
    the closes' refreshes fall off the cadence but by chance (and then the tick's
    own, nearer to it, is the one kept). The ticks' plays hold the same measurements
    either way: the events' refreshes play the tick's again (estimates_refresh_after)."""
    times = sorted({one.at for one in recorded})
    kept = set(times[:1])
    at = times[0] if times else 0.0
    while True:
        due = at + TICK
        near = times[bisect.bisect_left(times, due - TICK_SLACK):
                     bisect.bisect_right(times, due + TICK_SLACK)]
        if near:
            at = min(near, key=lambda t: abs(t - due))
        else:
            later = bisect.bisect_left(times, due + TICK_SLACK)
            if later == len(times):
                break
            at = times[later]
        kept.add(at)
    seen: set[str] = set()
    for one in sorted(recorded, key=lambda one: one.at):
        if set(one.played) - seen:
            kept.add(one.at)
            seen.update(one.played)
    return kept


def future_rates(recorded: list[eta_record.Recorded],
                 seconds: float) -> list[eta_record.Recorded]:
    """Each refresh with its rates (one worker's and the model's) scaled to what the
    model's workers did over the `seconds` after it, at its own prompt weight, from
    the intervals the later refreshes recorded: an oracle no server has, which says
    how much of the error a perfect rate would take away. A refresh recorded without
    intervals, or with none after it, stays as it was."""
    spans = sorted({span[:2]: span for one in recorded for span in one.spans}.values())
    starts = [span[0] for span in spans]
    out = []
    for one in recorded:
        own = span_rate(one.spans, one.prompt_weight)
        ahead = [span for span in spans[bisect.bisect_left(starts, one.at - 1e-6):]
                 if span[1] <= one.at + seconds]
        later = span_rate(ahead, one.prompt_weight)
        if own and later:
            one = replace(one, one=one.one * later / own, rate=one.rate * later / own)
        out.append(one)
    return out


def seed_limits(prefix: str, polled: list[Watched], args) -> dict[str, float]:
    """Each batch's mean output limit (max_tokens a line), its lines made again from
    the run's seed (PREFIX's -sN) and the workload options (eta.workload), the batches
    matched in the order they were created; an error where their sizes differ (other
    options than the run's)."""
    seed = int(re.search(r"-s(\d+)$", prefix).group(1))
    made = sorted(workload(argparse.Namespace(**{**vars(args), "seed": seed})))
    limits = [[json.loads(line)["body"]["max_tokens"] for line in body.splitlines()]
              for *_, body in made]
    batches = sorted(polled, key=lambda batch: batch.created)
    sizes = [batch.samples[-1][3] if batch.samples else 0 for batch in batches]
    if sizes != [len(caps) for caps in limits]:
        sys.exit(f"{prefix}: its batches are not seed {seed}'s with these options")
    return {batch.id: sum(caps) / len(caps) for batch, caps in zip(batches, limits, strict=True)}


def with_limits(recorded: list[eta_record.Recorded],
                limits: dict[str, float]) -> list[eta_record.Recorded]:
    """The refreshes with each load of unknown steps given the steps estimates.load_of
    gives a batch before its model has a history: one plus its mean output limit,
    its cost at most."""
    return [replace(one, loads=tuple(
        replace(load, steps=request_steps(0, 0, limit=limits[load.batch_id], cost=load.cost))
        if load.steps is None and load.batch_id in limits else load for load in one.loads))
        for one in recorded]


def without_started(recorded: list[eta_record.Recorded]) -> list[eta_record.Recorded]:
    """The refreshes with what the workers told of the requests in their engines
    that have a token left out (Held.started None): played as the code before it,
    every request in the slots with its prompt computed."""
    return [replace(one, state=replace(one.state, workers=tuple(
        replace(held, started=None) for held in one.state.workers))) for one in recorded]


def with_unstarted(recorded: list[eta_record.Recorded],
                   count: float) -> list[eta_record.Recorded]:
    """The refreshes recorded before the workers told which requests in their
    engines have a token (Held.started None), each worker's last `count` requests
    in its slots taken to have none, as the play places them: a stand-in for what
    the workers now tell, to read the older recordings with it (on the real engine
    they tell 9-11 at a median). A refresh that has it keeps it."""
    loads_of = [{load.batch_id: load for load in one.loads} for one in recorded]
    out = []
    for one, loads in zip(recorded, loads_of, strict=True):
        workers = []
        for held in one.state.workers:
            if held.started is not None:
                workers.append(held)
                continue
            room, inside = float(held.slots), []
            for place, (batch, work) in enumerate(held.chunks):
                cost = loads[batch].cost if batch in loads else 1.0
                told = place in held.left_steps and batch in loads and loads[batch].steps
                taken = work / cost if told else min(work / cost, max(room, 0.0))
                room -= work / cost if told else taken
                inside.append(taken)
            started, left = {}, count
            for place in reversed(range(len(inside))):
                fresh = min(left, inside[place])
                started[place], left = inside[place] - fresh, left - fresh
            workers.append(replace(held, started=started))
        out.append(replace(one, state=replace(one.state, workers=tuple(workers))))
    return out


def refreshes(recorded: list[eta_record.Recorded],
              play: Callable[[eta_record.Recorded], dict[str, float]]) -> Plays:
    """Each refresh's ETAs (Unix seconds) as `play` makes them of its models' plays,
    a batch of several models at its last one's; a batch played at an earlier refresh
    and at none of this one's models is finalizing: its ETA is now. A value is kept
    until one moved enough (eta.moved), as the refresh writes them."""
    by_refresh: dict[float, dict[str, float]] = defaultdict(dict)
    for one in recorded:
        found = by_refresh[one.at]
        for batch, seconds in play(one).items():
            found[batch] = max(found.get(batch, 0.0), seconds)
    out: Plays = []
    shown: dict[str, float] = {}
    for at in sorted(by_refresh):
        for batch in shown:
            by_refresh[at].setdefault(batch, 0.0)
        for batch, seconds in by_refresh[at].items():
            estimate, was = at + seconds, shown.get(batch)
            if was is None or moved(estimate - was, seconds):
                shown[batch] = estimate
        out.append((at, dict(shown)))
    return out


def reread(batches: list[Watched], plays: Plays, *, after: bool) -> list[Watched]:
    """The batches as polled, each poll's ETA the one `plays` showed then: of the
    last refresh before the poll (as the API), or of the first after it (`after`)."""
    times = [at for at, _ in plays]
    out = []
    for batch in batches:
        samples = []
        for at, status, done, total, _ in batch.samples:
            place = bisect.bisect_left(times, at) if after else bisect.bisect_right(times, at) - 1
            shown = plays[place][1] if 0 <= place < len(plays) else {}
            estimate = shown.get(batch.id)
            samples.append((at, status, done, total,
                            None if estimate is None or status in TERMINAL else estimate))
        out.append(replace(batch, samples=samples))
    return out


def recording_file(prefix: str, suffix: str) -> Path:
    """PREFIX + suffix, or the same gzip'd (the runs kept in benchmarks/results/)."""
    path = Path(prefix + suffix)
    return path if path.exists() else Path(f"{path}.gz")


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="PREFIX of PREFIX.jsonl and PREFIX.json "
                                                "(eta.py --record)")
    parser.add_argument("--next", action="store_true",
                        help="read the first refresh after each poll, not the one before it")
    parser.add_argument("--ticks-only", action="store_true",
                        help="leave out the refreshes off the tick but admissions' (a "
                             "chunk's close's): the run as a tick-only server showed it "
                             "(the recorded and replayed reads; the API's stay as polled)")
    parser.add_argument("--future-rate", type=float, metavar="SECONDS",
                        help="play each refresh at the rate its workers did over the next "
                             "SECONDS (runs recorded with their intervals; an oracle; the "
                             "replayed read, the recorded one stays as played)")
    parser.add_argument("--limits-from-seed", action="store_true",
                        help="give the loads of unknown steps their batch's output limits, "
                             "its lines made again from the run's seed (the replayed read)")
    parser.add_argument("--without-started", action="store_true",
                        help="leave out which requests in the engines had a token (the "
                             "replayed read): every request in the slots played with its "
                             "prompt computed, as before the workers told it")
    parser.add_argument("--unstarted", type=float, metavar="N",
                        help="a run recorded before the workers told which requests in "
                             "their engines have a token: each worker's last N requests "
                             "in its slots taken to have none (the replayed read)")
    parser.add_argument("--batches", type=int, default=14, help="as the runs ran (eta.py)")
    parser.add_argument("--largest", type=int, default=2000)
    parser.add_argument("--arrivals", type=float, default=150.0)
    parser.add_argument("--kinds", type=lambda v: [int(x) for x in v.split(",")],
                        default=list(KINDS))
    parser.add_argument("--results", default="eta-replay")
    return parser.parse_args()


def main() -> None:
    args = options()
    mark_start()
    ways: dict[str, list[Watched]] = {"api": [], "recorded": [], "replayed": []}
    per_run: dict[str, list[list[float]]] = {point: [] for point in POINTS}
    for prefix in args.runs:
        recorded = eta_record.read(recording_file(prefix, ".jsonl"))
        if args.ticks_only:
            kept = ticks_and_admissions(recorded)
            recorded = [one for one in recorded if one.at in kept]
        polled = read_polls(recording_file(prefix, ".json"))
        ways["api"] += polled
        ways["recorded"] += reread(polled, refreshes(recorded, lambda one: one.played),
                                   after=args.next)
        if args.future_rate:
            recorded = future_rates(recorded, args.future_rate)
        if args.limits_from_seed:
            recorded = with_limits(recorded, seed_limits(prefix, polled, args))
        if args.without_started:
            recorded = without_started(recorded)
        elif args.unstarted is not None:
            recorded = with_unstarted(recorded, args.unstarted)
        replayed = reread(polled, refreshes(recorded, eta_record.Recorded.replay),
                          after=args.next)
        ways["replayed"] += replayed
        for point, found in errors(replayed)[0].items():
            per_run[point].append(found)
    results: dict = {"options": vars(args)}
    for way, batches in ways.items():
        found, _, settled, signed = errors(batches)
        results[way] = {"points": summary(found, settled, signed,
                                          f"{way}, {len(args.runs)} runs pooled"),
                        "last_minute": last_minute(batches)}
    intervals = {point: run_interval(runs) for point, runs in per_run.items()}
    results["replayed"]["median_90_by_runs"] = intervals
    print("replayed:", end=" ")
    print_intervals(intervals)
    results["goals"] = POINTS
    write_results(args.results, results)


if __name__ == "__main__":
    main()
