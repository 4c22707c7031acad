"""A batch beside interactive traffic on one shared `vllm serve` (issue 34), in the
shape of llm-d's table (its issue #491): interactive alone; interactive with a batch
at today's fixed concurrency; interactive with the adaptive batch; the batch alone.

One `vllm serve` (the CPU flags of tests/e2e/vllm_server.py, `--scheduling-policy
priority`) and two BatchGen servers in front of it (`--engine openai-http`): one with
BATCHGEN_ADAPTIVE_CONCURRENCY=false (every request it has slots for goes to the
server, as before issue 34), one with the defaults (adaptive). All three start once.
Scenarios run one after the other in the same run:

- interactive: an OpenAI client sends streamed chat requests (max_tokens 16, vLLM's
  default priority 0) straight to vllm serve, at a steady rate (one a second) and in
  bursts (BURST requests at once every BURST_EVERY seconds); time to first token and
  the gaps between tokens are measured on the stream;
- a batch (a chat request per line, max_tokens 64, BatchGen's priority 100) is
  submitted to one BatchGen JOIN seconds into the steady window (production traffic
  is there first; the batch joins it), and the bursts window follows with the batch
  running (each burst arrives after a quiet spell, the batch at full speed); its
  requests/s are its completed lines over each window; it is then cancelled, and the
  next scenario waits for vllm serve to run nothing;
- the batch alone: the same batch with no interactive client, WARMUP seconds after
  its start, for its idle throughput. These two run first: the adaptive batch alone
  is then one that never saw other traffic (after some, its controller keeps to the
  shared rule for the hold: inference/adaptive.py).

Goals (issue 34): interactive TTFT p99 with the adaptive batch at most 1.5x the
baseline (interactive alone), the adaptive batch alone at least 0.9x the fixed one's
requests/s, and the adaptive batch still progressing under interactive load.

    flock /tmp/batchgen-heavy.lock .venv/bin/python benchmarks/colocation.py
    .venv/bin/python benchmarks/colocation.py --window 20   # shorter windows
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_MODEL,
    Server,
    machine_info,
    mark_start,
    print_table,
    scratch_dir,
    server_env,
    write_results,
)
from engine import CPU_KV_CACHE_BYTES, write_input  # noqa: E402

from inference.engines.adaptive_gate import metrics_url, parse_metrics  # noqa: E402
from tests.e2e.vllm_server import CPU_FLAGS, VllmServer  # noqa: E402

SERVED_NAME = "SmolLM2-135M-Instruct"
INTERACTIVE_TOKENS = 16
BATCH_TOKENS = 64
# The batch was 600 requests; at up to 7 requests/s here a scenario (warm-up and
# two windows) needs more, so that the batch runs to the end of every window (then
# it is cancelled).
BATCH_REQUESTS = 1500
WARMUP = 15.0  # seconds of the batch alone before its throughput is measured
JOIN = 3.0  # seconds into the steady window at which the batch is submitted
BURST = 4
BURST_EVERY = 10.0
QUESTIONS = ["What is the capital of France?", "Name three primary colours.",
             "How many legs does a spider have?", "What is 12 times 12?",
             "Say hello in Spanish.", "What colour is the sky on a clear day?"]


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def interactive_request(client: httpx.AsyncClient, url: str, number: int) -> dict:
    """One streamed chat request: its TTFT and the gaps between its tokens (s)."""
    body = {"model": SERVED_NAME, "stream": True, "max_tokens": INTERACTIVE_TOKENS,
            "temperature": 0,
            "messages": [{"role": "user", "content": QUESTIONS[number % len(QUESTIONS)]}]}
    began = time.perf_counter()
    stamps = []
    async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
        if response.status_code != 200:
            return {"error": response.status_code}
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                stamps.append(time.perf_counter())
    if not stamps:
        return {"error": "no tokens"}
    return {"ttft": stamps[0] - began, "gaps": [b - a for a, b in itertools.pairwise(stamps)]}


async def interactive(url: str, pattern: str, window: float) -> list[dict]:
    """Requests at `pattern` (steady: one a second; bursts) for `window` seconds."""
    async with httpx.AsyncClient(timeout=300) as client:
        tasks, number, began = [], 0, time.perf_counter()
        while time.perf_counter() - began < window:
            count = 1 if pattern == "steady" else BURST
            for _ in range(count):
                tasks.append(asyncio.create_task(interactive_request(client, url, number)))
                number += 1
            await asyncio.sleep(1.0 if pattern == "steady" else BURST_EVERY)
        return await asyncio.gather(*tasks)


def summarize_interactive(results: list[dict]) -> dict:
    ttfts = [r["ttft"] for r in results if "ttft" in r]
    gaps = [gap for r in results for gap in r.get("gaps", [])]
    return {"requests": len(results), "errors": sum(1 for r in results if "error" in r),
            "ttft_p50_ms": _ms(percentile(ttfts, 0.5)), "ttft_p99_ms": _ms(percentile(ttfts, 0.99)),
            "itl_p50_ms": _ms(percentile(gaps, 0.5)), "itl_p99_ms": _ms(percentile(gaps, 0.99))}


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


class Batch:
    """A batch through one BatchGen server, as its client sees it."""

    def __init__(self, server: Server, input_path: Path) -> None:
        self.http = httpx.Client(base_url=server.base_url, timeout=120)
        with input_path.open("rb") as fh:
            file = self.http.post("/v1/files", data={"purpose": "batch"},
                                  files={"file": (input_path.name, fh, "application/jsonl")})
        file.raise_for_status()
        self.file_id = file.json()["id"]
        self.id = ""

    def start(self) -> None:
        created = self.http.post("/v1/batches", json={
            "input_file_id": self.file_id, "endpoint": "/v1/chat/completions",
            "completion_window": "24h"})
        created.raise_for_status()
        self.id = created.json()["id"]

    def completed(self) -> int:
        return self.http.get(f"/v1/batches/{self.id}").json()["request_counts"]["completed"]

    def admission(self) -> list[dict]:
        return self.http.get("/v1/pool/status").json().get("adaptive_concurrency") or []

    def cancel(self) -> None:
        self.http.post(f"/v1/batches/{self.id}/cancel")
        deadline = time.monotonic() + 180
        while self.http.get(f"/v1/batches/{self.id}").json()["status"] not in (
                "cancelled", "completed", "failed", "expired"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {self.id} not ended within 180 s of its cancel")
            time.sleep(0.5)


class LimitWatch:
    """The adaptive limit, read from /v1/pool/status every second during a window."""

    def __init__(self, batch: Batch) -> None:
        self.batch, self.limits, self.modes = batch, [], {}
        self.holds, self.shed = [], []
        self._task: asyncio.Task | None = None

    async def _watch(self) -> None:
        while True:
            for worker in await asyncio.to_thread(self.batch.admission):
                self.limits.append(worker["limit"])
                self.modes[worker["mode"]] = self.modes.get(worker["mode"], 0) + 1
                self.holds.append(worker.get("hold_seconds"))
                self.shed.append(worker["shed_total"])
            await asyncio.sleep(1.0)

    async def during(self, coroutine):
        self._task = asyncio.create_task(self._watch())
        try:
            return await coroutine
        finally:
            self._task.cancel()

    def summary(self) -> dict | None:
        if not self.limits:
            return None
        holds = [hold for hold in self.holds if hold is not None]
        return {"limit_min": min(self.limits), "limit_median": statistics.median(self.limits),
                "limit_max": max(self.limits), "modes": self.modes,
                "hold_s_max": max(holds) if holds else None,
                "stopped_by_cuts": self.shed[-1] - self.shed[0]}


async def batch_joins(work, batch: Batch):
    """`work` (the interactive client), with the batch submitted JOIN s into it."""
    task = asyncio.ensure_future(work)
    await asyncio.sleep(JOIN)
    await asyncio.to_thread(batch.start)
    return await task


def wait_server_idle(vllm: VllmServer, timeout: float = 180) -> None:
    """Until vllm serve runs and queues nothing (a cancelled batch's requests gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        figures = parse_metrics(httpx.get(metrics_url(vllm.url), timeout=10).text)
        if figures and figures.running + figures.waiting == 0:
            return
        time.sleep(0.5)
    raise TimeoutError("vllm serve still busy after the batch was cancelled")


def scenario(vllm: VllmServer, batch: Batch | None, window: float, *,
             patterns: tuple[str, ...]) -> dict:
    """Each interactive pattern for `window` s beside the batch (if any). The first
    (steady) pattern is there first and the batch joins JOIN s into its window, as a
    batch joins a server that production traffic already uses; the next patterns
    (bursts) meet the batch running. The batch alone gets WARMUP s first."""
    out = {}
    joins = batch is not None and patterns[0] != "none"
    if batch is not None and not joins:
        batch.start()
        time.sleep(WARMUP)
    for index, pattern in enumerate(patterns):
        joining = joins and index == 0
        before = batch.completed() if batch is not None and not joining else 0
        began = time.perf_counter()
        watch = LimitWatch(batch) if batch else None
        if pattern == "none":
            results = asyncio.run(watch.during(asyncio.sleep(window)))
        else:
            work = interactive(vllm.url, pattern, window)
            if joining:
                work = batch_joins(work, batch)
            results = asyncio.run(watch.during(work) if watch else work)
        elapsed = time.perf_counter() - began - (JOIN if joining else 0.0)
        figures = summarize_interactive(results) if pattern != "none" else {}
        if batch is not None:
            done = batch.completed()
            if done >= BATCH_REQUESTS:
                print(f"  warning: the batch ended within the {pattern} window", flush=True)
            figures["batch_rps"] = round((done - before) / elapsed, 2)
            figures["adaptive"] = watch.summary()
        out[pattern] = figures
        print(f"  {pattern}: {figures}", flush=True)
    if batch is not None:
        batch.cancel()
    wait_server_idle(vllm)
    return out


def start_batchgen(storage: Path, url: str, **env: str) -> Server:
    server = Server(storage=storage, env=server_env(
        storage=storage, engine="openai-http", BATCHGEN_MODELS=f"{SERVED_NAME}={SERVED_NAME}",
        **env), args=["--engine-url", url])
    server.start(ready_timeout=600)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=50.0,
                        help="seconds of each interactive pattern (and of the batch alone)")
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="local model folder")
    parser.add_argument("--name", default="colocation",
                        help="results file name (benchmarks/results/NAME.json)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    mark_start()
    servers: list = []
    results: dict[str, dict] = {}
    with scratch_dir("colocation", keep=args.keep) as work:
        input_path = work / "input.jsonl"
        write_input(input_path, BATCH_REQUESTS, max_tokens=BATCH_TOKENS, model=SERVED_NAME)
        try:
            vllm = VllmServer(model_dir=Path(args.model), log_path=work / "vllm-serve.log",
                              served_name=SERVED_NAME,
                              flags=[*CPU_FLAGS, "--kv-cache-memory-bytes",
                                     str(CPU_KV_CACHE_BYTES)])
            servers.append(vllm)
            vllm.start().wait_ready(900)
            fixed = start_batchgen(work / "storage-fixed", vllm.url,
                                   BATCHGEN_ADAPTIVE_CONCURRENCY="false")
            servers.append(fixed)
            adaptive = start_batchgen(work / "storage-adaptive", vllm.url)
            servers.append(adaptive)
            batches = {"fixed": Batch(fixed, input_path), "adaptive": Batch(adaptive, input_path)}
            print("vllm serve and both BatchGen servers up", flush=True)
            # The batch alone first: the adaptive one before it has seen any other
            # traffic (after some, it keeps to the shared rule for the hold, 30-120 s;
            # the fixed batch is other traffic to it, too).
            for key in ("adaptive", "fixed"):
                print(f"batch {key} alone ...", flush=True)
                results[f"batch_alone_{key}"] = scenario(vllm, batches[key], args.window,
                                                         patterns=("none",))["none"]
            both = ("steady", "bursts")
            for key, batch in [("alone", None), ("fixed", batches["fixed"]),
                               ("adaptive", batches["adaptive"])]:
                print(f"interactive, batch {key} ...", flush=True)
                results[f"interactive_{key}"] = scenario(vllm, batch, args.window,
                                                         patterns=both)
        finally:
            for server in reversed(servers):
                server.stop()
    report(results, args)


def report(results: dict[str, dict], args) -> None:
    labels = {"alone": "interactive alone (baseline)",
              "fixed": "with batch, fixed concurrency (before)",
              "adaptive": "with batch, adaptive concurrency"}
    rows, goals = [], {}
    for pattern in ("steady", "bursts"):
        base = results["interactive_alone"][pattern]["ttft_p99_ms"]
        for key, label in labels.items():
            figures = results[f"interactive_{key}"][pattern]
            p99 = figures["ttft_p99_ms"]
            ratio = round(p99 / base, 2) if base and p99 else None
            figures["ttft_p99_vs_alone"] = ratio
            limits = figures.get("adaptive") or {}
            rows.append([pattern, label, figures["ttft_p50_ms"], figures["ttft_p99_ms"], ratio,
                         figures["itl_p99_ms"], figures.get("batch_rps", "-"),
                         f"{limits.get('limit_min')}-{limits.get('limit_max')}"
                         if limits else "-", figures["errors"]])
        adaptive = results["interactive_adaptive"][pattern]
        goals[f"ttft_p99_at_most_1.5x_{pattern}"] = bool(
            adaptive["ttft_p99_vs_alone"] is not None and adaptive["ttft_p99_vs_alone"] <= 1.5)
        goals[f"batch_progresses_{pattern}"] = adaptive["batch_rps"] > 0
    alone_fixed = results["batch_alone_fixed"]["batch_rps"]
    alone_adaptive = results["batch_alone_adaptive"]["batch_rps"]
    throughput = round(alone_adaptive / alone_fixed, 2) if alone_fixed else None
    goals["batch_alone_at_least_0.9x_fixed"] = bool(throughput and throughput >= 0.9)
    write_results(args.name, {
        "window_s": args.window, "warmup_s": WARMUP, "batch_requests": BATCH_REQUESTS,
        "batch_max_tokens": BATCH_TOKENS, "interactive_max_tokens": INTERACTIVE_TOKENS,
        "burst": BURST, "burst_every_s": BURST_EVERY, "vllm_serve_flags": CPU_FLAGS,
        "machine": machine_info(), "results": results,
        "adaptive_vs_fixed_alone": throughput, "goals": goals,
    })

    print_table(f"interactive streamed chat (max_tokens {INTERACTIVE_TOKENS}) beside a "
                f"{BATCH_REQUESTS}-request batch (max_tokens {BATCH_TOKENS}), "
                f"{args.window:g} s windows",
                ["pattern", "scenario", "TTFT p50 ms", "TTFT p99 ms", "p99 vs alone",
                 "ITL p99 ms", "batch req/s", "adaptive limit", "errors"], rows)
    print_table("the batch alone (idle throughput)", ["batch", "req/s", "adaptive limit"],
                [["fixed concurrency", alone_fixed, "-"],
                 ["adaptive", alone_adaptive, results["batch_alone_adaptive"].get("adaptive")]])
    print(f"\nadaptive / fixed throughput alone: {throughput}")
    for goal, met in goals.items():
        print(f"goal {goal}: {'MET' if met else 'NOT MET'}")


if __name__ == "__main__":
    main()
