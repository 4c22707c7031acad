"""Engine throughput: BatchGen against vLLM itself on the same input (issue 4).

The same chat requests (fixed prompts, temperature 0, the same max_tokens) run three
ways, one after the other, in one run:

1. raw vLLM: `LLM.chat` (the offline engine) in a child process;
2. vLLM's own batch runner: `python -m vllm.entrypoints.openai.run_batch`;
3. BatchGen end to end: `manage.py serve` with the vllm engine; upload, create,
   wait, download.

Every path gets the engine settings BatchGen's vllm engine uses on a CPU
(inference/engines/vllm_engine.py): dtype float32, enforce_eager, a 1 GiB KV cache
(kv_cache_memory_bytes), prefix caching on, generation_config "vllm", the model's
max_model_len. The offline `LLM` class would otherwise pick larger scheduler
defaults (max_num_seqs, max_num_batched_tokens) than the serving entry points, so
the raw run is given the values vLLM resolves for BatchGen's engine: the comparison
is of the code around the engine, not of scheduler settings.

Output tokens/s come from the actual counts (token ids for LLM.chat, `usage` in the
output lines for the other two). Start-up is excluded from the figures and reported
separately:
- raw: the `LLM(...)` constructor; the run is the `chat` call;
- run_batch: from launch to its "Reading batch from" log line (printed once the
  engine is up); the run is from that line to the output file's last write;
  what follows (engine shutdown) is reported as shutdown;
- BatchGen: from `serve` to /health answering 200 (it waits for the engine to be
  ready); the run is upload to the end of the download.

Goals (issue 4): BatchGen >= 0.9x raw vLLM and >= 1.0x run_batch.

    .venv/bin/python benchmarks/engine.py             # 256 requests, max_tokens 64
    .venv/bin/python benchmarks/engine.py --quick     # 32 requests
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_MODEL,
    mark_start,
    print_table,
    ratios_by_round,
    run_rounds,
    running_server,
    scratch_dir,
    server_cpu_seconds,
    server_timeline,
    summarize_rounds,
    wait_for_quiet,
    write_results,
)

CPU_KV_CACHE_BYTES = 1 << 30  # as inference/engines/vllm_engine.py sets it on CPUs
CHAT = "/v1/chat/completions"
TOPICS = (
    "the water cycle", "black holes", "photosynthesis", "the Roman empire", "volcanoes",
    "machine learning", "the French revolution", "honey bees", "plate tectonics",
    "the immune system", "jazz music", "the printing press", "coral reefs", "electricity",
    "the Moon landing", "compound interest", "glaciers", "the human heart", "chess openings",
    "renewable energy", "the Silk Road", "DNA", "earthquakes", "the internet",
    "ancient Egypt", "rainbows", "vaccines", "the stock market", "migratory birds",
    "quantum computing", "the Olympic games", "bread baking",
)
TEMPLATES = (
    "Explain {} in simple terms.",
    "Write a short paragraph about {}.",
    "What are three interesting facts about {}?",
    "Describe {} to a ten-year-old.",
    "Why is {} important?",
    "Give a brief history of {}.",
    "What is a common misconception about {}?",
    "Summarize what you know about {}.",
)
ENGINE_FLAGS = {  # the settings of BatchGen's engine on a CPU, as run_batch flags
    "--dtype": "float32", "--enforce-eager": None, "--enable-prefix-caching": None,
    "--kv-cache-memory-bytes": str(CPU_KV_CACHE_BYTES), "--generation-config": "vllm",
}


def write_input(path: Path, count: int, *, max_tokens: int, model: str) -> None:
    prompts = [t.format(topic) for t in TEMPLATES for topic in TOPICS]
    with path.open("w") as fh:
        for i in range(count):
            body = {"model": model, "temperature": 0, "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": prompts[i % len(prompts)]}]}
            fh.write(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": CHAT,
                                 "body": body}) + "\n")


def answered(lines: list[bytes]) -> tuple[list[tuple[str, dict]], int]:
    """The output lines' (custom_id, response body) for answered requests, and how
    many lines were errors."""
    bodies, errors = [], 0
    for line in lines:
        if not line.strip():
            continue
        item = json.loads(line)
        response = item.get("response")
        if not response or item.get("error") or response.get("status_code") != 200:
            errors += 1
            continue
        bodies.append((item["custom_id"], response["body"]))
    return bodies, errors


def read_usage(lines: list[bytes]) -> dict:
    completion = prompt = 0
    texts = {}
    bodies, errors = answered(lines)
    for custom_id, body in bodies:
        completion += body["usage"]["completion_tokens"]
        prompt += body["usage"]["prompt_tokens"]
        texts[custom_id] = body["choices"][0]["message"]["content"]
    return {"completion_tokens": completion, "prompt_tokens": prompt, "errors": errors,
            "texts": texts}


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds (user + system) of a process and of its descendants, the latter
    split by the name vLLM gives its engine process."""
    found = {"frontend": 0.0, "engine core": 0.0}
    try:
        parent = psutil.Process(root)
        processes = [parent, *parent.children(recursive=True)]
    except psutil.Error:
        return found
    for proc in processes:
        try:
            times = proc.cpu_times()
            role = "frontend" if proc.pid == root else "engine core"
            found[role] += times.user + times.system
        except psutil.Error:
            continue
    return found


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy so far (all processes, all cores)."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def cpu_delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: round(after.get(key, 0.0) - before.get(key, 0.0), 1) for key in after}


