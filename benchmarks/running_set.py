"""How the CPU engine's output tokens/s depends on how many requests it runs at once
(issue 15): one vLLM engine with BatchGen's CPU settings and the batch runner's
scheduler limits (128 sequences, 2,048 batched tokens), fed workload a's kind of
short unique prompts (max_tokens 64) through `AsyncLLM` with at most C in flight,
the levels interleaved on the one warm engine. It answers whether admission should
ever hold vLLM below the running set its scheduler would choose (it should not, if
tokens/s rises with C).

    .venv/bin/python benchmarks/running_set.py --requests 192 --levels 128,32,64,128,32,64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_MODEL, mark_start, write_results  # noqa: E402
from engine import CPU_KV_CACHE_BYTES, TEMPLATES, TOPICS  # noqa: E402


async def measure(model: str, requests: int, levels: list[int]) -> list[dict]:
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(model=model, dtype="float32", enforce_eager=True,
                           kv_cache_memory_bytes=CPU_KV_CACHE_BYTES, enable_prefix_caching=True,
                           generation_config="vllm", max_num_seqs=128,
                           max_num_batched_tokens=2048)
    llm = AsyncLLM.from_engine_args(args, usage_context=UsageContext.OPENAI_BATCH_RUNNER)
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [t.format(topic) for t in TEMPLATES for topic in TOPICS]
    params = SamplingParams(temperature=0, max_tokens=64)
    results = []
    try:
        for run, limit in enumerate(levels):
            # Unique per run: nothing is served from the prefix cache of an earlier one.
            texts = [tokenizer.apply_chat_template(
                [{"role": "user", "content": f"[r{run}-{i}] {prompts[i % len(prompts)]}"}],
                tokenize=False, add_generation_prompt=True) for i in range(requests)]
            gate = asyncio.Semaphore(limit)
            tokens = 0

            async def one(i: int, gate=gate, texts=texts, run=run) -> None:
                nonlocal tokens
                async with gate:
                    final = None
                    async for output in llm.generate(texts[i], params, request_id=f"{run}-{i}"):
                        final = output
                    tokens += len(final.outputs[0].token_ids)

            started = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(requests)))
            seconds = time.perf_counter() - started
            results.append({"in_flight": limit, "tokens": tokens, "run_s": round(seconds, 2),
                            "tokens_per_s": round(tokens / seconds, 1)})
            print(f"at most {limit} in flight: {tokens} tokens in {seconds:.1f} s = "
                  f"{tokens / seconds:.0f} tokens/s", flush=True)
    finally:
        llm.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--levels", default="128,32,64,128,32,64",
                        help="in-flight limits, one run each, in this order")
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    args = parser.parse_args()
    mark_start()
    runs = asyncio.run(measure(args.model, args.requests,
                               [int(level) for level in args.levels.split(",")]))
    by_level: dict[int, list[float]] = {}
    for run in runs[1:]:  # the first run warms the engine up
        by_level.setdefault(run["in_flight"], []).append(run["tokens_per_s"])
    medians = {level: statistics.median(values) for level, values in sorted(by_level.items())}
    print(f"tokens/s by in-flight limit (first run left out): {medians}")
    write_results("running_set", {"requests": args.requests, "runs": runs,
                                  "tokens_per_s_median": medians})


if __name__ == "__main__":
    main()
