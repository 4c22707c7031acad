"""The real vLLM engine with the bundled SmolLM2-135M-Instruct, end to end."""

from __future__ import annotations

import json
import os

import psutil
import pytest

from batchgen_site.cpu_placement import SERVICE_NICENESS
from tests.e2e.harness import wait_until

pytestmark = pytest.mark.vllm

QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?"]


def chat_input(long_prompt: str) -> bytes:
    lines = [{"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "SmolLM2-135M-Instruct", "max_tokens": 24,
                       "messages": [{"role": "user", "content": q}]}}
             for i, q in enumerate(QUESTIONS)]
    lines.append({"custom_id": "too-long", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "SmolLM2-135M-Instruct", "max_tokens": 8,
                           "messages": [{"role": "user", "content": long_prompt}]}})
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def completion_input() -> bytes:
    prompts = ["The capital of France is", "Once upon a time"]
    return b"".join(json.dumps({
        "custom_id": f"cmpl-{i}", "method": "POST", "url": "/v1/completions",
        "body": {"model": "SmolLM2-135M-Instruct", "prompt": p, "max_tokens": 12}}).encode()
        + b"\n" for i, p in enumerate(prompts))


def run_batch(api, content: bytes, endpoint: str) -> dict[str, dict]:
    file_id = api.upload(content)["id"]
    created = api.create_batch(file_id, endpoint=endpoint)
    assert created.status_code == 200, created.text
    done = api.wait_status(created.json()["id"], {"completed", "failed", "cancelled"},
                           timeout=600)
    assert done["status"] == "completed", done
    lines = [json.loads(line) for line in api.content(done["output_file_id"]).splitlines()]
    return {line["custom_id"]: line for line in lines}, done


def cpu_layout(server) -> dict[str, set[frozenset[int]]]:
    """The CPUs the threads of the server's processes may run on: vLLM's compute
    workers' ("compute"), and every other process's but the supervisor's ("others")."""
    layout: dict[str, set[frozenset[int]]] = {"compute": set(), "others": set()}
    for process in psutil.Process(server.process.pid).children(recursive=True):
        try:
            role = "compute" if process.name().startswith("VLLM::Worker") else "others"
            for tid in os.listdir(f"/proc/{process.pid}/task"):
                layout[role].add(frozenset(os.sched_getaffinity(int(tid))))
        except (psutil.Error, OSError):  # a process or thread that just ended
            continue
    return layout


def placed_off_compute(server) -> bool:
    """vLLM bound its compute worker, and everything else runs on the other CPUs."""
    layout = cpu_layout(server)
    if len(layout["compute"]) != 1:
        return False
    (compute,) = layout["compute"]
    rest = frozenset(os.sched_getaffinity(0)) - compute
    return layout["others"] == {rest}


def niceness(server) -> dict[str, set[int]]:
    """The niceness of every thread of the web server ("web") and of the inference
    worker with vLLM's processes under it ("inference")."""
    found: dict[str, set[int]] = {"web": set(), "inference": set()}
    for program in psutil.Process(server.process.pid).children():
        try:
            command = " ".join(program.cmdline())
            role = "web" if "gunicorn" in command else "inference" if "-Q inference" in command \
                else None
            if role is None:
                continue
            for process in [program, *program.children(recursive=True)]:
                for tid in os.listdir(f"/proc/{process.pid}/task"):
                    found[role].add(os.getpriority(os.PRIO_PROCESS, int(tid)))
        except (psutil.Error, OSError):  # a process or thread that just ended
            continue
    return found


def test_real_engine_chat_and_completions(start_server, model_dir):
    server, api = start_server(engine="vllm", ready_timeout=300, BATCHGEN_MODEL=str(model_dir),
                               BATCHGEN_MAX_CONTEXT_LENGTH="512", BATCHGEN_MAX_POOL_SIZE="64")
    wait_until(lambda: api.http.get("/v1/models").json()["data"], timeout=30)
    model = api.http.get("/v1/models").json()["data"][0]
    assert model["id"] == "SmolLM2-135M-Instruct" and model["max_context_length"] == 512

    long_prompt = "word " * 2000
    first, batch = run_batch(api, chat_input(long_prompt), "/v1/chat/completions")
    assert batch["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    assert first["too-long"]["response"] is None
    assert first["too-long"]["error"]["code"] == "context_length_exceeded"
    for i in range(len(QUESTIONS)):
        line = first[f"chat-{i}"]
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == model["id"]
        choice = body["choices"][0]
        assert choice["message"]["role"] == "assistant"
        assert choice["message"]["content"].strip(), "empty answer"
        assert choice["finish_reason"] in ("stop", "length")
        usage = body["usage"]
        assert 0 < usage["completion_tokens"] <= 24
        assert usage["prompt_tokens"] > len(QUESTIONS[i].split())  # the chat template adds tokens
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert "paris" in first["chat-0"]["response"]["body"]["choices"][0]["message"][
        "content"].lower()
    # The batch's usage is the sum over its output lines (the failed line has none).
    bodies = [line["response"]["body"] for line in first.values() if line["response"]]
    assert batch["usage"]["input_tokens"] == sum(b["usage"]["prompt_tokens"] for b in bodies)
    assert batch["usage"]["output_tokens"] == sum(b["usage"]["completion_tokens"]
                                                  for b in bodies)
    assert batch["usage"]["input_tokens_details"]["cached_tokens"] == sum(
        (b["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        for b in bodies)

    # Greedy decoding by default: a second run gives identical text.
    second, _ = run_batch(api, chat_input(long_prompt), "/v1/chat/completions")
    for i in range(len(QUESTIONS)):
        assert (second[f"chat-{i}"]["response"]["body"]["choices"][0]["message"]["content"]
                == first[f"chat-{i}"]["response"]["body"]["choices"][0]["message"]["content"])

    completions, batch = run_batch(api, completion_input(), "/v1/completions")
    assert batch["request_counts"]["completed"] == 2
    for line in completions.values():
        body = line["response"]["body"]
        assert body["object"] == "text_completion"
        assert body["choices"][0]["text"].strip()
        assert body["usage"]["completion_tokens"] <= 12
        assert body["choices"][0]["finish_reason"] in ("stop", "length")

    # Where it ran (batchgen_site/cpu_placement.py): vLLM computes on the CPUs it bound
    # its worker to; the web server, the control worker, the broker, the inference
    # worker's front end and vLLM's scheduler on the others (on a host with more than
    # one CPU: with one, vLLM reserves none and nothing moves), where the services
    # give way to the scheduler and the inference worker keeps its priority.
    if len(os.sched_getaffinity(0)) > 1:
        try:
            wait_until(lambda: placed_off_compute(server)
                       and niceness(server)["web"] == {SERVICE_NICENESS}, timeout=30)
        except TimeoutError:
            pytest.fail(f"not placed off vLLM's compute CPUs: {cpu_layout(server)}, "
                        f"niceness {niceness(server)}")
        assert niceness(server)["inference"] == {os.getpriority(os.PRIO_PROCESS, 0)}
    else:
        assert cpu_layout(server)["others"] == {frozenset(os.sched_getaffinity(0))}
