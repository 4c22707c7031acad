"""/health and /v1/models."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Worker
from serving.model_info import SERVER_STARTED, served_model
from tests.conftest import error_of

pytestmark = pytest.mark.django_db


def worker(name: str = "w1", *, ready: bool = True, age_seconds: float = 0,
           stopped: bool = False, **fields) -> Worker:
    now = timezone.now()
    return Worker.objects.create(
        name=name, hostname="host", pid=1234, engine="simulated", model="m",
        slots_capacity=8, ready=ready, heartbeat_at=now - timedelta(seconds=age_seconds),
        stopped_at=now if stopped else None, **fields,
    )


# --- models ---------------------------------------------------------------------------


def test_models_lists_exactly_the_served_model(api):
    response = api.get("/v1/models")

    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert len(body["data"]) == 1
    model = body["data"][0]
    assert model["id"] == served_model().id
    assert model["object"] == "model"
    assert model["created"] == SERVER_STARTED
    assert isinstance(model["created"], int)
    assert model["owned_by"] == "batchgen"
    assert isinstance(model["max_context_length"], int) and model["max_context_length"] > 0


def test_model_detail_returns_the_served_model(api):
    model_id = served_model().id

    response = api.get(f"/v1/models/{model_id}")

    assert response.status_code == 200
    assert response.json() == api.get("/v1/models").json()["data"][0]


@pytest.fixture
def remote_model_unasked(settings):
    """A remote engine's model whose server the web process could not ask (nothing
    listens at its URL): the catalogue has no context for it."""
    settings.BATCHGEN_ENGINE_URL = "http://127.0.0.1:9/v1"
    settings.BATCHGEN_MODELS = "m=remote-model:openai-http"
    served_model.cache_clear()
    yield
    served_model.cache_clear()


def test_a_remote_models_context_comes_from_its_ready_worker_when_the_server_did_not_say(
        api, remote_model_unasked):
    """`serve` starts the web process and the engine's server together: the web process
    may ask before the server is up, and read again only seconds later. /health is 200
    as soon as a worker is ready, and /v1/models shows the context that worker's engine
    started with meanwhile, not 0."""
    assert api.get("/v1/models").json()["data"][0]["max_context_length"] == 0
    worker("w-loading", ready=False, max_context_length=0)
    worker("w-gone", age_seconds=3600, max_context_length=4096)
    assert api.get("/v1/models").json()["data"][0]["max_context_length"] == 0

    worker("w-ready", max_context_length=8192)

    assert api.get("/health").status_code == 200
    [model] = api.get("/v1/models").json()["data"]
    assert (model["id"], model["engine"], model["max_context_length"]) == (
        "m", "openai-http", 8192)


def test_a_batch_over_a_remote_models_context_is_refused_while_the_server_was_not_asked(
        api, upload, remote_model_unasked, published):
    """Batch create checks `max_context_length` against the same context /v1/models
    shows (fleet.selectors.model_contexts): the ready worker's, not an unknown 0 that
    would let any value through."""
    from tests.conftest import chat_line, jsonl

    worker("w-ready", max_context_length=8192)
    file_id = upload(jsonl([chat_line("a")]))["id"]

    response = api.post("/v1/batches", {
        "input_file_id": file_id, "endpoint": "/v1/chat/completions",
        "completion_window": "24h", "max_context_length": 8193}, format="json")

    error = error_of(response, 400)
    assert error["param"] == "max_context_length" and "8192" in error["message"]


@pytest.mark.parametrize("model_id", ["gpt-4o", "Kimi-K2.5", "org/some-model"])
def test_model_detail_of_another_model_is_404(api, model_id):
    error = error_of(api.get(f"/v1/models/{model_id}"), 404)

    assert error["code"] == "model_not_found"


# --- health ---------------------------------------------------------------------------


def test_health_is_503_with_a_reason_when_no_worker_is_alive(api):
    response = api.get("/health")

    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unhealthy"
    assert "no inference worker" in body["reason"]


def test_health_is_200_with_a_live_ready_worker(api):
    worker()

    response = api.get("/health")

    assert response.status_code == 200
    assert response.json() == {"status": "healthy"}


def test_health_is_503_while_the_only_worker_is_still_loading_its_engine(api):
    worker(ready=False)

    response = api.get("/health")

    assert response.status_code == 503
    assert "none with its engine ready" in response.json()["reason"]


@pytest.mark.parametrize("stale", [
    {"age_seconds": 3600}, {"stopped": True},
], ids=["heartbeat-too-old", "stopped"])
def test_health_ignores_workers_that_are_gone(api, stale):
    worker(**stale)

    response = api.get("/health")

    assert response.status_code == 503
    assert response.json()["status"] == "unhealthy"


def test_health_is_503_when_the_broker_is_unreachable(api, monkeypatch):
    worker()
    from core.celery import app

    def refuse(*args, **kwargs):
        raise ConnectionRefusedError("broker down")

    monkeypatch.setattr(app, "connection_for_write", refuse)

    response = api.get("/health")

    assert response.status_code == 503
    assert "broker" in response.json()["reason"]


def test_health_names_a_served_model_that_has_no_ready_worker(api, settings):
    # Given: two served models, a ready worker for one of them only (the other's
    # engine cannot start, say)
    from serving.model_info import served_models

    settings.BATCHGEN_MODELS = "m=/models/m,embed=/models/embed"
    served_models.cache_clear()
    try:
        worker()

        response = api.get("/health")

        assert response.status_code == 503
        assert response.json()["status"] == "unhealthy"
        assert "no inference worker of model embed is alive" in response.json()["reason"]
    finally:
        served_models.cache_clear()
