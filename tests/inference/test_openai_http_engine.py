"""The openai-http engine against a scripted local server: the request it sends, the
errors it maps, what it retries (and for how long), Retry-After, restarts of the
server, cancellation, and start-up waiting for the server."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from inference.engines.openai_http import OpenAIHttpEngine
from serving.endpoints import ENDPOINTS
from serving.engines.base import EngineConfig, EngineRequest, EngineUnavailable
from tests.e2e.harness import wait_until
from tests.inference.openai_stub import MAX_MODEL_LEN, MODEL, Answer, OpenAIStub

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
VLLM_400 = {"error": {"message": "temperature must be in [0, 2], got 5.0.",
                      "type": "BadRequestError", "param": "temperature", "code": 400}}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def stub():
    server = OpenAIStub().start()
    yield server
    server.close()


def engine_for(stub: OpenAIStub, **options) -> OpenAIHttpEngine:
    # Adaptive concurrency on, as BATCHGEN_ADAPTIVE_CONCURRENCY's default: the stub has
    # no /metrics, so the gate follows the requests' own latencies from a floor of 1.
    config = {"engine": "openai-http", "model": MODEL, "served_model_name": "m",
              "engine_url": stub.url, "engine_priority": 100, "engine_retry_seconds": 20.0,
              "engine_start_timeout": 20.0, "adaptive": True, **options}
    return OpenAIHttpEngine(EngineConfig(**config))


def chat(request_id: str = "b-0-0-1", **body) -> EngineRequest:
    return EngineRequest(request_id=request_id, custom_id=request_id, endpoint=CHAT,
                         body={"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                               "temperature": 0, **body})


async def started(engine: OpenAIHttpEngine) -> OpenAIHttpEngine:
    await engine.start()
    return engine


async def test_a_request_goes_to_the_servers_endpoint_under_its_model_id(stub):
    engine = await started(engine_for(stub))
    try:
        result = await engine.generate(chat(max_completion_tokens=5))
    finally:
        await engine.shutdown()

    [sent] = stub.posts()
    assert sent.path == "chat/completions"
    assert sent.body["model"] == MODEL and sent.body["priority"] == 100
    assert sent.body["stream"] is False and sent.body["max_completion_tokens"] == 5
    assert sent.headers["x-request-id"] == "b-0-0-1-1"  # the attempt's number added
    assert engine.max_context_length == MAX_MODEL_LEN
    # The output is BatchGen's: its model id, no nulls, the contract's message fields.
    assert result.error is None and result.body["model"] == "m"
    assert "kv_transfer_params" not in result.body
    message = result.body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Paris.", "reasoning_content": None,
                       "tool_calls": []}
    assert (result.prompt_tokens, result.completion_tokens) == (7, 2)


# A Response as vLLM's server writes it (nulls and its per-turn usage lists included).
VLLM_RESPONSE = {
    "id": "resp_x", "object": "response", "created_at": 1, "model": MODEL, "status": "completed",
    "output": [{"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "Paris.", "annotations": [],
                             "logprobs": None}]}],
    "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "temperature": 0.0,
    "top_p": 1.0, "background": False, "max_output_tokens": 5, "service_tier": "auto",
    "truncation": "disabled", "error": None, "kv_transfer_params": None,
    "usage": {"input_tokens": 11, "output_tokens": 2, "total_tokens": 13,
              "input_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 0,
                                       "input_tokens_per_turn": [11]},
              "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                        "output_tokens_per_turn": [2]}}}


async def test_a_responses_line_goes_to_the_servers_responses_endpoint(stub):
    from openai.types.responses import Response

    from serving.endpoints import endpoint_spec
    from serving.params import BatchParams

    stub.answer(Answer(200, VLLM_RESPONSE))
    engine = await started(engine_for(stub))
    body = endpoint_spec("/v1/responses").resolve_body(
        {"model": "m", "input": "Capital of France?", "store": True},
        BatchParams(max_decoding_length=50))
    try:
        result = await engine.generate(EngineRequest(
            request_id="b-0-0-1", custom_id="a", endpoint="/v1/responses", body=body,
            max_context_length=30))
    finally:
        await engine.shutdown()

    [sent] = stub.posts()
    assert sent.path == "responses" and sent.body["model"] == MODEL
    assert sent.body["stream"] is False and sent.body["store"] is False
    # The batch's cap lowers the output limit under its own name.
    assert sent.body["max_output_tokens"] == 30 and "max_tokens" not in sent.body
    assert result.error is None and result.body["model"] == "m"
    assert (result.prompt_tokens, result.completion_tokens) == (11, 2)
    usage = result.body["usage"]
    assert usage["input_tokens_details"] == {"cached_tokens": 8, "cache_write_tokens": 0}
    assert Response.model_validate(result.body).output_text == "Paris."


async def test_a_4xx_is_the_lines_error_with_the_servers_status_and_message(stub):
    stub.answer(
        Answer(400, VLLM_400),
        Answer(400, {"error": {"message": "This model's maximum context length is 4096 "
                                          "tokens. However, your prompt contains 5000",
                               "param": "input_tokens", "code": 400}}),
        Answer(404, {"error": {"message": "The model `x` does not exist.", "code": 404}}),
        Answer(422, {"detail": "Unprocessable"}),
        Answer(500, {"error": {"message": "EngineCore hiccup"}}),
    )
    engine = await started(engine_for(stub))
    try:
        results = [await engine.generate(chat(f"r{i}")) for i in range(5)]
    finally:
        await engine.shutdown()

    codes = [result.error["code"] for result in results]
    assert codes == ["invalid_request", "context_length_exceeded", "model_not_found",
                     "invalid_request", "engine_error"]
    assert results[0].error["message"] == (
        "temperature must be in [0, 2], got 5.0. (HTTP 400 from the engine server)")
    assert "HTTP 422" in results[3].error["message"] and "Unprocessable" in results[3].error[
        "message"]
    assert len(stub.posts()) == 5, "a 4xx or a 500 is not retried"


async def test_a_line_naming_another_model_is_refused_without_a_request(stub):
    engine = await started(engine_for(stub))
    try:
        result = await engine.generate(chat(model="other"))
    finally:
        await engine.shutdown()
    assert result.error["code"] == "model_not_found"
    assert stub.posts() == []


async def test_429_502_503_504_are_retried_and_retry_after_is_honoured(stub):
    stub.answer(Answer(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "2"}),
                Answer(502), Answer(503), Answer(504))
    engine = await started(engine_for(stub))
    try:
        result = await engine.generate(chat())
    finally:
        await engine.shutdown()

    assert result.error is None and result.body["choices"][0]["message"]["content"] == "Paris."
    attempts = stub.posts()
    assert len(attempts) == 5
    assert [seen.headers["x-request-id"] for seen in attempts] == [
        f"b-0-0-1-{number}" for number in range(1, 6)]
    # Without Retry-After the first backoff is under a second (full jitter from 0.5 s).
    assert attempts[1].at - attempts[0].at >= 2.0


@pytest.mark.parametrize("status", [503, 429])
async def test_retries_stop_after_the_retry_time_with_the_last_answer_as_the_error(stub, status):
    stub.answer(*[Answer(status, {"error": {"message": "overloaded"}})] * 100)
    engine = await started(engine_for(stub, engine_retry_seconds=1.5))
    began = time.monotonic()
    try:
        result = await engine.generate(chat())
    finally:
        await engine.shutdown()

    assert time.monotonic() - began < 1.5 + 1.0
    assert len(stub.posts()) >= 2
    assert result.error == {"code": "engine_error",
                            "message": f"overloaded (HTTP {status} from the engine server)"}


async def test_a_slow_answer_times_out_and_is_retried_then_fails_alone(stub):
    stub.answer(Answer(delay=5), Answer(delay=5), Answer(delay=5), Answer(delay=5))
    engine = await started(engine_for(stub, engine_timeout=0.3, engine_retry_seconds=1.0))
    try:
        result = await engine.generate(chat())
    finally:
        await engine.shutdown()

    assert result.error["code"] == "engine_error"
    assert result.error["message"].startswith(
        "no answer within 0.3 s on the last attempt (ReadTimeout)")
    assert len(stub.posts()) >= 2
    # Each timed-out attempt was abandoned: the server saw its client go.
    wait_until(lambda: all(seen.aborted for seen in stub.posts()), timeout=5)


async def test_a_dropped_connection_and_a_restart_give_one_answer(stub):
    """The server closes the connection mid-request, then goes down and comes back on
    the same port: the request is retried through both and answered once."""
    stub.answer(Answer(drop=True), Answer(delay=30))
    engine = await started(engine_for(stub))
    try:
        task = asyncio.create_task(engine.generate(chat()))
        await asyncio.to_thread(wait_until, lambda: len(stub.posts()) == 2, timeout=10)
        await asyncio.to_thread(stub.stop)  # killed with the second attempt in flight
        await asyncio.sleep(1.5)  # down: attempts meanwhile are refused
        await asyncio.to_thread(stub.start)
        result = await asyncio.wait_for(task, 30)
    finally:
        await engine.shutdown()

    assert result.error is None and result.body["model"] == "m"
    answered = [seen for seen in stub.posts() if not seen.aborted]
    assert len(stub.posts()) == 3 and len(answered) == 2  # the dropped one and the last


async def test_a_server_that_stays_down_makes_the_engine_unavailable(stub, caplog):
    engine = await started(engine_for(stub, engine_retry_seconds=1.0))
    stub.stop()
    try:
        with caplog.at_level(logging.WARNING, "inference.engines.openai_http"):
            with pytest.raises(EngineUnavailable, match="has not answered for 1 s"):
                await engine.generate(chat())
    finally:
        await engine.shutdown()
    assert "requests retry for up to 1 s" in caplog.text


async def test_cancelling_a_request_aborts_it_on_the_server(stub):
    stub.answer(Answer(delay=30))
    engine = await started(engine_for(stub))
    try:
        task = asyncio.create_task(engine.generate(chat()))
        await asyncio.to_thread(wait_until, lambda: stub.posts(), timeout=10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.to_thread(wait_until, lambda: stub.posts()[0].aborted, timeout=5)
    finally:
        await engine.shutdown()
    assert len(stub.posts()) == 1, "a cancelled request is not retried"


# How servers refuse the field: older vLLM without --scheduling-policy priority, and
# a server whose request model forbids unknown fields.
REFUSALS = [Answer(400, {"error": {"message": "Got priority 100 but Priority scheduling is "
                                              "not enabled."}}),
            Answer(422, {"detail": [{"loc": ["body", "priority"],
                                     "msg": "Extra inputs are not permitted"}]})]


@pytest.mark.parametrize("refusal", REFUSALS, ids=["400", "422"])
async def test_a_server_refusing_the_priority_field_is_sent_none_after(stub, caplog, refusal):
    stub.answer(refusal)
    engine = await started(engine_for(stub))
    try:
        with caplog.at_level(logging.WARNING, "inference.engines.openai_http"):
            first = await engine.generate(chat("a"))
            second = await engine.generate(chat("b"))
    finally:
        await engine.shutdown()

    assert first.error is None and second.error is None
    assert ["priority" in seen.body for seen in stub.posts()] == [True, False, False]
    assert caplog.text.count("refuses the priority field") == 1


async def test_no_priority_is_sent_when_the_setting_is_empty(stub):
    engine = await started(engine_for(stub, engine_priority=None))
    try:
        await engine.generate(chat())
    finally:
        await engine.shutdown()
    assert "priority" not in stub.posts()[0].body


async def test_start_waits_for_the_server_to_list_the_model(stub, caplog):
    stub.stop()
    engine = engine_for(stub)
    with caplog.at_level(logging.WARNING, "inference.engines.openai_http"):
        starting = asyncio.create_task(engine.start())
        await asyncio.sleep(1.0)
        assert not starting.done()
        stub.models_status = 503  # up, still loading its model
        await asyncio.to_thread(stub.start)
        await asyncio.sleep(1.0)
        assert not starting.done()
        stub.models_status = 200
        await asyncio.wait_for(starting, 15)
    await engine.shutdown()
    assert f"waiting for the engine server at {stub.url} to serve '{MODEL}'" in caplog.text


async def test_start_gives_up_after_the_start_timeout(stub):
    stub.stop()
    engine = engine_for(stub, engine_start_timeout=1.0)
    with pytest.raises(RuntimeError, match="did not list its models within 1 s"):
        await engine.start()


async def test_start_fails_at_once_when_the_server_does_not_serve_the_model(stub):
    engine = engine_for(stub, model="other-model")
    began = time.monotonic()
    with pytest.raises(RuntimeError, match=r"does not serve 'other-model'; it serves "
                                           r"\['remote-model'\]"):
        await engine.start()
    assert time.monotonic() - began < 5


def served_remote_model(settings, stub: OpenAIStub):
    """The one served model of BATCHGEN_MODELS naming the stub's model, as the web
    process reads it."""
    from serving.model_info import served_models

    settings.BATCHGEN_ENGINE_URL = stub.url
    settings.BATCHGEN_MODELS = f"m={MODEL}:openai-http"
    served_models.cache_clear()
    try:
        [model] = served_models()
    finally:
        served_models.cache_clear()
    return model


def test_the_served_models_take_the_remote_context(settings, stub):
    model = served_remote_model(settings, stub)
    assert (model.id, model.path, model.engine) == ("m", MODEL, "openai-http")
    assert model.max_context_length == MAX_MODEL_LEN
    # What the model does is the server's business: every endpoint goes through.
    assert set(model.endpoints) == set(ENDPOINTS)


def test_the_served_models_show_no_context_while_the_server_is_down(settings, stub):
    stub.stop()
    assert served_remote_model(settings, stub).max_context_length == 0


def test_a_context_the_server_could_not_give_is_asked_again_once_it_is_up(
        settings, stub, monkeypatch):
    """A web process that read the models before the engine's server was up (serve
    starts both at once, and /health asks at once) shows the server's context once it
    answers, not a 0 kept for the life of the process."""
    from serving import model_info

    monkeypatch.setattr(model_info, "UNSETTLED_SECONDS", 0.0)
    settings.BATCHGEN_ENGINE_URL = stub.url
    settings.BATCHGEN_MODELS = f"m={MODEL}:openai-http"
    model_info.served_models.cache_clear()
    try:
        stub.stop()
        assert model_info.served_model().max_context_length == 0
        stub.start()
        assert model_info.served_model().max_context_length == MAX_MODEL_LEN
        stub.stop()  # a settled catalogue is kept: the server is not asked again
        assert model_info.served_model().max_context_length == MAX_MODEL_LEN
    finally:
        model_info.served_models.cache_clear()
