"""Score and rerank lines on the openai-http engine, against the scripted server:
forwarded to the server's /score and /rerank (under its /v1), answered as the API
contract shapes them, and refused per line by a server that has no such endpoint."""

from __future__ import annotations

import pytest

from serving.engines.base import EngineRequest
from tests.inference.openai_stub import MODEL, Answer, OpenAIStub
from tests.inference.test_openai_http_engine import engine_for, started

pytestmark = pytest.mark.anyio

# As vLLM's server answers a rerank (RerankResponse: no object, no created).
VLLM_RERANK = {"id": "score-x", "model": MODEL,
               "usage": {"prompt_tokens": 21, "total_tokens": 21},
               "results": [{"index": 1, "document": {"text": "b", "multi_modal": None},
                            "relevance_score": 0.9},
                           {"index": 0, "document": {"text": "a", "multi_modal": None},
                            "relevance_score": 0.2}]}
VLLM_SCORE = {"id": "score-y", "object": "list", "created": 1, "model": MODEL,
              "data": [{"index": 0, "object": "score", "score": 0.5}],
              "usage": {"prompt_tokens": 9, "total_tokens": 9, "completion_tokens": 0,
                        "prompt_tokens_details": None}}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def stub():
    server = OpenAIStub().start()
    yield server
    server.close()


def line(endpoint: str, **body) -> EngineRequest:
    return EngineRequest(request_id="b-0-0-1", custom_id="a", endpoint=endpoint,
                         body={"model": "m", **body})


async def test_rerank_and_score_lines_go_to_the_servers_endpoints(stub):
    stub.answer(Answer(200, VLLM_RERANK), Answer(200, VLLM_RERANK), Answer(200, VLLM_SCORE))
    engine = await started(engine_for(stub))
    try:
        kept = await engine.generate(line("/v1/rerank", query="q", documents=["a", "b"]))
        bare = await engine.generate(line("/rerank", query="q", documents=["a", "b"],
                                          return_documents=False))
        scored = await engine.generate(line("/v1/score", text_1="q", text_2="a"))
    finally:
        await engine.shutdown()

    paths = [seen.path for seen in stub.posts()]
    assert paths == ["rerank", "rerank", "score"]  # under the server's /v1, both spellings
    assert all(seen.body["model"] == MODEL and "stream" not in seen.body
               for seen in stub.posts())
    assert kept.body["model"] == "m"
    assert kept.body["results"][0] == {"index": 1, "document": {"text": "b"},
                                       "relevance_score": 0.9}
    assert all("document" not in result for result in bare.body["results"])
    assert scored.body["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    assert (scored.prompt_tokens, scored.completion_tokens) == (9, 0)


async def test_a_server_without_the_endpoint_refuses_the_line_not_the_batch(stub):
    stub.answer(Answer(404, {"detail": "Not Found"}),
                Answer(501, {"error": {"message": "The model does not support Score API"}}),
                Answer(404, {"error": {"message": "The model `x` does not exist.",
                                       "code": 404}}),
                Answer(200, VLLM_RERANK))
    engine = await started(engine_for(stub))
    try:
        results = [await engine.generate(line(endpoint, query="q", documents=["a", "b"]))
                   for endpoint in ("/v1/rerank", "/v1/rerank", "/v1/rerank", "/rerank")]
    finally:
        await engine.shutdown()

    assert [result.error["code"] if result.error else None for result in results] == [
        "unsupported_endpoint", "unsupported_endpoint", "model_not_found", None]
    assert "does not serve /v1/rerank" in results[0].error["message"]
    assert "HTTP 404" in results[0].error["message"]
    assert len(stub.posts()) == 4, "a 404 or a 501 is not retried"
