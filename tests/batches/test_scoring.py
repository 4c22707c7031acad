"""/v1/score and /v1/rerank batches (and vLLM's unversioned /score and /rerank): the
line checks with their exact codes and params, the specs, the endpoints each kind of
model serves, the simulated engine, and a batch through the in-process runtime."""

from __future__ import annotations

import asyncio
import json

import orjson
import pytest

from batches import quotas, services
from batches.models import BatchStatus, Chunk
from batches.validation import validate_file
from core.auth import apikey_create
from core.models import KeyUsage
from files import storage
from inference.engines.simulated import SimulatedEngine
from inference.slots import estimate_tokens
from serving.endpoints import endpoint_spec
from serving.engines.base import EngineConfig, EngineRequest
from serving.engines.registry import engine_spec
from serving.params import BatchParams
from tests.conftest import jsonl

SCORE, RERANK = "/v1/score", "/v1/rerank"


def score_line(custom_id: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": SCORE,
            "body": {"model": "m", "queries": "a query", "documents": ["one", "two"], **body}}


def rerank_line(custom_id: str, query="a query", **body) -> dict:
    body = {"model": "m", "query": query, "documents": ["one", "two", "three"], **body}
    return {"custom_id": custom_id, "method": "POST", "url": RERANK, "body": body}


def validate(tmp_path, lines, endpoint, **options):
    path = tmp_path / "in.jsonl"
    path.write_bytes(jsonl(lines))
    return validate_file(path, endpoint=endpoint, chunk_size=10, max_line_bytes=1 << 20,
                         max_requests=1000, **options)


def without(body: dict, *keys: str) -> dict:
    return {key: value for key, value in body.items() if key not in keys}


@pytest.mark.parametrize("body", [
    {"queries": "q", "documents": ["a", "b"]},
    {"queries": ["q", "r"], "documents": ["a", "b"]},
    {"text_1": "q", "text_2": "a"},
    {"text_1": ["q", "r"], "text_2": ["a", "b"], "truncate_prompt_tokens": -1},
    {"queries": "q", "items": ["a"]},
    {"data_1": "q", "data_2": ["a", "b"], "use_activation": True},
    {"queries": {"content": [{"type": "text", "text": "q"}]}, "documents": ["a"]},
], ids=["one-to-many", "one-to-one", "text-pair", "text-lists", "items", "data", "content"])
def test_vllms_score_forms_are_accepted(tmp_path, body):
    line = {"custom_id": "a", "method": "POST", "url": SCORE, "body": {"model": "m", **body}}
    report = validate(tmp_path, [line], SCORE)

    assert (report.total, report.invalid) == (1, 0), report.errors


def test_a_file_of_good_and_bad_lines_names_each_bad_lines_code_and_param(tmp_path):
    lines = [
        score_line("good-1"),
        score_line("no-second", documents=None),
        {**score_line("no-sides"), "body": {"model": "m"}},
        score_line("empty-docs", documents=[]),
        score_line("lengths", queries=["a", "b", "c"]),
        score_line("empty-text", documents=["a", ""]),
        score_line("truncate", truncate_prompt_tokens=-2),
        score_line("flag", use_activation="yes"),
        score_line("good-2", text_1="x"),
        {**score_line("wrong-url"), "url": RERANK},
    ]
    report = validate(tmp_path, lines, SCORE)

    found = {error["line"]: (error["code"], error["param"]) for error in report.errors}
    assert found == {
        2: ("invalid_body", "body.documents"),
        3: ("invalid_body", "body.text_1"),
        4: ("invalid_body", "body.documents"),
        5: ("invalid_body", "body.documents"),
        6: ("invalid_body", "body.documents"),
        7: ("invalid_body", "body.truncate_prompt_tokens"),
        8: ("invalid_body", "body.use_activation"),
        10: ("invalid_url", "url"),
    }
    assert report.total == 2


