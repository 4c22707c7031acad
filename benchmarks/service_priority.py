"""The service programs' priority beside vLLM's scheduler (batchgen_site/cpu_placement.py):
one warm BatchGen server on the vllm engine runs the same workload of workloads.py in
interleaved pairs, its web server, control worker and broker at niceness 10 (what
`serve`'s CPU placement sets on a host whose engine computes on its CPUs) and at 0.
The engine's processes and the inference worker are never touched. Changing a
program's niceness back to 0 needs root (or CAP_SYS_NICE).

    .venv/bin/python benchmarks/service_priority.py --scale 0.5 --workload a --pairs 7
    (results/service_priority-a.json; service_priority-WORKLOAD.json for the others)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_MODEL,
    mark_start,
    running_server,
    scratch_dir,
    server_processes,
    write_results,
)
from workloads import _create_batch, _upload, _wait_all, build_workloads  # noqa: E402

from batchgen_site.cpu_placement import threads  # noqa: E402

SERVICES = ("web worker", "web master", "control worker", "broker")


def set_niceness(server, niceness: int) -> None:
    """Every thread of the server's service processes at `niceness`, up or down
    (cpu_placement.lower_priority only ever raises it)."""
    roles = server_processes(server)
    for process in (p for role in SERVICES for p in roles[role]):
        for tid in threads(process.pid):
            try:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
            except OSError:  # a thread that just ended
                continue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.5)
    parser.add_argument("--workload", default="a", choices=("a", "b", "d", "e"))
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    args = parser.parse_args()
    mark_start()
    runs: dict[str, list[float]] = {"niceness 10": [], "niceness 0": []}
    with scratch_dir("service_priority") as work:
        workload = build_workloads(work, Path(args.model).name, args.scale, (0, 12, 1500))[
            args.workload]
        with running_server(work / "storage", engine="vllm", ready_timeout=900,
                            BATCHGEN_MODEL=args.model) as server, \
                httpx.Client(base_url=server.base_url, timeout=600) as http:
            def run() -> float:
                started = time.perf_counter()
                files = [_upload(http, path) for path in workload["batches"]]
                batches = [_create_batch(http, file_id) for file_id in files]
                _wait_all(http, [b["id"] for b in batches], 1800)
                return time.perf_counter() - started

            print(f"warm-up: {run():.1f} s", flush=True)
            for pair in range(args.pairs):
                order = ("niceness 10", "niceness 0")
                for mode in order if pair % 2 == 0 else order[::-1]:
                    set_niceness(server, 10 if mode == "niceness 10" else 0)
                    runs[mode].append(round(run(), 2))
                    print(f"pair {pair + 1}, {mode}: {runs[mode][-1]} s", flush=True)
    medians = {mode: statistics.median(values) for mode, values in runs.items()}
    faster = sum(a < b for a, b in zip(runs["niceness 10"], runs["niceness 0"], strict=True))
    print(f"medians {medians}; niceness 10 faster in {faster} of {args.pairs} pairs")
    write_results(f"service_priority-{args.workload}", {
        "scale": args.scale, "workload": args.workload, "requests": workload["requests"],
        "pairs": args.pairs, "run_s": runs, "run_s_median": medians,
        "niceness_10_faster_pairs": faster,
        "ratio_of_medians": round(medians["niceness 0"] / medians["niceness 10"], 3)})


if __name__ == "__main__":
    main()
