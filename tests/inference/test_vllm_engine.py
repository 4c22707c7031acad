"""The vLLM engine on the real default model (SmolLM2-135M-Instruct, CPU).

One engine serves the whole module, started the way an inference worker starts it:
on an event loop running in a background thread. Generations are kept to a few
tokens each; the CPU makes about 60 tokens/s in all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from serving.engines.base import EngineConfig, EngineRequest, EngineResult
from serving.model_prep import DEFAULT_MODEL_NAME, model_info, prepare_default_model

pytestmark = pytest.mark.vllm

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


class LoopThread:
    """An asyncio loop in a thread of its own, as the inference worker runs it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="engine-loop")
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


class EngineHarness:
    def __init__(self, engine: Any, loop: LoopThread) -> None:
        self.engine = engine
        self.loop = loop

    def generate(self, request: EngineRequest) -> EngineResult:
        return self.loop.run(self.engine.generate(request))

    def generate_all(self, *requests: EngineRequest) -> list[EngineResult]:
        async def all_at_once() -> list[EngineResult]:
            return await asyncio.gather(*(self.engine.generate(r) for r in requests))

        return self.loop.run(all_at_once())


_ids = iter(range(1_000_000))


def chat_request(
    content: str, *, max_context_length: int | None = None, **params: Any
) -> EngineRequest:
    n = next(_ids)
    body = {"model": DEFAULT_MODEL_NAME, "messages": [{"role": "user", "content": content}],
            **params}
    return EngineRequest(
        request_id=f"req-{n}",
        custom_id=f"c-{n}",
        endpoint=CHAT,
        body=body,
        max_context_length=max_context_length,
    )


def completion_request(prompt: str, **params: Any) -> EngineRequest:
    n = next(_ids)
    return EngineRequest(
        request_id=f"req-{n}",
        custom_id=f"c-{n}",
        endpoint=COMPLETIONS,
        body={"model": DEFAULT_MODEL_NAME, "prompt": prompt, **params},
    )


async def wait_until(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.01)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configured = os.environ.get("BATCHGEN_TEST_MODEL_DIR")
    target = (
        Path(configured) if configured else tmp_path_factory.mktemp("models") / DEFAULT_MODEL_NAME
    )
    return prepare_default_model(target)