def test_a_rerank_file_of_good_and_bad_lines_names_each_bad_lines_code_and_param(tmp_path):
    lines = [
        rerank_line("good", top_n=2, return_documents=False),
        rerank_line("empty-docs", documents=[]),
        rerank_line("top-zero", top_n=0),
        rerank_line("top-float", top_n=1.5),
        rerank_line("no-query", query=None),
        rerank_line("list-query", query=["a", "b"]),
        rerank_line("return-docs", return_documents="no"),
        rerank_line("per-doc", max_tokens_per_doc=-1),
        {**rerank_line("no-model"), "body": without(rerank_line("x")["body"], "model")},
    ]
    report = validate(tmp_path, lines, RERANK)

    found = {error["line"]: (error["code"], error["param"]) for error in report.errors}
    assert found == {
        2: ("invalid_body", "body.documents"),
        3: ("invalid_body", "body.top_n"),
        4: ("invalid_body", "body.top_n"),
        5: ("invalid_body", "body.query"),
        6: ("invalid_body", "body.query"),
        7: ("invalid_body", "body.return_documents"),
        8: ("invalid_body", "body.max_tokens_per_doc"),
        9: ("invalid_body", "body.model"),
    }


@pytest.mark.parametrize("endpoint", [SCORE, "/score", RERANK, "/rerank"])
def test_a_chat_model_on_a_scoring_line_is_model_not_found(tmp_path, settings, endpoint):
    from serving.model_info import model_routes, served_models

    chat = settings.STORAGE_PATH / "m" / "chat"
    chat.mkdir(parents=True)
    (chat / "config.json").write_text('{"max_position_embeddings": 8192}')
    embed = settings.STORAGE_PATH / "m" / "embed"
    embed.mkdir(parents=True)
    (embed / "config.json").write_text('{"max_position_embeddings": 512}')
    (embed / "modules.json").write_text("[]")
    settings.BATCHGEN_ENGINE = "vllm"
    settings.BATCHGEN_MODELS = f"chat={chat},embed={embed}"
    served_models.cache_clear()
    try:
        routes = model_routes(endpoint)
    finally:
        served_models.cache_clear()
    lines = [{**line, "url": endpoint} for line in (
        score_line("a", model="embed") if "score" in endpoint else rerank_line("a", model="embed"),
        score_line("b", model="chat") if "score" in endpoint else rerank_line("b", model="chat"))]

    report = validate(tmp_path, lines, endpoint, models=routes)

    assert list(routes) == ["embed"]
    assert [(e["line"], e["code"], e["param"]) for e in report.errors] == [
        (2, "model_not_found", "body.model")]
    assert endpoint in report.errors[0]["message"]


def test_each_kind_of_model_serves_its_endpoints(tmp_path):
    embed, cross, chat = (tmp_path / name for name in ("embed", "cross", "chat"))
    for folder in (embed, cross, chat):
        folder.mkdir()
        (folder / "config.json").write_text('{"max_position_embeddings": 512}')
    (embed / "modules.json").write_text("[]")
    (cross / "config.json").write_text(json.dumps({
        "architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"},
        "max_position_embeddings": 512}))
    vllm = engine_spec("vllm")

    assert set(vllm.endpoints_for(embed)) == {"/v1/embeddings", SCORE, "/score", RERANK,
                                              "/rerank"}
    assert set(vllm.endpoints_for(cross)) == {SCORE, "/score", RERANK, "/rerank"}
    assert SCORE not in vllm.endpoints_for(chat) and RERANK not in vllm.endpoints_for(chat)


def test_prefix_grouping_keys_on_the_query():
    score, rerank = endpoint_spec(SCORE), endpoint_spec(RERANK)
    same_query = [rerank_line("a", documents=["x"])["body"],
                  rerank_line("b", documents=["y", "z"], top_n=1)["body"]]
    line = rerank.decoder.decode(json.dumps(rerank_line("c", documents=["w"])).encode())

    assert rerank.prefix_key(same_query[0]) == rerank.prefix_key(same_query[1])
    assert rerank.prefix_key_of_line(line) == rerank.prefix_key(same_query[0])
    assert rerank.prefix_key(rerank_line("d", query="another")["body"]) != rerank.prefix_key(
        same_query[0])
    assert score.prefix_key(score_line("a")["body"]) == score.prefix_key(
        {"text_1": "a query", "text_2": "else"})


