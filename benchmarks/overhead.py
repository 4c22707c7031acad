"""Overhead: BatchGen end to end with the simulated engine at zero latency (issue 4).

100,000 small chat requests go through a real server (`manage.py serve`: web,
control worker, one inference worker, embedded broker, SQLite), upload to download,
so what is measured is BatchGen's own cost per request: validation, chunking,
dispatch, the worker's claim/read/submit/format/append loop, progress accounting
and finalization. Side by side, in the same run, a baseline does the unavoidable
per-request work in one process with no orchestration at all: parse the line, merge
parameters, call the same simulated engine, format the output line, append it.

The server runs with its own chunk and pool settings (default); `--chunk-sizes`
adds runs with other BATCHGEN_CHUNK_SIZE values. CPU seconds of every server
process are reported per run, to show where the time goes.

Goal (issue 4): 5,000 requests/s end to end on this machine.

    .venv/bin/python benchmarks/overhead.py             # 100,000 requests
    .venv/bin/python benchmarks/overhead.py --quick     # 10,000 requests, default only
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    PySpy,
    drive_batch,
    mark_start,
    print_table,
    profiled_workers,
    running_server,
    scratch_dir,
    server_cpu_seconds,
    server_env_arg,
    server_timeline,
    wait_for_quiet,
    write_results,
)

GOAL_RPS = 5000
ROLES = ["web worker", "control worker", "inference worker", "broker"]


def generate(path: Path, count: int) -> int:
    with path.open("wb") as fh:
        fh.write(b"".join(
            orjson.dumps({"custom_id": f"req-{i}", "method": "POST",
                          "url": "/v1/chat/completions",
                          "body": {"model": "m", "max_tokens": 16, "messages": [
                              {"role": "user", "content": f"Say something about number {i}."}]}})
            + b"\n" for i in range(count)))
    return path.stat().st_size


# --- baseline: the same work, no orchestration -------------------------------------


def run_baseline(path: Path, out: Path) -> dict:
    """Parse, merge parameters, run the simulated engine, format and append every
    request in one process, 200 at a time on one event loop."""
    from inference.engines.simulated import SimulatedEngine
    from inference.output import format_line
    from serving.endpoints import endpoint_spec
    from serving.engines.base import EngineConfig, EngineRequest
    from serving.params import BatchParams

    engine = SimulatedEngine(EngineConfig(engine="simulated", model="m", served_model_name="m"))
    params = BatchParams()
    endpoint = "/v1/chat/completions"

    async def run_all() -> int:
        done = 0
        group: list[dict] = []
        with path.open("rb") as src, out.open("ab") as dst:
            async def flush() -> int:
                results = await asyncio.gather(*(engine.generate(EngineRequest(
                    request_id=f"r{i}", custom_id=item["custom_id"], endpoint=endpoint,
                    body=endpoint_spec(endpoint).resolve_body(item["body"], params)))
                    for i, item in enumerate(group)))
                dst.write(b"".join(format_line(item["custom_id"], result)
                                   for item, result in zip(group, results, strict=True)))
                return len(group)

            for line in src:
                group.append(orjson.loads(line))
                if len(group) == 200:
                    done += await flush()
                    group = []
            if group:
                done += await flush()
        return done

    started = time.perf_counter()
    done = asyncio.run(run_all())
    seconds = time.perf_counter() - started
    return {"requests": done, "seconds": round(seconds, 3),
            "requests_per_s": round(done / seconds),
            "us_per_request": round(seconds / done * 1e6, 1)}


# --- BatchGen ------------------------------------------------------------------------


def check_output(content: bytes, requests: int) -> None:
    """Every custom_id of the input once in the output, none more."""
    ids = [orjson.loads(line)["custom_id"] for line in content.splitlines()]
    if len(ids) != requests or len(set(ids)) != requests:
        raise RuntimeError(f"output holds {len(ids)} lines, {len(set(ids))} distinct ids, "
                           f"expected {requests}")


def run_batchgen(path: Path, storage: Path, *, requests: int, chunk_size: int | None,
                 poll: float, timeout: float, extra_env: dict[str, str],
                 profile: Path | None = None) -> dict:
    env = {"BATCHGEN_SIM_LATENCY_MS": "0", **extra_env}
    if chunk_size is not None:
        env["BATCHGEN_CHUNK_SIZE"] = str(chunk_size)
    with running_server(storage, engine="simulated", **env) as server, \
            httpx.Client(base_url=server.base_url, timeout=600) as http:
        noise = wait_for_quiet()  # also lets start-up work (first heartbeats) settle
        cpu_before = server_cpu_seconds(server)
        flow = drive_batch(http, path, poll=poll, timeout=timeout,
                           during=lambda: profiled_workers(server, profile))
        batch = flow.pop("batch")
        content = flow.pop("content")
        cpu_after = server_cpu_seconds(server)
        timeline = server_timeline(storage, batch["id"])
    profiles = {}
    if profile is not None:
        for role in ("inference", "control"):
            spy = PySpy(0, profile.with_suffix(f".{role}.txt"))
            profiles[role] = spy.summary(top=25)

    check_output(content, requests)
    total = flow["end_to_end_s"]
    return {
        "chunk_size": chunk_size or "default (200)",
        "requests": requests,
        **flow,
        "requests_per_s": round(requests / total),
        "us_per_request": round(total / requests * 1e6, 1),
        "request_counts": batch["request_counts"],
        "cpu_seconds": {role: round(cpu_after.get(role, 0) - cpu_before.get(role, 0), 2)
                        for role in ROLES},
        "poll_interval_s": poll,
        "noise_before": noise,
        "server_env": env,
        "server_timeline": timeline,
        "profiles": profiles or None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--chunk-sizes", default="1000",
                        help="extra BATCHGEN_CHUNK_SIZE values to run after the default, "
                             "comma-separated ('' for none)")
    parser.add_argument("--quick", action="store_true", help="10,000 requests, default only")
    parser.add_argument("--poll", type=float, default=0.1)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--server-env", action="append", metavar="BATCHGEN_X=VALUE",
                        help="extra server setting for every run (repeatable)")
    parser.add_argument("--profile", action="store_true",
                        help="sample the inference and control workers with py-spy during the "
                             "default run (slows them; figures go to NAME-profile.json)")
    parser.add_argument("--name", default="overhead",
                        help="results file name (benchmarks/results/NAME.json)")
    args = parser.parse_args()
    mark_start()
    requests = 10_000 if args.quick else args.requests
    extra = [] if args.quick else [int(v) for v in args.chunk_sizes.split(",") if v.strip()]

    runs = []
    with scratch_dir("overhead", keep=args.keep) as work:
        path = work / "input.jsonl"
        size = generate(path, requests)
        print(f"input: {requests:,} requests, {size / 1e6:.1f} MB", flush=True)
        print("baseline: the same work in one process, no orchestration ...", flush=True)
        noise = wait_for_quiet()
        baseline = run_baseline(path, work / "baseline-out.jsonl")
        baseline["noise_before"] = noise
        for i, chunk_size in enumerate([None, *extra]):
            label = chunk_size or "default"
            print(f"BatchGen (chunk size {label}): upload, create, wait, download ...",
                  flush=True)
            runs.append(run_batchgen(path, work / f"storage{i}", requests=requests,
                                     chunk_size=chunk_size, poll=args.poll,
                                     timeout=args.timeout,
                                     extra_env=server_env_arg(args.server_env),
                                     profile=work / "pyspy" if args.profile and i == 0
                                     else None))

    rows = [["baseline: engine loop, no orchestration", None, None, None, None,
             baseline["seconds"], baseline["requests_per_s"], baseline["us_per_request"], 1.0]]
    for run in runs:
        rows.append([f"BatchGen, chunk size {run['chunk_size']}", run["upload_s"],
                     run["create_to_in_progress_s"], run["in_progress_to_completed_s"],
                     run["download_s"], run["end_to_end_s"], run["requests_per_s"],
                     run["us_per_request"],
                     round(run["requests_per_s"] / baseline["requests_per_s"], 3)])
    print_table(f"{requests:,} requests, simulated engine at 0 ms",
                ["run", "upload s", "validate s", "run s", "download s", "total s",
                 "req/s", "us/req", "x baseline"], rows)
    print_table("CPU seconds of each server process during the run",
                ["run", *ROLES],
                [[f"chunk size {run['chunk_size']}", *(run["cpu_seconds"][r] for r in ROLES)]
                 for run in runs])
    default = runs[0]
    met = default["requests_per_s"] >= GOAL_RPS
    print(f"\ngoal: {GOAL_RPS:,} requests/s end to end with default settings: "
          f"{'MET' if met else 'NOT MET'} ({default['requests_per_s']:,} requests/s, "
          f"{default['us_per_request']} us a request; the baseline's own work is "
          f"{baseline['us_per_request']} us a request)")
    for run in runs:
        tl = run["server_timeline"]
        print(f"chunk size {run['chunk_size']}: server side, s after create: validation "
              f"started {tl['queued_to_validation_start_s']}, in_progress "
              f"{tl['created_to_in_progress_s']}, first chunk done "
              f"{tl['created_to_first_chunk_done_s']}, last chunk done "
              f"{tl['created_to_last_chunk_done_s']}, completed {tl['created_to_completed_s']}"
              f" ({tl['chunks']} chunks)")
    for role, prof in (runs[0]["profiles"] or {}).items():
        print_table(f"py-spy, {role} worker, default run ({prof['samples']} samples)",
                    ["function (innermost frame)", "% self"], prof["self"])
        print_table(f"py-spy, {role} worker, inclusive", ["function", "%"], prof["inclusive"])
    write_results(f"{args.name}-profile" if args.profile else args.name, {
        "quick": args.quick, "requests": requests, "baseline": baseline, "runs": runs,
        "goal_requests_per_s": GOAL_RPS, "goal_met": met,
    })


if __name__ == "__main__":
    main()
