"""The remote engine against the in-process one (issue 16): the same batch through
BatchGen with its own vLLM engine, and through BatchGen's openai-http engine to a
`vllm serve` on the same machine.

Both BatchGen servers and the vLLM server are started once and stay up; each round
sends the batch to one path and then the other (the order alternates round by round,
so drifts in the machine's other load spread over both), after waiting for the
machine to be quiet. Every path has the same engine settings: the `vllm serve` flags
are those of the in-process engine on a CPU (tests/e2e/vllm_server.py: float32,
eager, prefix caching, generation-config vllm, a 1 GiB KV cache), and vLLM resolves
the same scheduler limits for both (128 sequences, 2,048 batched tokens: the serving
entry points' defaults on a CPU).

Output tokens/s come from the output lines' usage; start-up is excluded (reported
apart). Each run records the 1-minute load average before and after it and the
`uptime` line, since the machine is shared.

Goal (issue 16): the remote path at least 0.9x the in-process path's output tokens/s.

    .venv/bin/python benchmarks/remote_engine.py            # 256 requests, 3 rounds
    .venv/bin/python benchmarks/remote_engine.py --quick    # 32 requests, 1 round
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_MODEL,
    Server,
    mark_start,
    print_table,
    scratch_dir,
    server_env,
    wait_for_quiet,
    write_results,
)
from engine import (  # noqa: E402
    CPU_KV_CACHE_BYTES,
    drive_batch,
    same_texts,
    tree_cpu,
    write_input,
)

from tests.e2e.vllm_server import CPU_FLAGS, VllmServer  # noqa: E402

SERVED_NAME = "SmolLM2-135M-Instruct"
LABELS = {"in_process": "in-process vLLM engine", "remote": "openai-http to vllm serve"}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def start_batchgen(storage: Path, *, engine: str, args: list[str], **env: str) -> tuple[
        Server, float]:
    server = Server(storage=storage, env=server_env(storage=storage, engine=engine, **env),
                    args=args)
    started = time.perf_counter()
    server.start(ready_timeout=900)
    return server, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="32 requests, 1 round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="local model folder")
    parser.add_argument("--timeout", type=float, default=3600, help="per run, seconds")
    parser.add_argument("--quiet-timeout", type=float, default=300,
                        help="longest wait for a quiet machine before each run, seconds")
    parser.add_argument("--name", default="remote_engine",
                        help="results file name (benchmarks/results/NAME.json)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    if not Path(args.model, "config.json").exists():
        raise SystemExit(f"no model at {args.model}: run `.venv/bin/python manage.py "
                         "prepare_model` first")
    mark_start()
    count = 32 if args.quick else args.requests
    rounds = 1 if args.quick else args.rounds
    runs: dict[str, list[dict]] = {"in_process": [], "remote": []}
    servers: list = []
    with scratch_dir("remote", keep=args.keep) as work:
        input_path = work / "input.jsonl"
        # The line's model is BatchGen's id; both servers serve it under this name.
        write_input(input_path, count, max_tokens=args.max_tokens, model=SERVED_NAME)
        print(f"input: {count} chat requests, max_tokens {args.max_tokens}, temperature 0; "
              f"{rounds} round(s)", flush=True)
        try:
            vllm = VllmServer(model_dir=Path(args.model), log_path=work / "vllm-serve.log",
                              served_name=SERVED_NAME,
                              flags=[*CPU_FLAGS, "--kv-cache-memory-bytes",
                                     str(CPU_KV_CACHE_BYTES)])
            servers.append(vllm)
            started = time.perf_counter()
            vllm.start().wait_ready(900)
            startups = {"vllm_serve": time.perf_counter() - started}
            print(f"vllm serve up in {startups['vllm_serve']:.0f} s", flush=True)
            in_process, startups["in_process"] = start_batchgen(
                work / "storage-in-process", engine="vllm", args=[],
                BATCHGEN_MODELS=f"{SERVED_NAME}={args.model}")
            servers.append(in_process)
            remote, startups["remote"] = start_batchgen(
                work / "storage-remote", engine="openai-http",
                args=["--engine-url", vllm.url], BATCHGEN_MODELS=f"{SERVED_NAME}={SERVED_NAME}")
            servers.append(remote)
            print("BatchGen up: in-process in {in_process:.0f} s, remote in {remote:.0f} s"
                  .format(**startups), flush=True)
            targets = {"in_process": in_process, "remote": remote}
            for round_no in range(1, rounds + 1):
                order = ["in_process", "remote"]
                if round_no % 2 == 0:
                    order.reverse()
                for key in order:
                    print(f"round {round_no}: {LABELS[key]} ...", flush=True)
                    noise = wait_for_quiet(timeout=args.quiet_timeout)
                    load_before, uptime_before = os.getloadavg()[0], uptime()
                    engine_cpu = tree_cpu(vllm.process.pid)
                    result = drive_batch(targets[key], input_path, args.timeout)
                    engine_cpu = {f"vllm serve {role}": round(value - engine_cpu[role], 1)
                                  for role, value in tree_cpu(vllm.process.pid).items()}
                    result.update(noise_before=noise, load_avg_before=round(load_before, 2),
                                  load_avg_after=round(os.getloadavg()[0], 2),
                                  uptime_before=uptime_before, uptime_after=uptime(),
                                  round=round_no,
                                  tokens_per_s=result["completion_tokens"] / result["run_s"])
                    if key == "remote":
                        result["cpu_seconds"].update(engine_cpu)
                    runs[key].append(result)
                    print(f"  {result['completion_tokens']} output tokens in "
                          f"{result['run_s']:.1f} s ({result['tokens_per_s']:.0f} tokens/s); "
                          f"load {result['load_avg_before']} -> {result['load_avg_after']}",
                          flush=True)
        finally:
            for server in reversed(servers):
                server.stop()
    report(runs, startups, count=count, args=args, rounds=rounds)


def report(runs: dict[str, list[dict]], startups: dict[str, float], *, count: int, args,
           rounds: int) -> None:
    summary = {}
    for key, results in runs.items():
        speeds = [r["tokens_per_s"] for r in results]
        summary[key] = {
            "tokens_per_s_median": round(statistics.median(speeds), 1),
            "tokens_per_s_by_round": [round(v, 1) for v in speeds],
            "run_s_median": round(statistics.median(r["run_s"] for r in results), 2),
            "completion_tokens": results[0]["completion_tokens"],
            "errors": sum(r["errors"] for r in results),
            "startup_s": round(startups[key], 1),
        }
    print_table(f"{count} chat requests, max_tokens {args.max_tokens}, temperature 0 "
                f"(medians of {rounds} round(s); start-up excluded)",
                ["path", "start-up s", "run s", "output tokens", "tokens/s", "by round"],
                [[LABELS[k], v["startup_s"], v["run_s_median"], v["completion_tokens"],
                  v["tokens_per_s_median"], v["tokens_per_s_by_round"]]
                 for k, v in summary.items()])
    print_table("CPU seconds during each run, by process", ["path", "round", "by process",
                                                           "machine busy s", "load before"],
                [[LABELS[k], r["round"], ", ".join(f"{role} {v}" for role, v in
                                                  r["cpu_seconds"].items() if v),
                  r["machine_busy_cpu_s"], r["load_avg_before"]]
                 for k, results in runs.items() for r in results])
    ratio = round(summary["remote"]["tokens_per_s_median"]
                  / summary["in_process"]["tokens_per_s_median"], 3)
    by_round = [round(remote["tokens_per_s"] / local["tokens_per_s"], 3)
                for remote, local in zip(runs["remote"], runs["in_process"], strict=True)]
    same = same_texts(runs["in_process"][0]["texts"], runs["remote"][0]["texts"])
    print(f"\nremote / in-process output tokens/s: {ratio} of medians, by round {by_round}")
    print(f"identical completions (greedy), first rounds: {same}/{count}")
    goal = ratio >= 0.9
    print(f"goal at_least_0.9x_in_process: {'MET' if goal else 'NOT MET'}")
    for results in runs.values():
        for result in results:
            result.pop("texts", None)
    write_results(args.name, {
        "quick": args.quick, "requests": count, "max_tokens": args.max_tokens,
        "model": args.model, "vllm_serve_flags": CPU_FLAGS, "startup_s": startups,
        "summary": summary, "ratio_remote_vs_in_process": ratio,
        "ratio_by_round": by_round, "identical_completions": same,
        "goals": {"at_least_0.9x_in_process": goal}, "runs": runs,
    })


if __name__ == "__main__":
    main()
