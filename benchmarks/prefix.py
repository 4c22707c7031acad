"""Prefix-aware chunking, measured: the same shuffled batch, where groups of requests
share long system prompts, run end to end on the real engine with prefix grouping off
and on, one after the other in the same run.

Reports output tokens/s (from the usage counts in the output) and the prefix-cache hit
rate (cached prompt tokens / prompt tokens, from usage.prompt_tokens_details), and the
ratio on/off. Goal: at least 1.3x with grouping.

    .venv/bin/python benchmarks/prefix.py            # 48 groups x 8 requests
    .venv/bin/python benchmarks/prefix.py --quick    # a smaller run
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.harness import Api, Server, server_env  # noqa: E402

WORDS = ("policy customer order refund invoice shipping warranty account billing support "
         "product service quality delivery payment schedule contract renewal").split()


def system_prompt(group: int, words: int) -> str:
    rng = random.Random(group)
    rules = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"You are support assistant #{group}. Company handbook follows. {rules}"


def make_input(groups: int, per_group: int, words: int, max_tokens: int) -> bytes:
    lines = []
    for g in range(groups):
        system = system_prompt(g, words)
        for i in range(per_group):
            lines.append({"custom_id": f"g{g}-r{i}", "method": "POST",
                          "url": "/v1/chat/completions",
                          "body": {"model": "m", "max_tokens": max_tokens, "messages": [
                              {"role": "system", "content": system},
                              {"role": "user", "content": f"Question {i}: summarise rule {i}."}]}})
    random.Random(42).shuffle(lines)
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def run(grouping: bool, content: bytes, model: str, workdir: Path) -> dict:
    storage = workdir / f"storage-{'on' if grouping else 'off'}"
    server = Server(storage=storage, env=server_env(
        storage=storage, engine="vllm", BATCHGEN_MODEL=model,
        BATCHGEN_PREFIX_GROUPING="true" if grouping else "false"))
    started = time.monotonic()
    server.start(ready_timeout=600)
    startup = time.monotonic() - started
    try:
        api = Api(server.base_url)
        file_id = api.upload(content)["id"]
        t0 = time.monotonic()
        batch = api.create_batch(file_id).json()
        done = api.wait_status(batch["id"], {"completed", "failed", "cancelled"}, timeout=3600)
        wall = time.monotonic() - t0
        assert done["status"] == "completed", done
        lines = [json.loads(line) for line in api.content(done["output_file_id"]).splitlines()]
    finally:
        server.stop()
    usage = [line["response"]["body"]["usage"] for line in lines if line["response"]]
    prompt = sum(u["prompt_tokens"] for u in usage)
    cached = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                 for u in usage)
    completion = sum(u["completion_tokens"] for u in usage)
    return {"grouping": grouping, "requests": len(lines), "errors": len(lines) - len(usage),
            "wall_s": round(wall, 2), "startup_s": round(startup, 1),
            "output_tokens": completion, "output_tokens_per_s": round(completion / wall, 1),
            "prompt_tokens": prompt, "cached_prompt_tokens": cached,
            "prefix_cache_hit_rate": round(cached / prompt, 3) if prompt else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=48)
    parser.add_argument("--per-group", type=int, default=8)
    parser.add_argument("--prompt-words", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--model", default=str(ROOT / "storage/models/SmolLM2-135M-Instruct"))
    parser.add_argument("--quick", action="store_true", help="12 groups x 4 requests")
    args = parser.parse_args()
    if args.quick:
        args.groups, args.per_group = 12, 4
    content = make_input(args.groups, args.per_group, args.prompt_words, args.max_tokens)
    with tempfile.TemporaryDirectory(prefix="bg-prefix-") as tmp:
        off = run(False, content, args.model, Path(tmp))
        on = run(True, content, args.model, Path(tmp))
    ratio = on["output_tokens_per_s"] / off["output_tokens_per_s"]
    print(f"{'grouping':<10}{'requests':>9}{'wall s':>9}{'out tok/s':>11}{'hit rate':>10}")
    for row in (off, on):
        print(f"{'on' if row['grouping'] else 'off':<10}{row['requests']:>9}{row['wall_s']:>9}"
              f"{row['output_tokens_per_s']:>11}{row['prefix_cache_hit_rate']:>10}")
    print(f"grouping on / off: {ratio:.2f}x output tokens/s (goal >= 1.3x)")
    results = ROOT / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "prefix.json").write_text(json.dumps(
        {"args": vars(args), "off": off, "on": on, "ratio": round(ratio, 3)}, indent=2))


if __name__ == "__main__":
    main()
