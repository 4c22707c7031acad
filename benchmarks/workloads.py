"""Batches that look like real ones: BatchGen against raw vLLM and vLLM's `run_batch`
on five workloads (issue 15).

Workloads (sizes at --scale 1; every count scales with --scale):

  a  short unique prompts: 192 one-line questions, max_tokens 64 (engine.py's kind);
  b  a support desk: 160 chat requests over 8 system prompts of about 450 tokens,
     shuffled, one short user question each, max_tokens 16-64;
  c  more prefix than the KV cache holds: 480 requests over 24 system prompts of
     about 2,000 tokens, shuffled, max_tokens 16-32. The prefixes come to about 48k
     tokens, twice the 23,296 tokens of the 1 GiB KV cache every path has (the
     issue's example, 1,000 requests over 32 prefixes of 1-2k tokens, is the same
     ratio; it takes over an hour a path on this 2-core machine);
  d  a long tail of output lengths: 96 requests, 85 % asking max_tokens 16-48 and
     15 % 256-384 of prompts that make the model write at length;
  e  many small batches at once: 16 batches of 12 short requests, max_tokens 48,
     all created together (raw vLLM and run_batch get their concatenation, one
     call / one file: the best either can do with them).

Paths, run in interleaved rounds (round 1: raw, run_batch, BatchGen; round 2 ...):

  raw       `LLM.chat` with every request of a workload, in a child process that runs
            the workloads one after the other on one engine (by default only a,
            where its goal is: --raw-workloads);
  run_batch vLLM's batch runner in-process: its own argument parser, engine client
            and `run_batch(engine_client, args)` (what `python -m
            vllm.entrypoints.openai.run_batch` runs), once per workload on one warm
            engine per round, as BatchGen runs on a warm server;
  batchgen  `manage.py serve` (vllm engine), one warm server per round running the
            workloads one after the other;
            upload every file, create every batch, poll every 0.25 s, download;
  batchgen_nogroup  (c only) BatchGen with BATCHGEN_PREFIX_GROUPING=false, its own
            server;
  batchgen_shared   (all but c) BatchGen with BATCHGEN_ENGINE_CPU_ISOLATION=false, its
            own server: its processes and vLLM's scheduler may run on the CPU vLLM
            computes on (batchgen_site/cpu_placement.py).

The paths of a workload run in an order that moves by one place each round (round 1:
raw, run_batch, BatchGen ...; round 2: run_batch, BatchGen ..., raw), so none is always
the first or the last one of a round on a machine whose speed drifts.

All paths get BatchGen's CPU engine settings (float32, enforce_eager, prefix caching,
generation_config vllm, 1 GiB KV cache unless --kv-tokens says otherwise) and the batch runner's
scheduler limits (128 sequences, 2,048 batched tokens).

Reported per path and workload: output tokens/s and requests/s over the run, the
prefix-cache hit rate (cached prompt tokens / prompt tokens, from each answer's
usage.prompt_tokens_details or RequestOutput.num_cached_tokens), the engine's
running-set size over time (vLLM's stats logger, VLLM_LOG_STATS_INTERVAL=1: running,
waiting, KV cache usage, preemptions), CPU seconds per process and the load average.

Goals (issue 15): BatchGen >= 1.0x run_batch on every workload, >= 1.3x on c,
>= 0.95x raw on a; grouping on vs off on c in the same run; CPU placement on vs
off on the others.

    .venv/bin/python benchmarks/workloads.py                    # scale 1, 3 rounds
    .venv/bin/python benchmarks/workloads.py --scale 0.25 --rounds 1 --workloads b,c
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

os.environ["VLLM_LOG_STATS_INTERVAL"] = "1"  # the running set, once a second
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_MODEL,
    mark_start,
    print_table,
    running_server,
    scratch_dir,
    server_cpu_seconds,
    wait_for_quiet,
    write_results,
)
from engine import (  # noqa: E402
    CPU_KV_CACHE_BYTES,
    ENGINE_FLAGS,
    TEMPLATES,
    TOPICS,
    answered,
    cpu_delta,
    load_avg,
    machine_busy,
    tree_cpu,
)

CHAT = "/v1/chat/completions"
# Before each measured run, wait at most this long for the machine to be quiet: on a
# machine shared with other work it rarely is, and waiting longer only stretches the run.
QUIET_WAIT = 15
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 4  # SmolLM2-135M, float32: layers x K,V x heads x dim
WORKLOADS = ("a", "b", "c", "d", "e")
TITLES = {"a": "short unique prompts", "b": "support desk, 8 shared system prompts",
          "c": "many long prefixes, small KV cache", "d": "long tail of output lengths",
          "e": "many small batches at once"}
LABELS = {"raw": "raw vLLM LLM.chat", "run_batch": "vLLM run_batch",
          "batchgen": "BatchGen", "batchgen_nogroup": "BatchGen, grouping off",
          "batchgen_shared": "BatchGen, CPU placement off"}
PATHS = tuple(LABELS)
VOCABULARY = (
    "policy customer order refund invoice shipping warranty account billing support product "
    "service quality delivery payment schedule contract renewal return exchange discount "
    "subscription password login security address phone email manager escalation ticket "
    "priority response resolution agent store online delay tracking package damaged missing "
    "replacement credit card bank transfer receipt tax region holiday hours weekend premium "
    "basic plan upgrade downgrade cancel notice period fee charge balance statement").split()
QUESTIONS = ("How do I get a refund for order {}?", "My package {} is late, what now?",
             "Can I change the address of order {}?", "Why was I charged twice on {}?",
             "How do I cancel subscription {}?", "Is item {} still under warranty?",
             "Where is my receipt for payment {}?", "Can I upgrade plan {} today?")
LONG_ASKS = ("Write a detailed essay about {}.", "Tell a long story that involves {}.",
             "Explain {} step by step, in depth, with examples.")


# --- the workloads ----------------------------------------------------------------------


def _line(custom_id: str, model: str, messages: list[dict], max_tokens: int) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": model, "temperature": 0, "max_tokens": max_tokens,
                     "messages": messages}}


def system_prompt(group: int, tokens: int, seed: str) -> str:
    rng = random.Random(f"{seed}-{group}")
    words = []
    while len(words) < tokens * 0.8:  # about 1.25 tokens a word with these words
        sentence = [rng.choice(VOCABULARY) for _ in range(rng.randint(6, 14))]
        words.extend([*sentence[:-1], sentence[-1] + "."])
    return (f"You are support assistant number {group} of a company. Follow the handbook. "
            + " ".join(words))


def shared_prefix_lines(tag: str, model: str, *, requests: int, prefixes: int,
                        prefix_tokens: int, out: tuple[int, int]) -> list[dict]:
    rng = random.Random(tag)
    systems = [system_prompt(g, prefix_tokens, tag) for g in range(prefixes)]
    lines = []
    for i in range(requests):
        group = i % prefixes
        question = QUESTIONS[rng.randrange(len(QUESTIONS))].format(f"{tag}{i}")
        lines.append(_line(f"{tag}-{group}-{i}", model, [
            {"role": "system", "content": systems[group]},
            {"role": "user", "content": question}], rng.randint(*out)))
    rng.shuffle(lines)
    return lines


def short_lines(tag: str, model: str, count: int, max_tokens: int, offset: int = 0) -> list[dict]:
    prompts = [t.format(topic) for t in TEMPLATES for topic in TOPICS]
    lines = []
    for i in range(offset, offset + count):
        # Unique prompts, different from every other workload's (no prefix-cache help).
        prompt = f"[{tag}{i}] {prompts[i % len(prompts)]}"
        lines.append(_line(f"{tag}-{i}", model, [{"role": "user", "content": prompt}],
                           max_tokens))
    return lines


def long_tail_lines(model: str, count: int) -> list[dict]:
    rng = random.Random("d")
    lines = []
    for i in range(count):
        topic = TOPICS[i % len(TOPICS)]
        if rng.random() < 0.15:
            prompt, max_tokens = LONG_ASKS[i % len(LONG_ASKS)].format(topic), rng.randint(256, 384)
        else:
            prompt, max_tokens = TEMPLATES[i % len(TEMPLATES)].format(topic), rng.randint(16, 48)
        lines.append(_line(f"d-{i}", model, [{"role": "user", "content": f"[d{i}] {prompt}"}],
                           max_tokens))
    return lines


def build_workloads(work: Path, model: str, scale: float, c_shape: tuple[int, int, int]
                    ) -> dict[str, dict]:
    """Every workload's input files: `batches` (what BatchGen gets: one file, or
    several for e) and `joined` (raw and run_batch: one file)."""
    n = lambda count: max(2, round(count * scale))  # noqa: E731
    made = {
        "a": [short_lines("a", model, n(192), 64)],
        "b": [shared_prefix_lines("b", model, requests=n(160), prefixes=8, prefix_tokens=450,
                                  out=(16, 64))],
        "c": [shared_prefix_lines("c", model, requests=c_shape[0] or n(480),
                                  prefixes=c_shape[1], prefix_tokens=c_shape[2], out=(16, 32))],
        "d": [long_tail_lines(model, n(96))],
        "e": [short_lines(f"e{b}-", model, n(12), 48) for b in range(16)],
    }
    workloads = {}
    for name, batches in made.items():
        paths = []
        for index, lines in enumerate(batches):
            path = work / f"{name}-{index}.jsonl"
            path.write_text("".join(json.dumps(line) + "\n" for line in lines))
            paths.append(path)
        joined = paths[0]
        if len(paths) > 1:
            joined = work / f"{name}-all.jsonl"
            joined.write_bytes(b"".join(p.read_bytes() for p in paths))
        workloads[name] = {
            "batches": paths, "joined": joined,
            "requests": sum(len(b) for b in batches),
        }
    return workloads


# --- reading what vLLM said --------------------------------------------------------------


STATS = re.compile(
    r"(\d\d-\d\d \d\d:\d\d:\d\d) \[loggers\.py:\d+\] .*?Running: (\d+) reqs, "
    r"Waiting: (\d+) reqs(?:, Deferred: \d+ reqs)?(?:, Preemptions: (\d+))?.*?"
    r"KV cache usage: ([\d.]+)%")


def engine_series(log: Path, start: float, end: float, skip: int = 0) -> dict:
    """vLLM's stats lines (one a second) logged between `start` and `end` (epoch
    seconds): the running set, the waiting queue and the KV cache usage over time.
    `skip`: bytes of the log to pass over (a log several runs share)."""
    year = dt.datetime.now().year
    series = []
    preemptions = 0
    with log.open("rb") as fh:
        fh.seek(skip)
        text = fh.read().decode(errors="replace")
    for match in STATS.finditer(text):
        stamp = dt.datetime.strptime(f"{year}-{match[1]}", "%Y-%m-%d %H:%M:%S").timestamp()
        if start - 1 <= stamp <= end + 1:
            series.append((round(stamp - start), int(match[2]), int(match[3]),
                           float(match[5])))
            preemptions += int(match[4] or 0)
    return summarise_series(series, preemptions)


def summarise_series(series: list[tuple], preemptions: int) -> dict:
    busy = [s for s in series if s[1]]
    return {
        "running_mean": round(statistics.mean(s[1] for s in busy), 1) if busy else 0,
        "running_max": max((s[1] for s in series), default=0),
        "waiting_mean": round(statistics.mean(s[2] for s in busy), 1) if busy else 0,
        "kv_usage_max_percent": max((s[3] for s in series), default=0.0),
        "preemptions": preemptions,
        # (seconds into the run, running, waiting, KV cache usage %)
        "series": series,
    }


def running_profile(series: list, run_s: float, points: int = 10) -> list[int]:
    """vLLM's running count at each `points`-th of a run: the stats line nearest the
    middle of each slice (0 where none was logged)."""
    profile = []
    for k in range(points):
        at = run_s * (k + 0.5) / points
        near = min(series, key=lambda s: abs(s[0] - at), default=None)
        profile.append(near[1] if near is not None and abs(near[0] - at) <= 1.5 else 0)
    return profile


def read_answers(lines: list[bytes]) -> dict:
    completion = prompt = cached = 0
    bodies, errors = answered(lines)
    for _custom_id, body in bodies:
        usage = body["usage"]
        completion += usage["completion_tokens"]
        prompt += usage["prompt_tokens"]
        cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"requests_answered": len(bodies), "completion_tokens": completion,
            "prompt_tokens": prompt, "cached_tokens": cached, "errors": errors}


# --- 1. raw vLLM: one child process runs several workloads --------------------------------


def raw_child(spec_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    common = dict(model=spec["model"], dtype="float32", enforce_eager=True,
                  kv_cache_memory_bytes=spec["kv_bytes"], enable_prefix_caching=True,
                  generation_config="vllm", disable_log_stats=False)
    served = AsyncEngineArgs(**common).create_engine_config(
        usage_context=UsageContext.OPENAI_BATCH_RUNNER).scheduler_config
    started = time.perf_counter()
    llm = LLM(**common, max_num_seqs=served.max_num_seqs,
              max_num_batched_tokens=served.max_num_batched_tokens)
    results = {"startup_s": time.perf_counter() - started, "workloads": {}}
    for name, path in spec["workloads"]:
        requests = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
        params = [SamplingParams(temperature=r["body"]["temperature"],
                                 max_tokens=r["body"]["max_tokens"]) for r in requests]
        load_before = load_avg()
        cpu_before, busy_before = tree_cpu(os.getpid()), machine_busy()
        wall0, started = time.time(), time.perf_counter()
        outputs = llm.chat([r["body"]["messages"] for r in requests], params, use_tqdm=False)
        run = time.perf_counter() - started
        results["workloads"][name] = {
            "run_s": run, "wall_start": wall0, "wall_end": time.time(),
            "cpu_seconds": cpu_delta(tree_cpu(os.getpid()), cpu_before),
            "machine_busy_cpu_s": round(machine_busy() - busy_before, 1),
            "load_avg_before": load_before, "load_avg_after": load_avg(),
            "requests_answered": len(outputs),
            "completion_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
            "prompt_tokens": sum(len(o.prompt_token_ids) for o in outputs),
            "cached_tokens": sum(o.num_cached_tokens or 0 for o in outputs),
            "errors": 0,
        }
        print(f"raw {name} done in {run:.1f} s", flush=True)
    spec_path.with_suffix(".out.json").write_text(json.dumps(results))


def run_raw(names: list[str], workloads: dict, kv_bytes: int, model: str, work: Path,
            tag: str, timeout: float) -> dict[str, dict]:
    return run_child("raw", work / f"raw-{tag}", timeout, {
        "model": model, "kv_bytes": kv_bytes,
        "workloads": [(name, str(workloads[name]["joined"])) for name in names]})


def run_child(kind: str, base: Path, timeout: float, spec: dict) -> dict[str, dict]:
    """This script as a child (`--raw-child` or `--run-batch-child`) on `spec`; its
    figures per workload, with the engine's series read from its log."""
    spec_path, log = base.with_suffix(".json"), base.with_suffix(".log")
    spec_path.write_text(json.dumps(spec))
    with log.open("wb") as fh:
        subprocess.run([sys.executable, __file__, f"--{kind}-child", str(spec_path)],
                       stdout=fh, stderr=subprocess.STDOUT, check=True, timeout=timeout)
    result = json.loads(spec_path.with_suffix(".out.json").read_text())
    for found in result["workloads"].values():
        found["startup_s"] = result["startup_s"]
        found["engine"] = engine_series(log, found["wall_start"], found["wall_end"])
    return result["workloads"]