# --- 1. raw vLLM (runs in a child process) -------------------------------------------


def raw_child(input_path: Path, model: str, out: Path) -> None:
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    common = dict(model=model, dtype="float32", enforce_eager=True,
                  kv_cache_memory_bytes=CPU_KV_CACHE_BYTES, enable_prefix_caching=True,
                  generation_config="vllm")
    # The scheduler limits vLLM resolves for BatchGen's engine (and run_batch's): the
    # batch-runner usage context, not the offline LLM class's larger defaults.
    served = AsyncEngineArgs(**common).create_engine_config(
        usage_context=UsageContext.OPENAI_BATCH_RUNNER).scheduler_config
    scheduler = {"max_num_seqs": served.max_num_seqs,
                 "max_num_batched_tokens": served.max_num_batched_tokens}
    requests = [json.loads(line) for line in input_path.read_text().splitlines() if line]
    started = time.perf_counter()
    llm = LLM(**common, **scheduler)
    startup = time.perf_counter() - started
    params = [SamplingParams(temperature=r["body"]["temperature"],
                             max_tokens=r["body"]["max_tokens"]) for r in requests]
    cpu_before, busy_before = tree_cpu(os.getpid()), machine_busy()
    started = time.perf_counter()
    outputs = llm.chat([r["body"]["messages"] for r in requests], params, use_tqdm=False)
    run = time.perf_counter() - started
    cpu = cpu_delta(tree_cpu(os.getpid()), cpu_before)
    out.write_text(json.dumps({
        "startup_s": startup, "run_s": run, "scheduler": scheduler, "cpu_seconds": cpu,
        "machine_busy_cpu_s": round(machine_busy() - busy_before, 1),
        "completion_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "prompt_tokens": sum(len(o.prompt_token_ids) for o in outputs),
        "texts": {r["custom_id"]: o.outputs[0].text for r, o in zip(requests, outputs,
                                                                       strict=True)},
    }))


def run_raw(input_path: Path, model: str, work: Path, timeout: float) -> dict:
    out = work / "raw.json"
    log = work / "raw.log"
    started = time.perf_counter()
    with log.open("wb") as fh:
        subprocess.run([sys.executable, __file__, "--raw-child", str(input_path),
                        "--model", model, "--raw-out", str(out)],
                       stdout=fh, stderr=subprocess.STDOUT, check=True, timeout=timeout)
    result = json.loads(out.read_text())
    result["process_s"] = time.perf_counter() - started
    return result


# --- 2. vLLM's run_batch --------------------------------------------------------------


