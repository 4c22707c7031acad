"""The real vLLM engine with the bundled SmolLM2-135M-Instruct, end to end: chat and
completions, and /v1/responses batches, on one server for the module (a vLLM start
costs minutes on a CPU)."""

from __future__ import annotations

import json
import os

import jsonschema
import psutil
import pytest
from openai.types.responses import Response

from batchgen_site.cpu_placement import SERVICE_NICENESS
from tests.e2e.harness import Api, Server, server_env, wait_until
from tests.e2e.test_metrics_e2e import scrape, worker_total

pytestmark = pytest.mark.vllm
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory, model_dir):
    storage = tmp_path_factory.mktemp("vllm") / "storage"
    server = Server(storage=storage, env=server_env(
        storage=storage, engine="vllm", BATCHGEN_MODEL=str(model_dir),
        BATCHGEN_MAX_CONTEXT_LENGTH="512", BATCHGEN_MAX_POOL_SIZE="64"))
    try:
        server.start(ready_timeout=600)
        yield server, Api(server.base_url)
    finally:
        server.stop()

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


def run_batch(api, content: bytes, endpoint: str, *,
              status: str = "completed") -> tuple[dict[str, dict], dict]:
    file_id = api.upload(content)["id"]
    created = api.create_batch(file_id, endpoint=endpoint)
    assert created.status_code == 200, created.text
    done = api.wait_status(created.json()["id"], {"completed", "failed", "cancelled"},
                           timeout=600)
    assert done["status"] == status, done
    if status != "completed":
        return {}, done
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


def test_real_engine_chat_and_completions(vllm_server):
    server, api = vllm_server
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

    # The worker's engine figures, which the ETA's rate and prompt cost read
    # (batches/estimates.py), reach /metrics: vLLM's steps computed the prompt tokens
    # the answers name, less the prefix-cache hits (the second run's).
    bodies = [line["response"]["body"] for run in (first, second, completions)
              for line in run.values() if line["response"]]
    computed = sum(body["usage"]["prompt_tokens"] - (
        (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        for body in bodies)

    def worker(name: str) -> float:
        return worker_total(scrape(server.base_url), f"batchgen_worker_{name}_total")

    wait_until(lambda: worker("prompt_tokens_computed") == computed, timeout=30,
               message=f"{computed} prompt tokens computed on /metrics")
    assert worker("busy_seconds") > 0

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


# --- /v1/responses -----------------------------------------------------------------------

ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["answer"], "additionalProperties": False}
JSON_FORMAT = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER,
                          "strict": True}}


def response_line(i: int) -> dict:
    """Four kinds in turn: a string input with instructions, an item list (developer
    and user messages with content parts), and each of them under a json_schema
    format. Outputs stay short: a CPU runs this whole batch."""
    question = f"Is {i} an even number?"
    kind = i % 4
    body: dict = {"model": MODEL, "max_output_tokens": 12}
    if kind in (0, 2):
        body.update(input=question, instructions="Answer yes or no.")
    else:
        body["input"] = [
            {"role": "developer", "content": "Answer yes or no."},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": question}]}]
    if kind >= 2:
        body["text"] = JSON_FORMAT
    return {"custom_id": f"resp-{i}", "method": "POST", "url": "/v1/responses", "body": body}


def comparison_lines(url: str) -> bytes:
    """The chat test's questions at temperature 0, as chat or as responses lines."""
    lines = []
    for i, question in enumerate(QUESTIONS):
        body = {"model": MODEL, "temperature": 0}
        if url == "/v1/responses":
            body.update(input=question, max_output_tokens=24)
        else:
            body.update(messages=[{"role": "user", "content": question}], max_tokens=24)
        lines.append({"custom_id": f"same-{i}", "method": "POST", "url": url, "body": body})
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def jsonl_of(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_real_engine_responses_batch(vllm_server):
    _, api = vllm_server
    lines = [response_line(i) for i in range(200)]
    # A few invalid lines: the batch fails at validation, each refused with its code.
    bad = {5: ({"stream": True}, "unsupported_parameter", "body.stream"),
           60: ({"previous_response_id": "resp_earlier"}, "unsupported_parameter",
                "body.previous_response_id"),
           120: ({"tools": [{"type": "web_search"}]}, "unsupported_parameter",
                 "body.tools[0].type"),
           150: ({"text": {"format": {"type": "json_schema", "name": "a"}}}, "invalid_body",
                 "body.text.format.schema")}
    with_bad = list(lines)
    for position, (fields, _, _) in sorted(bad.items()):
        with_bad.insert(position, {"custom_id": f"bad-{position}", "method": "POST",
                                   "url": "/v1/responses",
                                   "body": {**response_line(position)["body"], **fields}})
    _, failed = run_batch(api, jsonl_of(with_bad), "/v1/responses", status="failed")
    assert failed["error"]["code"] == "invalid_input"
    assert [(e["code"], e["line"], e["param"]) for e in failed["errors"]["data"]] == [
        (code, position + 1, param) for position, (_, code, param) in sorted(bad.items())]

    outputs, batch = run_batch(api, jsonl_of(lines), "/v1/responses")
    assert batch["request_counts"] == {"total": 200, "completed": 200, "failed": 0}
    assert sorted(outputs) == sorted(f"resp-{i}" for i in range(200))  # each exactly once
    responses = {}
    for custom_id, line in outputs.items():
        assert line["error"] is None and line["response"]["status_code"] == 200
        response = Response.model_validate(line["response"]["body"])
        assert response.object == "response" and response.id.startswith("resp_")
        assert response.model == MODEL and response.status in ("completed", "incomplete")
        assert response.output_text.strip(), custom_id
        assert 0 < response.usage.output_tokens <= 12
        responses[custom_id] = response
    for i in range(2, 200, 4):  # every json_schema output parses and validates
        for j in (i, i + 1):
            jsonschema.validate(json.loads(responses[f"resp-{j}"].output_text), ANSWER)
    assert responses["resp-0"].instructions == "Answer yes or no."
    usage = batch["usage"]
    assert usage["input_tokens"] == sum(r.usage.input_tokens for r in responses.values())
    assert usage["output_tokens"] == sum(r.usage.output_tokens for r in responses.values())
    assert usage["input_tokens_details"]["cached_tokens"] == sum(
        r.usage.input_tokens_details.cached_tokens for r in responses.values())

    # The same prompts at temperature 0: the same text through either endpoint.
    chat, _ = run_batch(api, comparison_lines("/v1/chat/completions"), "/v1/chat/completions")
    same, _ = run_batch(api, comparison_lines("/v1/responses"), "/v1/responses")
    for i in range(len(QUESTIONS)):
        text = Response.model_validate(same[f"same-{i}"]["response"]["body"]).output_text
        assert text == chat[f"same-{i}"]["response"]["body"]["choices"][0]["message"][
            "content"]
        assert text.strip()


def test_vllm_lines_keep_their_levels_in_the_worker_log(vllm_server):
    """vLLM's own lines (its engine's start, its stats) reach the log at the levels
    vLLM gives them, not as WARNINGs of the Celery worker's redirected standard output,
    which would make every healthy run's log read as one of warnings."""
    server, _ = vllm_server
    lines = server.log_path.read_text(errors="replace").splitlines()
    assert any("Resolved architecture" in line and " INFO " in line for line in lines), \
        server.log()
    redirected = [line for line in lines if "celery.redirected" in line]
    assert not redirected, redirected[:5]