# --- 2. run_batch: one warm engine runs several workloads ---------------------------------


def run_batch_child(spec_path: Path) -> None:
    """vLLM's batch runner in-process: its own argument parser, engine client and
    `run_batch(engine_client, args)` (what `python -m vllm.entrypoints.openai.run_batch`
    runs), called once per workload on one engine, like BatchGen's warm server. The
    periodic stats line `vllm serve` logs is logged here the same way."""
    import asyncio

    from vllm import envs
    from vllm.entrypoints.launchers import run_batch as runner
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
    from vllm.usage.usage_lib import UsageContext

    spec = json.loads(spec_path.read_text())
    first = spec["workloads"][0]
    sys.argv = ["run_batch", "-i", first[1], "-o", first[2], *spec["argv"]]
    args = runner.parse_args()
    runner.validate_run_batch_args(args)

    async def log_stats(client) -> None:
        while True:
            await asyncio.sleep(envs.VLLM_LOG_STATS_INTERVAL)
            await client.do_log_stats()

    async def go() -> dict:
        started = time.perf_counter()
        async with build_async_engine_client(
                args, usage_context=UsageContext.OPENAI_BATCH_RUNNER) as client:
            results = {"startup_s": time.perf_counter() - started, "workloads": {}}
            stats = asyncio.create_task(log_stats(client))
            for name, input_path, output_path in spec["workloads"]:
                args.input_file, args.output_file = input_path, output_path
                load_before = load_avg()
                cpu_before, busy_before = tree_cpu(os.getpid()), machine_busy()
                wall0, t0 = time.time(), time.perf_counter()
                await runner.run_batch(client, args)
                run = time.perf_counter() - t0
                results["workloads"][name] = {
                    "run_s": run, "wall_start": wall0, "wall_end": time.time(),
                    "cpu_seconds": cpu_delta(tree_cpu(os.getpid()), cpu_before),
                    "machine_busy_cpu_s": round(machine_busy() - busy_before, 1),
                    "load_avg_before": load_before, "load_avg_after": load_avg(),
                    **read_answers(Path(output_path).read_bytes().splitlines()),
                }
                print(f"run_batch {name} done in {run:.1f} s", flush=True)
            stats.cancel()
        return results

    spec_path.with_suffix(".out.json").write_text(json.dumps(asyncio.run(go())))


