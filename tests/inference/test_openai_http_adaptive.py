"""The openai-http engine's adaptive concurrency against a scripted local server: the
gate holds the batch to its limit, the limit follows the server's /metrics (and the
batch's own latencies without them), and a cut stops the newest requests, which are
sent again and give one result each."""

from __future__ import annotations

import asyncio

import pytest

from inference.engines.adaptive_gate import AdmissionGate, metrics_url, parse_metrics
from tests.inference.openai_stub import Answer, OpenAIStub
from tests.inference.test_openai_http_engine import chat, engine_for, started

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def stub():
    server = OpenAIStub().start()
    yield server
    server.close()


def adaptive(stub: OpenAIStub, *, floor: int, ceiling: int):
    return engine_for(stub, adaptive=True, adaptive_target=1.5, adaptive_floor=floor,
                      adaptive_ceiling=ceiling)


async def until(predicate, timeout: float = 20.0, message: str = "") -> None:
    """Await a condition on the engine's loop (wait_until would block it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError(message)
        await asyncio.sleep(0.05)


async def test_without_server_metrics_the_batch_keeps_to_the_limit_and_reads_its_latency(stub):
    # Given: a server with no /metrics and a ceiling of 2.
    stub.answer(*[Answer(delay=0.3) for _ in range(6)])
    engine = await started(adaptive(stub, floor=2, ceiling=2))
    try:
        # When: six requests are given to the engine at once.
        results = await asyncio.gather(*(engine.generate(chat(f"b-0-0-{i}"))
                                         for i in range(6)))
        await until(lambda: engine.admission["signals"], message="a look at the server")
    finally:
        await engine.shutdown()

    # Then: never more than two at the server, all answered, the batch's own latency read.
    assert stub.peak_in_flight == 2
    assert [r.error for r in results] == [None] * 6
    assert engine.admission["source"] == "latency"
    assert engine.admission["mode"] == "blind"


async def test_other_traffic_cuts_the_batch_to_the_floor_and_stopped_requests_run_again(stub):
    # Given: a server with vLLM's /metrics and no other client; eight slow requests
    # (the first answers take 3 s; those sent again take none).
    stub.others = 0
    stub.answer(*[Answer(delay=3.0) for _ in range(8)])
    engine = await started(adaptive(stub, floor=1, ceiling=8))
    try:
        batch = [asyncio.ensure_future(engine.generate(chat(f"b-0-0-{i}"))) for i in range(8)]
        # The limit grows from the floor while nothing else uses the server.
        await until(lambda: stub.in_flight == 8, message="the batch to reach its ceiling")
        assert engine.admission["mode"] == "alone"

        # When: another client's request appears at the server.
        stub.others = 1
        await until(lambda: engine.admission["mode"] == "shared", message="the cut")

        # Then: the batch is at the floor at once: the seven newest were stopped.
        assert engine.admission["limit"] == 1
        assert engine.admission["shed_total"] == 7
        await until(lambda: stub.in_flight <= 1, message="the stopped requests to end")
        results = await asyncio.gather(*batch)
    finally:
        await engine.shutdown()

    # Each request gave one answer; the stopped ones were aborted at the server and
    # sent again under ids of their own.
    assert [r.error for r in results] == [None] * 8
    assert len(stub.posts(lambda seen: seen.aborted)) == 7
    again = stub.posts(lambda seen: "-again1" in seen.headers["x-request-id"])
    assert len(again) == 7
    assert engine.admission["signals"]["others"] == 1
    assert engine.admission["source"] == "metrics"


async def test_with_adaptive_concurrency_off_every_request_goes_at_once(stub):
    stub.answer(*[Answer(delay=0.3) for _ in range(6)])
    engine = await started(engine_for(stub, adaptive=False))
    try:
        results = await asyncio.gather(*(engine.generate(chat(f"b-0-0-{i}"))
                                         for i in range(6)))
    finally:
        await engine.shutdown()

    assert stub.peak_in_flight == 6
    assert [r.error for r in results] == [None] * 6
    assert engine.admission is None


async def test_a_cancelled_request_waiting_at_the_gate_leaves_it():
    gate = AdmissionGate(1)
    await gate.enter("a")
    waiting = asyncio.ensure_future(gate.enter("b"))
    third = asyncio.ensure_future(gate.enter("c"))
    await asyncio.sleep(0)
    assert gate.queued == 2

    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    gate.leave("a")
    await third

    assert (gate.in_flight, gate.queued) == (1, 0)  # c went in, b never did


def test_vllm_metrics_are_read_from_prometheus_text():
    text = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 40.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 40.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.8
"""
    figures = parse_metrics(text)
    assert (figures.running, figures.waiting) == (7, 2)
    assert (figures.inter_token_count, figures.inter_token_sum) == (40.0, 0.8)
    assert parse_metrics("# TYPE other gauge\nother 1\n") is None
    assert metrics_url("http://gpu:8000/v1/") == "http://gpu:8000/metrics"

