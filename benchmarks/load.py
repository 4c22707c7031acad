"""Polling load: 200 concurrent clients poll GET /v1/batches/{id} and GET
/v1/pool/status (alternately) while a batch runs on the simulated engine.

The goal (issue 7): 1,000 polls/s with p99 under 100 ms and zero errors on this
machine. The load comes from `wrk` (Debian: `apt-get install -y wrk`), a C load
generator, so the clients take as little of the machine's CPU from the server as
possible; a Lua script alternates the two paths, paces each client and summarises.

Two shapes of load, each bounded in time (--duration) and count (--max-requests):
- paced: each client waits --pause-ms (150) after each answer before it polls again,
  so 200 clients offer 200 / (0.15 s + latency): over 1,000 polls/s (the goal) while
  answers take under 50 ms; p50/p99 are what a polling client sees. The pause follows
  the answer, so a slow server is offered less (closed loop): a p99 over the goal
  shows as a rate under it too;
- max: the clients poll back to back (no pause): the server's capacity.

Each `--config` (a string of `manage.py serve` options, e.g. "--web-workers 2
--web-threads 4") gets a fresh server: the simulated engine, 1,000 slots at 1 s a
request, so about 1,000 requests/s of batch work run next to the polls. The default
is the server's own defaults ("").

Only 127.0.0.1 is used. Results: benchmarks/results/load.json.

    .venv/bin/python benchmarks/load.py                      # defaults, paced + max
    .venv/bin/python benchmarks/load.py --config= --config='--web-threads 4'

"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    Api,
    PySpy,
    Server,
    print_table,
    scratch_dir,
    server_cpu_seconds,
    server_env,
    wait_for_quiet,
    write_results,
)

from tests.e2e.harness import chat_lines  # noqa: E402

# Each wrk thread alternates the two paths, pauses `pause` ms before each request
# (per connection), stops after `cap` requests, and the summary is printed as JSON.
LUA = r"""
local paths, pause, cap, sent = nil, 0, 0, 0
local statuses = {}
function init(args)
  paths = {args[1], args[2]}
  pause = tonumber(args[3])
  cap = tonumber(args[4])
end
function request()
  sent = sent + 1
  return wrk.format("GET", paths[(sent % 2) + 1])
end
function delay()
  return pause
end
function response(status, headers, body)
  if status ~= 200 then
    statuses[status] = (statuses[status] or 0) + 1
  end
  if sent >= cap then
    wrk.thread:stop()
  end
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, ' ..
    '"non_2xx": %d, "timeout": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, ' ..
    '"p999_us": %d, "max_us": %d, "mean_us": %.1f}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean))