def run_run_batch(names: list[str], workloads: dict, kv_bytes: int, model: str, work: Path,
                  tag: str, timeout: float) -> dict[str, dict]:
    flags = {**ENGINE_FLAGS, "--kv-cache-memory-bytes": str(kv_bytes),
             "--enable-prompt-tokens-details": None, "--served-model-name": Path(model).name,
             "--model": model}
    argv = []
    for flag, value in flags.items():
        argv += [flag] if value is None else [flag, value]
    return run_child("run-batch", work / f"run_batch-{tag}", timeout, {"argv": argv, "workloads": [
        (name, str(workloads[name]["joined"]), str(work / f"run_batch-{tag}-{name}.out.jsonl"))
        for name in names]})


# --- 3. BatchGen: one warm server runs several workloads ------------------------------------


def run_batchgen(names: list[str], workloads: dict, kv_bytes: int, model: str, work: Path,
                 tag: str, timeout: float, *, grouping: bool = True,
                 placement: bool = True) -> dict[str, dict]:
    env = {"BATCHGEN_MODEL": model, "BATCHGEN_PREFIX_GROUPING": str(grouping).lower(),
           "BATCHGEN_ENGINE_CPU_ISOLATION": str(placement).lower()}
    if kv_bytes != CPU_KV_CACHE_BYTES:
        env["BATCHGEN_ENGINE_ARGS"] = json.dumps({"kv_cache_memory_bytes": kv_bytes})
    found = {}
    started = time.perf_counter()
    with running_server(work / f"storage-{tag}", engine="vllm", ready_timeout=900,
                        **env) as server, \
            httpx.Client(base_url=server.base_url, timeout=600) as http:
        startup = time.perf_counter() - started
        for name in names:
            noise = wait_for_quiet(timeout=QUIET_WAIT)
            log_size = server.log_path.stat().st_size
            load_before = load_avg()
            cpu_before, busy_before = server_cpu_seconds(server), machine_busy()
            wall0, t0 = time.time(), time.perf_counter()
            # All of e's files first, then its 16 batches back to back: created
            # together, as a client with many batches ready submits them.
            files = [_upload(http, path) for path in workloads[name]["batches"]]
            batches = [_create_batch(http, file_id) for file_id in files]
            done = _wait_all(http, [b["id"] for b in batches], timeout)
            contents = []
            finished = {}
            for batch in done:
                content = http.get(f"/v1/files/{batch['output_file_id']}/content")
                content.raise_for_status()
                contents.extend(content.content.splitlines())
                finished[batch["id"]] = time.perf_counter() - t0
            run = time.perf_counter() - t0
            wall1 = time.time()
            found[name] = {
                "startup_s": startup, "run_s": run, "wall_start": wall0, "wall_end": wall1,
                "cpu_seconds": cpu_delta(server_cpu_seconds(server), cpu_before),
                "machine_busy_cpu_s": round(machine_busy() - busy_before, 1),
                "load_avg_before": load_before, "load_avg_after": load_avg(),
                "noise_before_run": noise,
                "batches": len(batches),
                "batch_done_s": sorted(round(v, 2) for v in finished.values()),
                **read_answers(contents),
                "engine": engine_series(server.log_path, wall0, wall1, skip=log_size),
            }
            print(f"  batchgen {name}: {run:.1f} s", flush=True)
    return found


