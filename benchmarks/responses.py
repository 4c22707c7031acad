"""/v1/responses against /v1/chat/completions: the same batch, the same server, the
same run (issue 28).

One BatchGen (`manage.py serve`, the vllm engine on SmolLM2-135M-Instruct) runs the
same prompts as a chat batch and as a responses batch, in interleaved rounds (default
3; the endpoint that goes first alternates), so both meet the same warm engine and
the same machine load. Each line is one of benchmarks/engine.py's prompts at
temperature 0 with the same output limit (`max_tokens` / `max_output_tokens`); a
responses line sends its prompt as an input item list every other line and as a
string otherwise. The figure is output tokens/s over the run (upload to the end of
the download, as benchmarks/engine.py's drive_batch measures it): the median of the
rounds per endpoint, and the ratio of the medians and of each round's pair. Greedy
decoding of the same prompt gives the same text through both endpoints; the script
counts how many agree.

Goal: responses >= 0.95x chat's output tokens/s.

    .venv/bin/python benchmarks/responses.py                  # 1,000 lines, 3 rounds
    .venv/bin/python benchmarks/responses.py --lines 200 --rounds 1 --max-tokens 32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_MODEL,
    mark_start,
    print_table,
    ratios_by_round,
    run_rounds,
    running_server,
    scratch_dir,
    summarize_rounds,
    write_results,
)
from engine import CHAT, TEMPLATES, TOPICS, answered, drive_batch  # noqa: E402

RESPONSES = "/v1/responses"
LABELS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}


def write_inputs(folder: Path, count: int, *, max_tokens: int, model: str) -> dict[str, Path]:
    prompts = [t.format(topic) for t in TEMPLATES for topic in TOPICS]
    paths = {"chat": folder / "chat.jsonl", "responses": folder / "responses.jsonl"}
    with paths["chat"].open("w") as chat, paths["responses"].open("w") as responses:
        for i in range(count):
            prompt = f"{prompts[i % len(prompts)]} (request {i})"
            chat.write(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": CHAT,
                                   "body": {"model": model, "temperature": 0,
                                            "max_tokens": max_tokens,
                                            "messages": [{"role": "user",
                                                          "content": prompt}]}}) + "\n")
            items = [{"role": "user", "content": [{"type": "input_text", "text": prompt}]}]
            responses.write(json.dumps({
                "custom_id": f"req-{i}", "method": "POST", "url": RESPONSES,
                "body": {"model": model, "temperature": 0, "max_output_tokens": max_tokens,
                         "input": items if i % 2 else prompt}}) + "\n")
    return paths


def read_chat(lines: list[bytes]) -> dict:
    bodies, errors = answered(lines)
    return {"output_tokens": sum(b["usage"]["completion_tokens"] for _, b in bodies),
            "input_tokens": sum(b["usage"]["prompt_tokens"] for _, b in bodies),
            "errors": errors,
            "texts": {cid: b["choices"][0]["message"]["content"] for cid, b in bodies}}


def read_responses(lines: list[bytes]) -> dict:
    from openai.types.responses import Response

    bodies, errors = answered(lines)
    parsed = [(cid, Response.model_validate(body)) for cid, body in bodies]
    return {"output_tokens": sum(r.usage.output_tokens for _, r in parsed),
            "input_tokens": sum(r.usage.input_tokens for _, r in parsed),
            "errors": errors, "texts": {cid: r.output_text for cid, r in parsed}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--timeout", type=float, default=1800, help="per batch, seconds")
    parser.add_argument("--quiet-timeout", type=float, default=120,
                        help="longest wait for a quiet machine before each batch")
    args = parser.parse_args()
    mark_start()
    with scratch_dir("responses") as work:
        paths = write_inputs(work, args.lines, max_tokens=args.max_tokens,
                             model=Path(args.model).name)
        started = time.perf_counter()
        with running_server(work / "storage", engine="vllm", ready_timeout=900,
                            BATCHGEN_MODEL=args.model) as server:
            startup = time.perf_counter() - started
            print(f"server ready in {startup:.0f} s", flush=True)

            def step(key: str):
                read = read_chat if key == "chat" else read_responses
                endpoint = CHAT if key == "chat" else RESPONSES

                def run() -> dict:
                    result = drive_batch(server, paths[key], args.timeout, endpoint=endpoint,
                                         read=read)
                    return {**result, "startup_s": 0.0}
                return key, run

            # One warm-up batch, so neither endpoint pays the first requests' costs.
            drive_batch(server, paths["chat"], args.timeout, read=read_chat)
            runs = run_rounds([step("chat"), step("responses")], args.rounds,
                              amount="output_tokens", labels=LABELS, alternate=True,
                              quiet_timeout=args.quiet_timeout)
    summary = summarize_rounds(runs)
    ratios = ratios_by_round(runs, summary, "responses", "chat")
    same = sum(1 for cid, text in runs["chat"][0]["texts"].items()
               if runs["responses"][0]["texts"].get(cid) == text)
    print_table(f"{args.lines} requests, {args.max_tokens} output tokens at most, "
                "temperature 0, one warm server (medians over the rounds)",
                ["endpoint", "run s", "output tokens", "tokens/s", "min-max", "rounds"],
                [[LABELS[k], v["run_s_median"], runs[k][0]["output_tokens"],
                  v["rate_median"], f"{v['rate_min']:.0f}-{v['rate_max']:.0f}", v["rounds"]]
                 for k, v in summary.items()])
    print(f"responses / chat tokens/s: {ratios.get('responses_vs_chat')} "
          f"(by round {ratios.get('responses_vs_chat_by_round')}); "
          f"identical texts {same}/{args.lines}")
    for results in runs.values():
        for result in results:
            result.pop("texts", None)
    write_results("responses", {
        "lines": args.lines, "max_tokens": args.max_tokens, "rounds": args.rounds,
        "server_startup_s": round(startup, 1), "summary": summary, "ratios": ratios,
        "identical_texts": same,
        "goals": {"responses_at_least_0.95x_chat":
                  ratios.get("responses_vs_chat", 0) >= 0.95},
        "runs": runs,
    })


if __name__ == "__main__":
    main()