def test_the_body_runs_as_sent_and_no_output_is_counted():
    body = rerank_line("a", temperature=9)["body"]
    request = EngineRequest(request_id="r", custom_id="a", endpoint=RERANK, body=body)

    assert endpoint_spec(RERANK).resolve_body(
        body, BatchParams(temperature=0.5, max_decoding_length=9)) == body
    # "a query" + "one" "two" "three": 18 characters, the input alone.
    assert estimate_tokens(request) == 18 // 4 + 1


def simulated(endpoint: str, body: dict):
    engine = SimulatedEngine(EngineConfig(engine="simulated", model="m", served_model_name="m"))
    request = EngineRequest(request_id="r", custom_id="a", endpoint=endpoint, body=body)
    return asyncio.run(engine.generate(request))


def test_the_simulated_engine_scores_and_reranks_consistently():
    documents = ["one", "two", "three"]
    scored = simulated(SCORE, {"model": "m", "text_1": "q", "text_2": documents})
    reranked = simulated(RERANK, {"model": "m", "query": "q", "documents": documents,
                                  "top_n": 2, "return_documents": False})

    scores = [item["score"] for item in scored.body["data"]]
    best = sorted(range(3), key=lambda i: -scores[i])[:2]
    assert [result["index"] for result in reranked.body["results"]] == best
    assert [result["relevance_score"] for result in reranked.body["results"]] == [
        scores[i] for i in best]
    assert all("document" not in result for result in reranked.body["results"])
    assert scored.body["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    assert scored.completion_tokens == reranked.completion_tokens == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("endpoint", [RERANK, "/score"])
def test_a_scoring_batch_runs_to_completion_and_sums_its_usage(finished_batch, endpoint):
    maker = rerank_line if "rerank" in endpoint else score_line
    lines = [{**maker(f"r{i}", documents=[f"doc {i}", "shared"]), "url": endpoint}
             for i in range(5)]
    batch, outputs = finished_batch(lines, endpoint=endpoint)

    assert batch.status == BatchStatus.COMPLETED
    assert (batch.total, batch.completed, batch.failed) == (5, 5, 0)
    usages = [output["response"]["body"]["usage"] for output in outputs]
    assert all("completion_tokens" not in usage for usage in usages)
    assert batch.usage_input_tokens == sum(usage["prompt_tokens"] for usage in usages) > 0
    assert batch.usage_output_tokens == 0


@pytest.mark.django_db(transaction=True)
def test_a_keyed_rerank_batch_sums_its_usage_into_the_key_and_the_admin_filters_it(
        api, admin_client, runtime_factory, upload, settings, published):
    settings.BATCHGEN_CHUNK_SIZE = 2
    key, raw_key = apikey_create(name="team-rerank")
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    file = upload(jsonl([rerank_line(f"r{i}", query=f"query {i % 2}", top_n=2)
                         for i in range(5)]))
    created = api.post("/v1/batches", {"input_file_id": file["id"], "endpoint": RERANK,
                                       "completion_window": "24h"}, format="json")
    assert created.status_code == 200, created.content
    batch = services.batch_validate(batch_id=created.json()["id"])
    runtime = runtime_factory()
    for chunk in Chunk.objects.filter(batch=batch).order_by("index"):
        runtime.run_chunk(chunk.id)
    services.batch_finalize(batch_id=batch.id)

    shown = api.get(f"/v1/batches/{batch.id}").json()
    assert shown["status"] == "completed" and shown["request_counts"]["completed"] == 5
    path = storage.absolute(storage.incremental_name(batch.id))
    bodies = [orjson.loads(raw)["response"]["body"] for raw in path.read_bytes().splitlines()]
    assert all(len(body["results"]) == 2 for body in bodies)
    input_tokens = sum(body["usage"]["prompt_tokens"] for body in bodies)
    assert shown["usage"]["input_tokens"] == input_tokens > 0
    assert shown["usage"]["output_tokens"] == 0
    row = KeyUsage.objects.get(key=key, day=quotas.utc_today())
    assert (row.input_tokens, row.output_tokens) == (input_tokens, 0)
    listing = admin_client.get("/admin/batches/batch/", {"endpoint": RERANK})
    assert listing.status_code == 200 and batch.id in listing.content.decode()
    assert batch.id not in admin_client.get("/admin/batches/batch/", {
        "endpoint": SCORE}).content.decode()