def _upload(http: httpx.Client, path: Path) -> str:
    with path.open("rb") as fh:
        file = http.post("/v1/files", data={"purpose": "batch"},
                         files={"file": (path.name, fh, "application/jsonl")})
    file.raise_for_status()
    return file.json()["id"]


def _create_batch(http: httpx.Client, file_id: str) -> dict:
    batch = http.post("/v1/batches", json={"input_file_id": file_id, "endpoint": CHAT,
                                           "completion_window": "24h"})
    batch.raise_for_status()
    return batch.json()


def _wait_all(http: httpx.Client, ids: list[str], timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    done: dict[str, dict] = {}
    while len(done) < len(ids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"BatchGen batches not done after {timeout} s")
        time.sleep(0.25)
        for batch_id in ids:
            if batch_id in done:
                continue
            batch = http.get(f"/v1/batches/{batch_id}").json()
            if batch["status"] in ("failed", "cancelled", "expired"):
                raise RuntimeError(f"batch ended {batch['status']}: "
                                   f"{str(batch.get('errors'))[:500]}")
            if batch["status"] == "completed":
                done[batch_id] = batch
            else:
                break  # the others are not done either, most likely: ask again later
    return [done[i] for i in ids]


# --- the run --------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplies every workload's request count")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--kv-tokens", type=int, default=0,
                        help="KV cache of every path, in tokens (default: BatchGen's 1 GiB)")
    parser.add_argument("--c-kv-tokens", type=int, default=0,
                        help="KV cache of workload c alone, in tokens, on an engine of its "
                             "own (default: --kv-tokens)")
    parser.add_argument("--c-requests", type=int, default=0,
                        help="requests of workload c (default 480 x scale)")
    parser.add_argument("--c-prefixes", type=int, default=24)
    parser.add_argument("--c-prefix-tokens", type=int, default=2000)
    parser.add_argument("--raw-workloads", default="a",
                        help="workloads raw vLLM runs too (its goal is on a only)")
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--timeout", type=float, default=1800, help="per run, seconds")
    parser.add_argument("--name", default="workloads")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--from-json", type=Path,
                        help="print the tables of an earlier run's results file, run nothing")
    parser.add_argument("--raw-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--run-batch-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_child:
        raw_child(args.raw_child)
        return
    if args.run_batch_child:
        run_batch_child(args.run_batch_child)
        return
    if args.from_json:
        report(json.loads(args.from_json.read_text())["runs"])
        return
    mark_start()
    chosen = [w for w in WORKLOADS if w in args.workloads.split(",")]
    paths = args.paths.split(",")
    runs: dict[str, dict[str, list[dict]]] = {}  # workload -> path -> rounds

    def keep(path: str, results: dict[str, dict]) -> None:
        for name, result in results.items():
            result["tokens_per_s"] = result["completion_tokens"] / result["run_s"]
            result["requests_per_s"] = result["requests_answered"] / result["run_s"]
            result["prefix_hit_rate"] = (round(result["cached_tokens"] / result["prompt_tokens"], 3)
                                         if result["prompt_tokens"] else 0.0)
            runs.setdefault(name, {}).setdefault(path, []).append(result)
            print(f"  {path} {name}: {result['completion_tokens']} tokens in "
                  f"{result['run_s']:.1f} s = {result['tokens_per_s']:.0f} tokens/s, hit rate "
                  f"{result['prefix_hit_rate']}, running mean "
                  f"{result['engine']['running_mean']}, load {result['load_avg_after']}",
                  flush=True)

    t_start = time.monotonic()
    with scratch_dir("workloads", keep=args.keep) as work:
        # The name BatchGen serves the model by (its folder's); run_batch is told the same.
        workloads = build_workloads(work, Path(args.model).name, args.scale,
                                    (args.c_requests, args.c_prefixes, args.c_prefix_tokens))
        kv = args.kv_tokens * KV_BYTES_PER_TOKEN if args.kv_tokens else CPU_KV_CACHE_BYTES
        c_kv = args.c_kv_tokens * KV_BYTES_PER_TOKEN if args.c_kv_tokens else kv
        # Workloads on one cache share an engine (a server) per path and round; c may
        # have a smaller cache of its own, so the others run at BatchGen's default.
        caches: dict[int, list[str]] = {}
        for name in chosen:
            caches.setdefault(c_kv if name == "c" else kv, []).append(name)
        raw_only = args.raw_workloads.split(",")
        for round_no in range(1, args.rounds + 1):
            for index, (cache, names) in enumerate(caches.items()):
                tag = f"{round_no}-{index}"
                # Each path runs the workloads of this cache that it runs, on one warm
                # engine (or server); the paths' order moves by one each round.
                runs_of = {
                    "raw": [w for w in names if w in raw_only],
                    "run_batch": names,
                    "batchgen": names,
                    "batchgen_nogroup": [w for w in names if w == "c"],
                    "batchgen_shared": [w for w in names if w != "c"],
                }
                order = [p for p in PATHS if p in paths and runs_of[p]]
                shift = (round_no - 1) % len(order) if order else 0
                for path in order[shift:] + order[:shift]:
                    group = runs_of[path]
                    print(f"round {round_no}: {path} {group}", flush=True)
                    if path == "raw":
                        wait_for_quiet(timeout=QUIET_WAIT)
                        found = run_raw(group, workloads, cache, args.model, work, tag,
                                        args.timeout)
                    elif path == "run_batch":
                        wait_for_quiet(timeout=QUIET_WAIT)
                        found = run_run_batch(group, workloads, cache, args.model, work, tag,
                                              args.timeout)
                    else:
                        found = run_batchgen(group, workloads, cache, args.model, work,
                                             f"{tag}-{path}", args.timeout,
                                             grouping=path != "batchgen_nogroup",
                                             placement=path != "batchgen_shared")
                    keep(path, found)
            # What the rounds so far gave, in case the run is cut short.
            elapsed = time.monotonic() - t_start
            print(f"after round {round_no}: {elapsed / 60:.1f} min")
            write_results(args.name, {
                "scale": args.scale, "rounds": args.rounds, "rounds_done": round_no,
                "c_shape": {"requests": args.c_requests or None, "prefixes": args.c_prefixes,
                            "prefix_tokens": args.c_prefix_tokens},
                "kv_tokens": args.kv_tokens or None,
                "c_kv_tokens": args.c_kv_tokens or args.kv_tokens or None,
                "elapsed_min": round(elapsed / 60, 1), "model": args.model,
                "workloads": {k: {"title": TITLES[k], "requests": v["requests"],
                                  "batches": len(v["batches"])}
                              for k, v in workloads.items()},
                **report(runs), "runs": runs,
            })


def report(runs: dict) -> dict:
    """Print the tables of `runs` (workload -> path -> one result a round); return the
    medians, the ratios and the goals."""
    summary: dict[str, dict] = {}
    rows = []
    for name, by_path in runs.items():
        for path, results in by_path.items():
            def med(key: str, group: str | None = None, results=results) -> float:
                return statistics.median(r[group][key] if group else r[key] for r in results)

            entry = {
                "rounds": len(results),
                "tokens_per_s_median": round(med("tokens_per_s"), 1),
                "tokens_per_s_by_round": [round(r["tokens_per_s"], 1) for r in results],
                "requests_per_s_median": round(med("requests_per_s"), 2),
                "run_s_median": round(med("run_s"), 1),
                "completion_tokens": results[0]["completion_tokens"],
                "prefix_hit_rate_median": med("prefix_hit_rate"),
                "running_mean_median": med("running_mean", "engine"),
                "running_max": max(r["engine"]["running_max"] for r in results),
                "waiting_mean_median": med("waiting_mean", "engine"),
                "kv_usage_max_percent": max(r["engine"]["kv_usage_max_percent"] for r in results),
                "preemptions": [r["engine"]["preemptions"] for r in results],
                "load_avg": [r["load_avg_after"] for r in results],
            }
            summary.setdefault(name, {})[path] = entry
            rows.append([name, LABELS[path], entry["run_s_median"], entry["completion_tokens"],
                         entry["tokens_per_s_median"],
                         " ".join(f"{v:.0f}" for v in entry["tokens_per_s_by_round"]),
                         entry["requests_per_s_median"], entry["prefix_hit_rate_median"],
                         entry["running_mean_median"], entry["running_max"],
                         entry["waiting_mean_median"], entry["kv_usage_max_percent"],
                         sum(entry["preemptions"]),
                         " ".join(f"{v:.1f}" for v in entry["load_avg"])])
    print_table("Medians over the rounds (start-up excluded)",
                ["wl", "path", "run s", "out tokens", "tok/s", "by round", "req/s", "hit rate",
                 "running mean", "max", "waiting mean", "KV max %", "preempt", "load 1m"], rows)
    ratios, goals = {}, {}
    for name, by_path in summary.items():
        for path in ("batchgen", "batchgen_nogroup", "batchgen_shared"):
            for base in ("raw", "run_batch", "batchgen_nogroup", "batchgen_shared"):
                if path in by_path and base in by_path and path != base:
                    key = f"{name}: {path} / {base}"
                    ratios[key] = {
                        "of_medians": round(by_path[path]["tokens_per_s_median"]
                                            / by_path[base]["tokens_per_s_median"], 3),
                        "by_round": [round(a["tokens_per_s"] / b["tokens_per_s"], 3) for a, b in
                                     zip(runs[name][path], runs[name][base], strict=False)]}
        if "batchgen" in by_path and "run_batch" in by_path:
            want = 1.3 if name == "c" else 1.0
            goals[f"{name}: >= {want}x run_batch"] = (
                ratios[f"{name}: batchgen / run_batch"]["of_medians"] >= want)
        if name == "a" and "raw" in by_path and "batchgen" in by_path:
            goals["a: >= 0.95x raw"] = ratios["a: batchgen / raw"]["of_medians"] >= 0.95
    print_table("BatchGen's output tokens/s as a ratio",
                ["ratio", "of medians", "by round"],
                [[k, v["of_medians"], " ".join(f"{x:.2f}" for x in v["by_round"])]
                 for k, v in ratios.items()])
    cpu_rows = []
    for name, by_path in runs.items():
        for path, results in by_path.items():
            roles: dict[str, list[float]] = {}
            for r in results:
                for role, value in r["cpu_seconds"].items():
                    roles.setdefault(role, []).append(value)
            cpu_rows.append([name, LABELS[path], ", ".join(
                f"{role} {statistics.median(v):.1f}" for role, v in roles.items()
                if statistics.median(v) >= 0.05),
                statistics.median(r["machine_busy_cpu_s"] for r in results),
                statistics.median(r["run_s"] for r in results)])
    print_table("CPU seconds during the run by process (medians; machine busy = every "
                "process on the machine)", ["wl", "path", "by process", "machine busy s",
                                            "run s"], cpu_rows)
    profile_rows = []
    for name, by_path in runs.items():
        for path, results in by_path.items():
            middle = sorted(results, key=lambda r: r["run_s"])[len(results) // 2]
            profile_rows.append([name, LABELS[path], round(middle["run_s"], 1), " ".join(
                f"{v:>3}" for v in running_profile(middle["engine"]["series"], middle["run_s"]))])
    print_table("The running set over the run (vLLM's running requests at each tenth of "
                "the median round's run)", ["wl", "path", "run s", "running, by tenth"],
                profile_rows)
    for goal, met in goals.items():
        print(f"goal {goal}: {'MET' if met else 'NOT MET'}")
    return {"summary": summary, "ratios": ratios, "goals": goals}
if __name__ == "__main__":
    main()