@contextlib.contextmanager
def running_vllm(model_dir: Path, served_name: str) -> Iterator[EngineHarness]:
    """A started VllmEngine on its own loop thread, shut down on exit."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from inference.engines.vllm_engine import VllmEngine

    engine = VllmEngine(
        EngineConfig(engine="vllm", model=str(model_dir), served_model_name=served_name)
    )
    loop = LoopThread()
    started = time.monotonic()
    try:
        loop.run(engine.start(), timeout=600)
        print(f"\nvLLM engine started in {time.monotonic() - started:.1f} s")
        yield EngineHarness(engine, loop)
    finally:
        try:
            loop.run(engine.shutdown(), timeout=60)
        finally:
            loop.close()


@pytest.fixture(scope="module")
def vllm(model_dir: Path) -> Iterator[EngineHarness]:
    with running_vllm(model_dir, model_info(model_dir)[0]) as harness:
        yield harness


def test_engine_reports_the_model_context(vllm: EngineHarness, model_dir: Path) -> None:
    assert vllm.engine.max_context_length == model_info(model_dir)[1]


def test_prefix_caching_is_on_for_a_generative_model(vllm: EngineHarness) -> None:
    # vLLM's per-model default, which BatchGen relies on (shared system prompts).
    assert vllm.engine._llm.vllm_config.cache_config.enable_prefix_caching is True


def test_the_engine_reports_its_running_set_after_each_step(vllm: EngineHarness) -> None:
    # What the worker admits from (inference/slots.py): vLLM's scheduler figures.
    loads = []
    vllm.engine.load_listener = loads.append
    try:
        results = vllm.generate_all(*(chat_request(f"Count to {n}.", max_tokens=8)
                                      for n in range(6)))
    finally:
        vllm.engine.load_listener = None
    assert all(result.error is None for result in results)
    assert vllm.engine.max_running == vllm.engine._llm.vllm_config.scheduler_config.max_num_seqs
    # Short prompts: all six run together, and every step reported them.
    assert max(load.running for load in loads) == 6
    assert len(loads) >= 8  # at least one report per decode step
    assert all(0.0 <= load.kv_cache_usage <= 1.0 and load.waiting >= 0 for load in loads)


def test_the_engine_tells_its_work_step_by_step(vllm: EngineHarness) -> None:
    # The worker's work figures for the ETA's cost fit (WorkerState.add_work): the
    # tokens each step generated and the prompt tokens it computed (prefix-cache
    # hits, such as the chat template's start, left out).
    # Each step also tells the requests it finished and its time in the engine
    # core, which the worker fits a prompt token's cost from (WorkerState.add_work).
    work = []
    vllm.engine.work_listener = lambda *step: work.append(step)
    try:
        results = vllm.generate_all(*(chat_request(f"Name {n} colours.", max_tokens=6)
                                      for n in range(4)))
    finally:
        vllm.engine.work_listener = None
    assert all(result.error is None for result in results)
    assert vllm.engine.reports_work
    assert sum(step[1] for step in work) == sum(r.completion_tokens for r in results)
    computed = sum(step[0] for step in work)
    assert 0 < computed <= sum(r.prompt_tokens for r in results)
    assert len(work) >= 6  # step by step, not once per answer
    assert sum(step[2] for step in work) == len(results)
    # Every step after the first decodes the four, so its time is told; the first
    # (the prefill that gives each its first token) has none before it to time.
    timed = [step[3] for step in work if step[3] is not None]
    assert len(timed) >= len(work) - 1 and all(0 < seconds < 60 for seconds in timed)


def test_chat_body_has_the_contract_shape_and_usage_adds_up(
    vllm: EngineHarness, model_dir: Path
) -> None:
    result = vllm.generate(chat_request("What is the capital of France?", max_tokens=8))

    assert result.error is None
    body = result.body
    json.dumps(body)  # plain JSON, ready for the output line
    assert body["object"] == "chat.completion"
    assert body["model"] == model_info(model_dir)[0]
    (choice,) = body["choices"]
    message = choice["message"]
    assert message["role"] == "assistant"
    assert isinstance(message["content"], str) and message["content"]
    assert message["reasoning_content"] is None
    assert message["tool_calls"] == []
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 0 < usage["completion_tokens"] <= 8
    assert (result.prompt_tokens, result.completion_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )


def test_completions_body_has_the_contract_shape(vllm: EngineHarness) -> None:
    result = vllm.generate(completion_request("The sky is", max_tokens=5))

    assert result.error is None
    body = result.body
    json.dumps(body)
    assert body["object"] == "text_completion"
    (choice,) = body["choices"]
    assert isinstance(choice["text"], str) and choice["text"]
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert result.completion_tokens == usage["completion_tokens"] <= 5


def test_default_sampling_is_greedy_and_repeatable(vllm: EngineHarness) -> None:
    first = vllm.generate(chat_request("Name three colours.", max_tokens=12))
    second = vllm.generate(chat_request("Name three colours.", max_tokens=12))

    assert first.body["choices"][0]["message"]["content"]
    assert (
        first.body["choices"][0]["message"]["content"]
        == second.body["choices"][0]["message"]["content"]
    )


def test_max_tokens_ends_with_finish_reason_length(vllm: EngineHarness) -> None:
    by_max_tokens, by_max_completion_tokens = vllm.generate_all(
        chat_request("Write a long story about a dragon.", max_tokens=3),
        chat_request("Write a long story about a dragon.", max_completion_tokens=3),
    )

    for result in (by_max_tokens, by_max_completion_tokens):
        assert result.body["choices"][0]["finish_reason"] == "length"
        assert result.completion_tokens == 3


def test_stop_string_ends_the_output_before_it(vllm: EngineHarness) -> None:
    free = vllm.generate(completion_request("Monday, Tuesday, Wednesday,", max_tokens=12))
    text = free.body["choices"][0]["text"]
    stop_word = text.split()[1]  # a word the greedy output reaches after a few tokens

    stopped = vllm.generate(
        completion_request("Monday, Tuesday, Wednesday,", max_tokens=12, stop=[stop_word])
    )

    choice = stopped.body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["text"] == text[: text.index(stop_word)]


def test_over_long_prompt_fails_alone_while_its_neighbour_succeeds(
    vllm: EngineHarness,
) -> None:
    too_long, normal = vllm.generate_all(
        chat_request("word " * 200, max_context_length=64, max_tokens=4),
        chat_request("Say hello.", max_context_length=64, max_tokens=4),
    )

    assert too_long.body is None
    assert too_long.error["code"] == "context_length_exceeded"
    assert "64" in too_long.error["message"]
    assert normal.error is None
    assert normal.completion_tokens > 0


def test_prompt_over_the_model_context_is_context_length_exceeded(
    vllm: EngineHarness,
) -> None:
    context = vllm.engine.max_context_length

    result = vllm.generate(chat_request("word " * (context + 100), max_tokens=4))

    assert result.error["code"] == "context_length_exceeded"
    assert str(context) in result.error["message"]


def test_batch_context_cap_lowers_the_output_limit(vllm: EngineHarness) -> None:
    prompt = "Write a long story about a dragon."
    probe = vllm.generate(chat_request(prompt, max_tokens=1))

    capped = vllm.generate(chat_request(prompt, max_context_length=probe.prompt_tokens + 3))

    assert capped.completion_tokens == 3
    assert capped.body["choices"][0]["finish_reason"] == "length"


def test_a_body_naming_another_model_is_refused_not_answered(vllm: EngineHarness) -> None:
    # No substitution: validation and the per-model queues keep such a line from an
    # engine, and vLLM's OpenAIServingModels refuses it should one arrive anyway.
    request = chat_request("Hi", max_tokens=4)
    request.body["model"] = "gpt-4o"

    result = vllm.generate(request)

    assert result.body is None
    assert "gpt-4o" in result.error["message"], result.error


def test_invalid_parameters_become_error_results(vllm: EngineHarness) -> None:
    bad_requests = [
        chat_request("Hi", temperature=-1),
        chat_request("Hi", max_tokens="lots"),
        chat_request("Hi", top_p=7),
        EngineRequest(request_id="r-x", custom_id="x", endpoint=CHAT, body={"model": "m"}),
        EngineRequest(request_id="r-y", custom_id="y", endpoint="/v1/embeddings", body={}),
    ]

    results = vllm.generate_all(*bad_requests)

    for result in results:
        assert result.body is None
        assert result.error["code"] == "invalid_request", result.error
        assert result.error["message"]


def test_cancelling_generate_aborts_the_request_in_the_engine(vllm: EngineHarness) -> None:
    engine = vllm.engine
    unfinished = engine._llm.output_processor.get_num_unfinished_requests

    async def cancel_mid_generation() -> None:
        task = asyncio.create_task(
            engine.generate(chat_request("Write a long story about a dragon.", max_tokens=2000))
        )
        await wait_until(lambda: unfinished() == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert unfinished() == 0

    vllm.loop.run(cancel_mid_generation())

    after = vllm.generate(chat_request("Say hi.", max_tokens=3))
    assert after.error is None


def test_the_engine_tells_each_request_s_tokens_while_it_runs(vllm: EngineHarness) -> None:
    # What the ETA starts a chunk's requests in the engine from (Engine.progress,
    # Worker.chunk_tails): each request under its own id, whichever serving class
    # named it in the engine, with its tokens so far and its limit, read off the
    # engine loop as the heartbeat does.
    engine = vllm.engine
    chat = chat_request("Write a long story about a dragon.", max_tokens=120)
    completion = completion_request("Once upon a time", max_tokens=100)
    responses = EngineRequest(request_id=f"req-{next(_ids)}", custom_id="r",
                              endpoint="/v1/responses",
                              body={"model": DEFAULT_MODEL_NAME, "input": "Tell a long tale.",
                                    "max_output_tokens": 80})
    limits = {chat.request_id: 120, completion.request_id: 100, responses.request_id: 80}
    seen: list[dict] = []

    def read() -> bool:  # on this thread, as the heartbeat's
        now = engine.progress()
        seen.append(now)
        return set(now) == set(limits) and all(tokens >= 3 for tokens, _ in now.values())

    async def run() -> list[EngineResult]:
        tasks = [asyncio.create_task(engine.generate(r)) for r in (chat, completion, responses)]
        return await asyncio.gather(*tasks)

    future = asyncio.run_coroutine_threadsafe(run(), vllm.loop.loop)
    deadline = time.monotonic() + 120
    while not read():
        assert time.monotonic() < deadline and not future.done(), seen[-3:]
        time.sleep(0.05)
    assert {ours: limit for ours, (_, limit) in seen[-1].items()} == limits
    results = future.result(300)
    assert all(result.error is None for result in results), results
    # Tokens only grow, and none is told past its answer.
    answered = {r.request_id: result.completion_tokens
                for r, result in zip((chat, completion, responses), results, strict=True)}
    for ours in limits:
        told = [now[ours][0] for now in seen if ours in now]
        assert told == sorted(told) and told[-1] <= answered[ours]
    assert engine.progress() == {}


def test_sleep_mode_is_asked_of_vllm_only_where_the_platform_offers_it():
    """Multiplexing asks for sleep mode (EngineConfig.sleep_mode); the CPU build has
    none (vLLM's is_sleep_mode_available), so its swaps stop and start the engine."""
    from vllm.platforms import current_platform

    from inference.engines.vllm_engine import VllmEngine

    config = EngineConfig(engine="vllm", model="/models/m", served_model_name="m",
                          sleep_mode=True)
    args = VllmEngine(config).engine_args()
    assert args.enable_sleep_mode is current_platform.is_sleep_mode_available()
    assert not VllmEngine(config).can_sleep  # nothing started