def run_vllm_batch(input_path: Path, model: str, work: Path, timeout: float, *,
                   flags: dict[str, str | None] = ENGINE_FLAGS,
                   read: Callable[[list[bytes]], dict] = read_usage) -> dict:
    """`flags`: run_batch's engine settings; `read`: what the output lines gave."""
    out = work / "run_batch-out.jsonl"
    out.unlink(missing_ok=True)  # its appearance marks the end of the run
    log = work / "run_batch.log"
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(input_path),
            "-o", str(out), "--model", model]
    # The lines name the model as BatchGen serves it, by its folder's name, unless the
    # caller's flags name it otherwise.
    flags = {"--served-model-name": Path(model).name, **flags}
    for flag, value in flags.items():
        argv += [flag] if value is None else [flag, value]
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1"}
    marks: dict[str, float] = {}
    cpu: dict[str, dict[str, float]] = {}
    started = time.time()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)

    def follow() -> None:
        with log.open("wb") as fh:
            for line in process.stdout:
                fh.write(line)
                if b"Reading batch from" in line and "reading" not in marks:
                    marks["reading"] = time.time()
                    cpu["before"] = tree_cpu(process.pid)
                    marks["busy_before"] = machine_busy()

    def watch_output() -> None:
        # The output is written once, at the end, before the engine shuts down.
        while process.poll() is None and not out.exists():
            time.sleep(0.05)
        cpu["after"] = tree_cpu(process.pid)
        marks["busy_after"] = machine_busy()

    reader = threading.Thread(target=follow, daemon=True)
    watcher = threading.Thread(target=watch_output, daemon=True)
    reader.start()
    watcher.start()
    try:
        process.wait(timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(10)
        watcher.join(10)
    ended = time.time()
    if process.returncode != 0 or "reading" not in marks:
        raise RuntimeError(f"run_batch failed ({process.returncode}); see {log}:\n"
                           + log.read_text(errors="replace")[-3000:])
    written = out.stat().st_mtime
    usage = read(out.read_bytes().splitlines())
    return {"startup_s": marks["reading"] - started, "run_s": written - marks["reading"],
            "shutdown_s": ended - written, "process_s": ended - started,
            "cpu_seconds": cpu_delta(cpu.get("after", {}), cpu.get("before", {})),
            "machine_busy_cpu_s": round(marks.get("busy_after", 0) - marks["busy_before"], 1),
            **usage}


# --- 3. BatchGen ----------------------------------------------------------------------


def run_batchgen(input_path: Path, model: str, work: Path, timeout: float, *,
                 engine_args: str | None = None, name: str = "storage",
                 endpoint: str = CHAT, quiet_timeout: float = 300.0,
                 read: Callable[[list[bytes]], dict] = read_usage) -> dict:
    env = {"BATCHGEN_MODEL": model}
    if engine_args:
        env["BATCHGEN_ENGINE_ARGS"] = engine_args
    storage = work / name
    started = time.perf_counter()
    with running_server(storage, engine="vllm", ready_timeout=900, **env) as server:
        startup = time.perf_counter() - started
        noise = wait_for_quiet(timeout=quiet_timeout)  # the server's start-up work included
        result = drive_batch(server, input_path, timeout, endpoint=endpoint, read=read)
    return {"startup_s": startup, "noise_before_run": noise, "engine_args": engine_args,
            **result}


def drive_batch(server, input_path: Path, timeout: float, *, endpoint: str = CHAT,
                read: Callable[[list[bytes]], dict] = read_usage) -> dict:
    """One batch through a running BatchGen, as a client: upload, create, poll every
    0.25 s, download; the run is all of it."""
    with httpx.Client(base_url=server.base_url, timeout=600) as http:
        cpu_before, busy_before = server_cpu_seconds(server), machine_busy()
        t0 = time.perf_counter()
        with input_path.open("rb") as fh:
            file = http.post("/v1/files", data={"purpose": "batch"},
                             files={"file": (input_path.name, fh, "application/jsonl")})
        file.raise_for_status()
        batch = http.post("/v1/batches", json={"input_file_id": file.json()["id"],
                                               "endpoint": endpoint,
                                               "completion_window": "24h"})
        batch.raise_for_status()
        batch = batch.json()
        deadline = time.monotonic() + timeout
        while batch["status"] not in ("completed", "failed", "cancelled"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"BatchGen batch not done after {timeout} s")
            time.sleep(0.25)
            batch = http.get(f"/v1/batches/{batch['id']}").json()
        if batch["status"] != "completed":
            raise RuntimeError(f"BatchGen batch ended {batch['status']}: {batch.get('error')}")
        content = http.get(f"/v1/files/{batch['output_file_id']}/content")
        content.raise_for_status()
        run = time.perf_counter() - t0
        cpu = cpu_delta(server_cpu_seconds(server), cpu_before)
        busy = round(machine_busy() - busy_before, 1)
        timeline = server_timeline(server.storage, batch["id"])
    usage = read(content.content.splitlines())
    return {"run_s": run, "server_timeline": timeline, "cpu_seconds": cpu,
            "machine_busy_cpu_s": busy, "request_counts": batch["request_counts"], **usage}


# --- report -----------------------------------------------------------------------------


def same_texts(a: dict, b: dict) -> int:
    return sum(1 for key, text in a.items() if b.get(key) == text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="32 requests")
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="local model folder")
    parser.add_argument("--timeout", type=float, default=3600, help="per path, seconds")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds; each runs every path once, interleaved (quick: 1)")
    parser.add_argument("--only", default="raw,run_batch,batchgen",
                        help="comma-separated subset of raw,run_batch,batchgen")
    parser.add_argument("--tuned-engine-args", metavar="JSON",
                        help="also run BatchGen with this BATCHGEN_ENGINE_ARGS, e.g. "
                             "'{\"max_num_seqs\": 256, \"max_num_batched_tokens\": 4096}'")
    parser.add_argument("--name", default="engine",
                        help="results file name (benchmarks/results/NAME.json)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--raw-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--raw-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_child:
        raw_child(args.raw_child, args.model, args.raw_out)
        return
    if not Path(args.model, "config.json").exists():
        raise SystemExit(f"no model at {args.model}: run `.venv/bin/python manage.py "
                         "prepare_model` first")
    mark_start()
    count = 32 if args.quick else args.requests
    if args.quick:
        args.repeat = 1
    only = set(args.only.split(","))

    serial = itertools.count()  # each BatchGen run gets a fresh storage folder
    with scratch_dir("engine", keep=args.keep) as work:
        input_path = work / "input.jsonl"
        write_input(input_path, count, max_tokens=args.max_tokens, model=Path(args.model).name)
        print(f"input: {count} chat requests, max_tokens {args.max_tokens}, temperature 0; "
              f"{args.repeat} round(s)", flush=True)
        steps = [("raw", lambda: run_raw(input_path, args.model, work, args.timeout)),
                 ("run_batch", lambda: run_vllm_batch(input_path, args.model, work,
                                                      args.timeout)),
                 ("batchgen", lambda: run_batchgen(input_path, args.model, work, args.timeout,
                                                   name=f"storage-{next(serial)}"))]
        if args.tuned_engine_args:
            steps.append(("batchgen_tuned", lambda: run_batchgen(
                input_path, args.model, work, args.timeout, engine_args=args.tuned_engine_args,
                name=f"storage-tuned-{next(serial)}")))
        steps = [(key, step) for key, step in steps if key.removesuffix("_tuned") in only]
        runs = run_rounds(steps, args.repeat, amount="completion_tokens", labels=LABELS)
    report(runs, count=count, args=args)


def print_cpu_table(runs: dict[str, list[dict]], labels: dict[str, str]) -> None:
    print_table("CPU seconds during each run, by process (machine busy: every process on "
                "the machine, ours and others')",
                ["path", "round", "by process", "machine busy s", "run s"],
                [[labels[k], r.get("round", i + 1), ", ".join(
                    f"{role} {v}" for role, v in r["cpu_seconds"].items() if v),
                  r["machine_busy_cpu_s"], round(r["run_s"], 1)]
                 for k, results in runs.items() for i, r in enumerate(results)])


LABELS = {"raw": "raw vLLM LLM.chat", "run_batch": "vLLM run_batch",
          "batchgen": "BatchGen end to end", "batchgen_tuned": "BatchGen, tuned engine args"}


def report(runs: dict[str, list[dict]], *, count: int, args) -> None:
    summary = summarize_rounds(runs)
    for key, results in runs.items():
        summary[key]["completion_tokens"] = results[0]["completion_tokens"]
    print_table(f"{count} chat requests, max_tokens {args.max_tokens}, temperature 0, "
                "start-up excluded (medians over the rounds)",
                ["path", "start-up s", "run s", "output tokens", "tokens/s", "min-max",
                 "rounds"],
                [[LABELS[k], v["startup_s_median"], v["run_s_median"], v["completion_tokens"],
                  v["rate_median"], f"{v['rate_min']:.0f}-{v['rate_max']:.0f}", v["rounds"]]
                 for k, v in summary.items()])
    print_cpu_table(runs, LABELS)
    ratios = {}
    for key in ("batchgen", "batchgen_tuned"):
        for base in ("raw", "run_batch"):
            ratios.update(ratios_by_round(runs, summary, key, base))
    agreement = {}
    keys = list(runs)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            agreement[f"{a}_vs_{b}"] = same_texts(runs[a][0]["texts"], runs[b][0]["texts"])
    if ratios:
        print_table("BatchGen's output tokens/s as a ratio (of medians; by round)",
                    ["ratio", "of medians", "by round"],
                    [[k, v, ratios.get(f"{k}_by_round")] for k, v in ratios.items()
                     if not k.endswith("_by_round")])
    print("identical completions (greedy), first rounds: " + ", ".join(
        f"{k} {v}/{count}" for k, v in agreement.items()))
    goals = {}
    if "batchgen_vs_raw" in ratios:
        goals["at_least_0.9x_raw"] = ratios["batchgen_vs_raw"] >= 0.9
    if "batchgen_vs_run_batch" in ratios:
        goals["at_least_1.0x_run_batch"] = ratios["batchgen_vs_run_batch"] >= 1.0
    for goal, met in goals.items():
        print(f"goal {goal}: {'MET' if met else 'NOT MET'}")
    for results in runs.values():
        for result in results:
            result.pop("texts", None)
    write_results(args.name, {
        "quick": args.quick, "requests": count, "max_tokens": args.max_tokens,
        "model": args.model, "engine_settings": ENGINE_FLAGS, "summary": summary,
        "ratios": ratios, "identical_completions": agreement, "goals": goals, "runs": runs,
    })


if __name__ == "__main__":
    main()
