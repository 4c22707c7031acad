"""Ingest: validate and enqueue a 1,000,000-line chat batch (issue 3).

Generates a realistic chat JSONL file (about 300 bytes a line, varied content), then
measures side by side in one run:

- baseline: one process that only parses every line with orjson (the JSON library
  BatchGen's validation uses): wall time, lines/s, peak RSS;
- BatchGen: a real server (`manage.py serve`: web, control worker, inference worker,
  embedded broker) with the simulated engine and a latency of an hour, so nothing
  completes while it is measured. The file is uploaded (timed), the batch created,
  and the time from `POST /v1/batches` to `in_progress` (streaming validation, chunk
  rows, capacity reservation) is the ingest time. The RSS of every server process is
  sampled every 50 ms throughout.

The dispatcher publishes only a window of chunks to the broker (enough to fill the
inference worker's slots); the rest stay pending in the database by design. The
script reports when the first and last of those window chunks were published.

Goal (issue 3): ingest within 3x of the baseline, every process under 300 MB RSS.

    .venv/bin/python benchmarks/ingest.py            # 1,000,000 lines (~300 MB)
    .venv/bin/python benchmarks/ingest.py --quick    # 50,000 lines
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    MiB,
    PySpy,
    RssSampler,
    mark_start,
    mib,
    print_table,
    running_server,
    scratch_dir,
    server_env_arg,
    server_processes,
    server_timeline,
    wait_for_quiet,
    write_results,
)

GOAL_RATIO = 3.0
GOAL_RSS_MB = 300
ROLES = ["web worker", "web master", "control worker", "inference worker", "broker"]

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there one all we their has been would more "
    "when will if no out so what up said about other into than its time only could new "
    "them man some these then two first may any like now my such make over our even most "
    "me state after also made many did must before back see through way where get much go "
    "well your know should down work year because come people just say each those take "
    "day good how long little very own world use here government both life between "
    "system under never think again high last great might old upon another same found "
    "while still school every against public right small number part three place "
    "history economy river mountain energy battery protein algorithm theorem treaty "
    "recipe garden harbour library telescope vaccine orchestra glacier volcano migration "
    "satellite currency engine language museum bridge forest ocean desert city village"
).split()
TASKS = (
    "Summarize the following passage in two sentences:",
    "Translate into French:",
    "Write a short poem about",
    "Explain to a ten-year-old:",
    "List three facts about",
    "Classify the sentiment (positive, negative, neutral) of:",
    "Answer the question briefly:",
    "Rewrite more formally:",
    "Extract the named entities from:",
    "Give a title for this text:",
)
SYSTEMS = (
    "You are a helpful assistant.",
    "You are a concise assistant. Answer in one paragraph.",
    "You are an expert editor who keeps the author's voice.",
)


# --- the input file -----------------------------------------------------------------


def generate(path: Path, lines: int, *, seed: int = 1234, model: str = "SmolLM2-135M-Instruct"
             ) -> dict:
    """A deterministic chat batch: varied tasks, lengths, system prompts and
    sampling fields, about 300 bytes a line on average."""
    rng = random.Random(seed)
    started = time.perf_counter()
    size = 0
    with path.open("wb") as fh:
        block: list[bytes] = []
        for i in range(lines):
            text = " ".join(rng.choices(WORDS, k=rng.randint(4, 28)))
            messages = []
            if rng.random() < 0.3:
                messages.append({"role": "system", "content": rng.choice(SYSTEMS)})
            messages.append({"role": "user", "content": f"{rng.choice(TASKS)} {text}"})
            body: dict = {"model": model, "messages": messages}
            roll = rng.random()
            if roll < 0.5:
                body["max_tokens"] = rng.choice((16, 32, 64, 128, 256))
            elif roll < 0.7:
                body["max_completion_tokens"] = rng.choice((32, 64))
            if rng.random() < 0.3:
                body["temperature"] = rng.choice((0.0, 0.2, 0.7, 1.0))
            line = orjson.dumps({"custom_id": f"request-{i:07d}", "method": "POST",
                                 "url": "/v1/chat/completions", "body": body}) + b"\n"
            size += len(line)
            block.append(line)
            if len(block) >= 10_000:
                fh.write(b"".join(block))
                block.clear()
        fh.write(b"".join(block))
    return {"lines": lines, "bytes": size, "mean_line_bytes": round(size / lines, 1),
            "seconds": round(time.perf_counter() - started, 2)}


# --- baseline: parse only -----------------------------------------------------------


# Run with `python -c` so the measured process imports nothing but orjson.
BASELINE_CODE = """
import json, resource, sys, time
import orjson
loads = orjson.loads
count = 0
started = time.perf_counter()
with open(sys.argv[1], "rb") as fh:
    for line in fh:
        loads(line)
        count += 1
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"lines": count, "seconds": seconds, "peak_rss_bytes": peak}))
"""


def run_baseline(path: Path) -> dict:
    """Parse every line with orjson in one fresh process: wall time and its peak RSS."""
    done = subprocess.run([sys.executable, "-c", BASELINE_CODE, str(path)],
                          capture_output=True, text=True, check=True, timeout=3600)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["lines_per_s"] = result["lines"] / result["seconds"]
    return result


# --- BatchGen ------------------------------------------------------------------------


def upload(base_url: str, path: Path) -> tuple[dict, float]:
    started = time.perf_counter()
    with httpx.Client(base_url=base_url, timeout=900) as http, path.open("rb") as fh:
        # httpx streams a file object in the multipart body, 64 KiB at a time.
        response = http.post("/v1/files", data={"purpose": "batch"},
                             files={"file": (path.name, fh, "application/jsonl")})
    seconds = time.perf_counter() - started
    response.raise_for_status()
    return response.json(), seconds


def run_batchgen(path: Path, storage: Path, *, poll: float, settle: float,
                 profile: Path | None = None, env: dict[str, str] | None = None) -> dict:
    env = {"BATCHGEN_SIM_LATENCY_MS": str(3_600_000), **(env or {})}
    with running_server(storage, engine="simulated", **env) as server:
        sampler = RssSampler(lambda: server_processes(server), interval=0.05).start()
        try:
            noise = wait_for_quiet()
            sampler.set_phase("upload")
            file, upload_s = upload(server.base_url, path)
            sampler.set_phase("ingest")
            http = httpx.Client(base_url=server.base_url, timeout=60)
            spy = contextlib.nullcontext()
            if profile is not None:
                control = server_processes(server)["control worker"][0].pid
                spy = PySpy(control, profile)
            with spy:
                t0 = time.perf_counter()
                response = http.post("/v1/batches", json={"input_file_id": file["id"],
                                                          "endpoint": "/v1/chat/completions",
                                                          "completion_window": "24h"})
                response.raise_for_status()
                batch = response.json()
                while batch["status"] == "validating":
                    time.sleep(poll)
                    batch = http.get(f"/v1/batches/{batch['id']}").json()
                ingest_s = time.perf_counter() - t0
            if batch["status"] != "in_progress":
                raise RuntimeError(f"batch ended {batch['status']}: {batch.get('errors')}"
                                   f" {batch.get('error')}")
            # Dispatch of the first window and the worker claiming it, still sampled.
            sampler.set_phase("dispatch")
            time.sleep(settle)
            pool = http.get("/v1/pool/status").json()
        finally:
            sampler.stop()
        timeline = server_timeline(storage, batch["id"])
        http.post(f"/v1/batches/{batch['id']}/cancel")
        http.close()
    phases = ["upload", "ingest", "dispatch"]
    return {
        "upload_s": round(upload_s, 2),
        "upload_mb_per_s": round(file["bytes"] / MiB / upload_s, 1),
        "server_env": env,
        "noise_before": noise,
        "ingest_s": round(ingest_s, 3),
        "lines_per_s": round(batch["request_counts"]["total"] / ingest_s),
        "request_counts": batch["request_counts"],
        "poll_interval_s": poll,
        "server_timeline": timeline,
        "pool_status_after": pool,
        "peak_rss_mb": {role: mib(sampler.peak(role, phases)) for role in ROLES},
        "peak_rss_mb_by_phase": {
            phase: {role: mib(v) for role, v in sampler.peaks.get(phase, {}).items()}
            for phase in ["start", *phases]
        },
        "rss_samples": sampler.samples,
        "profile_of_control_worker": spy.summary() if profile is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="50,000 lines")
    parser.add_argument("--input", type=Path, help="use this JSONL file instead of generating")
    parser.add_argument("--poll", type=float, default=0.05,
                        help="batch status poll interval in seconds")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds to keep sampling after in_progress (first dispatch)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--server-env", action="append", metavar="BATCHGEN_X=VALUE",
                        help="extra server setting (repeatable), e.g. "
                             "BATCHGEN_PREFIX_GROUPING=false")
    parser.add_argument("--name", default="ingest",
                        help="results file name (benchmarks/results/NAME.json)")
    parser.add_argument("--profile", action="store_true",
                        help="sample the control worker with py-spy while it validates "
                             "(slows it down; figures go to ingest-profile.json)")
    args = parser.parse_args()
    mark_start()
    lines = 50_000 if args.quick else args.lines

    with scratch_dir("ingest", keep=args.keep) as work:
        if args.input:
            path = args.input
            size = path.stat().st_size
            with path.open("rb") as fh:
                count = sum(1 for _ in fh)
            generated = {"lines": count, "bytes": size, "mean_line_bytes": round(size / count, 1)}
        else:
            path = work / "ingest.jsonl"
            print(f"generating {lines:,} lines into {path} ...", flush=True)
            generated = generate(path, lines)
        print(f"input: {generated['lines']:,} lines, {mib(generated['bytes'])} MiB, "
              f"{generated['mean_line_bytes']} bytes a line", flush=True)

        # The baseline runs before and after BatchGen; the faster of the two is the
        # reference (the stricter ratio), both are recorded.
        print("baseline: parsing every line with orjson ...", flush=True)
        noise = wait_for_quiet()
        baselines = [run_baseline(path)]
        print("BatchGen: starting the server, uploading, validating ...", flush=True)
        batchgen = run_batchgen(path, work / "storage", poll=args.poll, settle=args.settle,
                                profile=work / "control.pyspy" if args.profile else None,
                                env=server_env_arg(args.server_env))
        print("baseline again ...", flush=True)
        wait_for_quiet()
        baselines.append(run_baseline(path))
        baseline = dict(min(baselines, key=lambda b: b["seconds"]))
        baseline["runs_s"] = [round(b["seconds"], 3) for b in baselines]
        baseline["noise_before"] = noise

    ratio = batchgen["ingest_s"] / baseline["seconds"]
    worst_rss = max(batchgen["peak_rss_mb"].values())
    rows = [
        ["baseline: orjson parse only", round(baseline["seconds"], 2),
         round(baseline["lines_per_s"]), mib(baseline["peak_rss_bytes"]), 1.0],
        ["BatchGen: create -> in_progress", batchgen["ingest_s"], batchgen["lines_per_s"],
         worst_rss, round(ratio, 2)],
    ]
    print_table(f"Ingest of {generated['lines']:,} lines ({mib(generated['bytes'])} MiB)",
                ["run", "wall s", "lines/s", "peak RSS MiB", "x baseline"], rows)
    tl = batchgen["server_timeline"]
    print_table("BatchGen, server side (from the database)", ["step", "s after create"], [
        ["validation task started", tl["queued_to_validation_start_s"]],
        ["in_progress (validated, chunks written)", tl["created_to_in_progress_s"]],
        ["first window chunk published", tl["created_to_first_publish_s"]],
        ["last window chunk published", tl["created_to_last_publish_s"]],
    ])
    print(f"chunks: {tl['chunks']:,} written, {tl['chunks_published']} published "
          "(the dispatch window; the rest stay pending in the database by design)")
    print_table("Peak RSS of each server process (MiB)",
                ["process", "idle", "upload", "ingest", "dispatch"],
                [[role, *(batchgen["peak_rss_mb_by_phase"].get(p, {}).get(role)
                          for p in ("start", "upload", "ingest", "dispatch"))]
                 for role in ROLES])
    print(f"\nupload of {mib(generated['bytes'])} MiB: {batchgen['upload_s']} s "
          f"({batchgen['upload_mb_per_s']} MiB/s)")
    goals = {"ratio_within_3x": ratio <= GOAL_RATIO, "rss_under_300mb": worst_rss < GOAL_RSS_MB}
    verdict = {True: "MET", False: "NOT MET"}
    print(f"goal: within {GOAL_RATIO}x of baseline: {verdict[goals['ratio_within_3x']]} "
          f"({ratio:.2f}x); every process under {GOAL_RSS_MB} MiB: "
          f"{verdict[goals['rss_under_300mb']]} (max {worst_rss} MiB)")
    if batchgen["profile_of_control_worker"]:
        prof = batchgen["profile_of_control_worker"]
        print_table(f"py-spy, control worker while validating ({prof['samples']} samples)",
                    ["function (innermost frame)", "% of samples"], prof["self"])
        print_table("py-spy, control worker, inclusive", ["function", "% of samples"],
                    prof["inclusive"])
    write_results(f"{args.name}-profile" if args.profile else args.name, {
        "quick": args.quick, "input": generated, "baseline": baseline, "batchgen": batchgen,
        "ratio_to_baseline": round(ratio, 2), "goals": goals,
    })


if __name__ == "__main__":
    main()
