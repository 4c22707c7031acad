"""The simulated engine's time per token (BATCHGEN_SIM_TOKEN_LATENCY_MS) and its
answers of varied lengths (engine_args answer_tokens): what benchmarks/eta.py plays
a fleet with. Real asyncio sleeps, a few tenths of a second in all."""

from __future__ import annotations

import asyncio
import time

from inference.engines.simulated import PROMPT_TOKEN_FRACTION, SimulatedEngine
from serving.engines.base import EngineConfig, EngineRequest

CHAT = "/v1/chat/completions"


def engine(**options) -> SimulatedEngine:
    return SimulatedEngine(EngineConfig(engine="simulated", model="m", served_model_name="m",
                                        **options))


def request(content: str, max_tokens: int | None = None, n: int = 0) -> EngineRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    if max_tokens:
        body["max_tokens"] = max_tokens
    return EngineRequest(request_id=f"r-{n}", custom_id=f"c-{n}", endpoint=CHAT, body=body)


def timed(sim: SimulatedEngine, req: EngineRequest):
    started = time.perf_counter()
    result = asyncio.run(sim.generate(req))
    return result, time.perf_counter() - started


def test_a_request_takes_its_base_plus_its_tokens_times_the_token_latency():
    sim = engine(sim_latency_ms=20, sim_token_latency_ms=2,
                 engine_args={"answer_tokens": [100, 100]})
    short, short_took = timed(sim, request("one two three four", max_tokens=5))
    long, long_took = timed(sim, request("one two three four", max_tokens=100))
    assert (short.completion_tokens, long.completion_tokens) == (5, 100)
    for result, took in ((short, short_took), (long, long_took)):
        expected = 0.020 + 0.002 * (result.completion_tokens
                                    + PROMPT_TOKEN_FRACTION * result.prompt_tokens)
        assert expected <= took < expected + 0.1, (result.completion_tokens, took)
    assert long.body["choices"][0]["finish_reason"] == "stop"
    assert short.body["choices"][0]["finish_reason"] == "length"


def test_answer_lengths_vary_by_prompt_within_the_range_and_repeat_exactly():
    sim = engine(engine_args={"answer_tokens": [20, 400]})
    lengths = [asyncio.run(sim.generate(request(f"prompt {i}"))).completion_tokens
               for i in range(40)]
    again = [asyncio.run(sim.generate(request(f"prompt {i}"))).completion_tokens
             for i in range(40)]
    assert lengths == again
    assert min(lengths) >= 20 and max(lengths) <= 400
    assert len(set(lengths)) > 30  # varied, not one length


def test_without_the_settings_it_answers_as_before_eight_words_at_once():
    result, took = timed(engine(), request("hello there"))
    assert result.completion_tokens == 8 and took < 0.05


def test_requests_in_flight_wait_together_not_one_after_another():
    sim = engine(sim_token_latency_ms=5, engine_args={"answer_tokens": [20, 20]})

    async def many():
        return await asyncio.gather(*(sim.generate(request(f"p {i}", n=i)) for i in range(300)))

    started = time.perf_counter()
    results = asyncio.run(many())
    took = time.perf_counter() - started
    assert all(result.completion_tokens == 20 for result in results)
    # Each takes 0.1 s; 300 one after another would take 30 s. Their 6,000 timer
    # wake-ups took 1.1 s once on a loaded CI machine: the bound is room for that, and
    # still a sixth of the time one after another.
    assert took < 5.0, took