end
"""

def run_wrk(server: Server, batch_id: str, *, clients: int, threads: int, duration: float,
            pause_ms: int, max_requests: int, script: Path) -> dict:
    per_thread_cap = max(1, max_requests // threads)
    argv = ["wrk", "-t", str(threads), "-c", str(clients), "-d", f"{duration:.0f}s",
            "--timeout", "10s", "-s", str(script), server.base_url, "--",
            f"/v1/batches/{batch_id}", "/v1/pool/status", str(pause_ms), str(per_thread_cap)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk failed: {done.stdout}\n{done.stderr}")
    result = json.loads(line.removeprefix("RESULT "))
    seconds = result["duration_us"] / 1e6
    errors = {k: result[k] for k in ("connect", "read", "write", "timeout", "non_2xx")}
    return {
        "requests": result["requests"],
        "seconds": round(seconds, 2),
        "requests_per_s": round(result["requests"] / seconds, 1),
        "p50_ms": result["p50_us"] / 1000, "p90_ms": result["p90_us"] / 1000,
        "p99_ms": result["p99_us"] / 1000, "p999_ms": result["p999_us"] / 1000,
        "max_ms": result["max_us"] / 1000, "mean_ms": round(result["mean_us"] / 1000, 2),
        "errors": sum(errors.values()), "error_kinds": errors,
    }


def measure(args, work: Path, *, config: str, index: int, script: Path,
            checkout: Path | None = None) -> list:
    storage = work / f"storage-{index}"
    env = server_env(storage=storage, engine="simulated", BATCHGEN_SIM_LATENCY_MS="1000",
                     BATCHGEN_MAX_POOL_SIZE="1000")
    server = Server(storage=storage, env=env, args=shlex.split(config), web_workers=None,
                    **({"root": checkout} if checkout else {}))
    label = f"{config or '(defaults)'}{f' [{checkout.name}]' if checkout else ''}"
    runs = []
    try:
        server.start(ready_timeout=180)
        api = Api(server.base_url)
        batch = api.create_batch(api.upload(chat_lines(args.batch_requests))["id"]).json()
        api.wait_status(batch["id"], {"in_progress"}, timeout=120)
        # Warm up: every gunicorn thread has served a request, imports are done.
        run_wrk(server, batch["id"], clients=args.clients, threads=args.wrk_threads,
                duration=3, pause_ms=0, max_requests=10**9, script=script)
        shapes = [("paced", args.pause_ms)] if "paced" in args.shapes else []
        shapes += [("max", 0)] if "max" in args.shapes else []
        for shape, pause_ms in shapes:
            noise = wait_for_quiet(max_busy=70, timeout=30)
            before = api.batch(batch["id"])
            cpu_before = server_cpu_seconds(server)
            wall_before = time.monotonic()
            psutil.cpu_percent()  # starts the machine-wide measurement
            spy = None
            if args.profile and shape == "max":
                # --gil: only the thread holding the GIL, i.e. where the CPU goes
                spy = PySpy(server.children("gunicorn: worker")[0].pid,
                            work / f"spy-{index}.raw", rate=200, gil=True)
                spy.__enter__()
            try:
                result = run_wrk(server, batch["id"], clients=args.clients,
                                 threads=args.wrk_threads, duration=args.duration,
                                 pause_ms=pause_ms, max_requests=args.max_requests,
                                 script=script)
            finally:
                if spy is not None:
                    spy.__exit__(None, None, None)
            wall = time.monotonic() - wall_before
            machine_busy = psutil.cpu_percent()
            cores = {role: round((seconds - cpu_before.get(role, 0.0)) / wall, 2)
                     for role, seconds in server_cpu_seconds(server).items()}
            web_cpu = cores.get("web worker", 0.0) + cores.get("web master", 0.0)
            after = api.batch(batch["id"])
            result.update({
                "shape": shape, "config": label,
                "clients": args.clients, "pause_ms": pause_ms,
                "web_cpu_cores": round(web_cpu, 2),
                "web_cpu_ms_per_poll": round(web_cpu * 1000 / max(result["requests_per_s"], 1),
                                             2),
                "cpu_cores_by_role": cores,
                "machine_busy_percent": machine_busy,
                "batch_status_after": after["status"],
                "batch_requests_done_during": after["request_counts"]["completed"]
                - before["request_counts"]["completed"],
                "noise_before": noise,
            })
            if spy is not None:
                result["profile"] = spy.summary(top=25)
            runs.append(result)
            print(f"  {shape:5} {label}: "
                  f"{result['requests_per_s']:,.0f} req/s, p50 {result['p50_ms']:.1f} ms, "
                  f"p99 {result['p99_ms']:.1f} ms, errors {result['errors']}, "
                  f"batch {result['batch_requests_done_during']:,} requests done meanwhile",
                  flush=True)
    finally:
        server.stop()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--duration", type=float, default=30, help="seconds per measurement")
    parser.add_argument("--max-requests", type=int, default=200_000,
                        help="stop a measurement after this many requests")
    parser.add_argument("--pause-ms", type=int, default=150,
                        help="paced shape: each client's pause after an answer")
    parser.add_argument("--shapes", nargs="+", default=["paced", "max"],
                        choices=["paced", "max"])
    parser.add_argument("--config", action="append",
                        help="manage.py serve options for one server (repeat to compare; "
                             "give them with '=': --config='--web-threads 4')")
    parser.add_argument("--baseline-checkout", type=Path,
                        help="another checkout (e.g. a git worktree of an older commit) "
                             "whose server runs before each config, with this venv")
    parser.add_argument("--baseline-config", default="",
                        help="manage.py serve options for the baseline checkout's server")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole plan")
    parser.add_argument("--batch-requests", type=int, default=200_000,
                        help="size of the batch that runs during the load")
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true",
                        help="py-spy the gunicorn worker during the max shape")
    parser.add_argument("--name", default="load")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")

    runs = []
    with scratch_dir("load", keep=args.keep) as work:
        script = work / "poll.lua"
        script.write_text(LUA)
        plan = [(config, None) for config in args.config or [""]]
        if args.baseline_checkout:
            # Side by side, alternating: the older code's server, then this one's.
            plan = [(args.baseline_config, args.baseline_checkout), *plan] * args.rounds
        else:
            plan = plan * args.rounds
        for index, (config, checkout) in enumerate(plan):
            runs += measure(args, work, config=config, index=index, script=script,
                            checkout=checkout)

    print_table(
        f"Polling load: {args.clients} clients, GET /v1/batches/{{id}} and /v1/pool/status, "
        f"{args.duration:.0f} s each, a batch running",
        ["shape", "serve options", "req/s", "p50 ms", "p90 ms", "p99 ms",
         "max ms", "errors", "web CPU (cores)", "web CPU ms/poll", "machine busy %",
         "batch req done"],
        [[r["shape"], r["config"], r["requests_per_s"], r["p50_ms"], r["p90_ms"],
          r["p99_ms"], r["max_ms"], r["errors"], r["web_cpu_cores"], r["web_cpu_ms_per_poll"],
          r["machine_busy_percent"], r["batch_requests_done_during"]] for r in runs])
    goal = [r for r in runs if r["shape"] == "paced" and r["requests_per_s"] >= 1000
            and r["p99_ms"] < 100 and r["errors"] == 0]
    print("\ngoal (>= 1,000 polls/s, p99 < 100 ms, no errors):",
          "met by " + ", ".join(r["config"] for r in goal) if goal else "not met")
    write_results(args.name, {"settings": vars(args), "runs": runs})


if __name__ == "__main__":
    main()
