"""Rerank throughput: BatchGen against vLLM's own batch runner (issue 38).

The same rerank batch (default 2,000 lines: a query and 5-20 candidate documents each,
seeded) on the same model (the bundled all-MiniLM-L6-v2, which vLLM scores by the
cosine of the query's and each document's embeddings) runs two ways, in interleaved
rounds (default 3; the path that goes first alternates), in one run:

1. vLLM's batch runner: `python -m vllm.entrypoints.openai.run_batch`, which serves
   `/rerank` lines (any url ending in /rerank) through its `ServingScores`;
2. BatchGen end to end: `manage.py serve` with the vllm engine on the same model;
   upload, create (endpoint /v1/rerank), wait, download.

Both get the settings BatchGen's engine uses on a CPU (benchmarks/embeddings.py's
ENGINE_FLAGS). Start-up is reported apart; the figure is documents scored per second
of the run (run_batch: from its "Reading batch from" line to its output file;
BatchGen: from the upload to the end of the download): the median of the rounds per
path, and the ratio of the medians and of each round's pair. The two outputs'
orders are compared line by line, and their scores (largest difference), to show the
same model ran with the same settings.

Goal: BatchGen >= 0.95x run_batch's documents/s.

    .venv/bin/python benchmarks/rerank.py                  # 2,000 lines, 3 rounds
    .venv/bin/python benchmarks/rerank.py --lines 300 --rounds 1
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
from pathlib import Path

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
from embeddings import ENGINE_FLAGS, engine_steps  # noqa: E402
from engine import TEMPLATES, TOPICS, answered, print_cpu_table, run_batchgen, run_vllm_batch  # noqa: E402

from serving.model_prep import EMBEDDING_MODEL_NAME, prepare_embedding_model  # noqa: E402

RERANK = "/v1/rerank"
COMPARED = 200  # lines whose order and scores are compared between the two outputs


def write_input(path: Path, count: int, *, seed: int = 38) -> int:
    """`count` rerank lines; the number of documents in all."""
    rng = random.Random(seed)
    sentences = [t.format(topic) for t in TEMPLATES for topic in TOPICS]
    documents = 0
    with path.open("w") as fh:
        for i in range(count):
            candidates = [f"{rng.choice(sentences)} (doc {i}.{j})"
                          for j in range(rng.randint(5, 20))]
            documents += len(candidates)
            body = {"model": EMBEDDING_MODEL_NAME, "query": f"{rng.choice(sentences)}? ({i})",
                    "documents": candidates}
            fh.write(json.dumps({"custom_id": f"rr-{i}", "method": "POST", "url": RERANK,
                                 "body": body}) + "\n")
    return documents


def read_reranks(lines: list[bytes]) -> dict:
    documents = prompt = 0
    orders = {}
    bodies, errors = answered(lines)
    for custom_id, body in bodies:
        documents += len(body["results"])
        prompt += body["usage"]["prompt_tokens"]
        if int(custom_id.removeprefix("rr-")) < COMPARED:
            orders[custom_id] = [(r["index"], r["relevance_score"]) for r in body["results"]]
    return {"documents": documents, "prompt_tokens": prompt, "errors": errors,
            "orders": orders}


def compare(a: dict, b: dict) -> dict:
    """How far the two outputs' rerankings agree: lines in the same order, and the
    largest score difference."""
    keys = sorted(a.keys() & b.keys())
    same = sum(1 for key in keys if [i for i, _ in a[key]] == [i for i, _ in b[key]])
    diff = max((abs(x - y) for key in keys
                for (_, x), (_, y) in zip(sorted(a[key]), sorted(b[key]), strict=True)),
               default=None)
    return {"compared_lines": len(keys), "same_order": same, "max_score_difference": diff}


LABELS = {"run_batch": "vLLM run_batch", "batchgen": "BatchGen end to end"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=2_000)
    parser.add_argument("--model", default=str(ROOT / "storage" / "models" / EMBEDDING_MODEL_NAME),
                        help="model folder (prepared here if missing)")
    parser.add_argument("--timeout", type=float, default=1800, help="per path, seconds")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds; each runs both paths, the first alternating")
    parser.add_argument("--quiet-timeout", type=float, default=60,
                        help="longest wait (s) for the shared machine to calm before a run")
    parser.add_argument("--name", default="rerank",
                        help="results file name (benchmarks/results/NAME.json)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    model = str(prepare_embedding_model(Path(args.model)))
    mark_start()

    serial = itertools.count()  # each run its own run_batch log / BatchGen storage
    with scratch_dir("rerank", keep=args.keep) as work:
        input_path = work / "input.jsonl"
        documents = write_input(input_path, args.lines)
        print(f"input: {args.lines} rerank lines, {documents} documents, model "
              f"{EMBEDDING_MODEL_NAME}; {args.rounds} round(s)", flush=True)

        def vllm_batch() -> dict:
            run = work / f"run_batch-{next(serial)}"
            run.mkdir()
            with engine_steps(run / "steps") as batches:
                result = run_vllm_batch(input_path, model, run, args.timeout,
                                        flags=ENGINE_FLAGS, read=read_reranks)
            return {**result, "engine_batches": batches}

        def batchgen() -> dict:
            run = work / f"batchgen-{next(serial)}"
            run.mkdir()
            with engine_steps(run / "steps") as batches:
                result = run_batchgen(input_path, model, run, args.timeout,
                                      endpoint=RERANK, quiet_timeout=args.quiet_timeout,
                                      read=read_reranks)
            return {**result, "engine_batches": batches}

        runs = run_rounds([("run_batch", vllm_batch), ("batchgen", batchgen)], args.rounds,
                          amount="documents", labels=LABELS, alternate=True,
                          quiet_timeout=args.quiet_timeout)
    report(runs, args, documents)


def report(runs: dict[str, list[dict]], args, documents: int) -> None:
    agreement = compare(runs["run_batch"][0]["orders"], runs["batchgen"][0]["orders"])
    for results in runs.values():
        for result in results:
            result.pop("orders", None)
    summary = summarize_rounds(runs)
    ratios = ratios_by_round(runs, summary, "batchgen", "run_batch")
    print_table(f"{args.lines} rerank lines ({documents} documents), start-up excluded "
                "(medians over the rounds)",
                ["path", "start-up s", "run s", "documents/s", "min-max", "engine steps",
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
          f"{ratios.get('batchgen_vs_run_batch_by_round')} (goal >= 0.95x); same order in "
          f"{agreement['same_order']} of {agreement['compared_lines']} compared lines, "
          f"largest score difference {agreement['max_score_difference']}")
    write_results(args.name, {
        "lines": args.lines, "documents": documents, "model": EMBEDDING_MODEL_NAME,
        "engine_flags": ENGINE_FLAGS, "summary": summary, "ratios": ratios,
        "goal_at_least_0.95x": ratio is not None and ratio >= 0.95,
        "agreement": agreement, "runs": runs,
    })


if __name__ == "__main__":
    main()
