from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile  # noqa: F401
from rest_framework.test import APIClient

from tests.s3 import s3_server, s3_storage  # noqa: F401 - the S3 server fixtures


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Tests marked `postgresql` prove row-lock behaviour SQLite does not have (its
    writers take turns). The SQLite pass leaves them out rather than skipping them;
    `make test`'s PostgreSQL pass runs them."""
    from django.conf import settings

    if not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        kept = [item for item in items if item.get_closest_marker("postgresql") is None]
        if len(kept) != len(items):
            config.hook.pytest_deselected(items=[i for i in items if i not in kept])
            items[:] = kept
    if hasattr(config, "workerinput"):  # an xdist worker: see tests/xdist_schedule.py
        from tests.xdist_schedule import prepare_worker_items

        prepare_worker_items(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from tests.xdist_schedule import make_scheduler

    return make_scheduler(config, log)


@pytest.fixture(autouse=True)
def storage(settings, tmp_path) -> Path:
    """Every test gets its own storage path."""
    root = tmp_path / "storage"
    settings.STORAGE_PATH = root
    settings.UPLOADS_DIR = root / "uploads"
    settings.INCREMENTAL_DIR = root / "incremental"
    settings.RUN_DIR = root / "run"
    for path in (settings.UPLOADS_DIR, settings.INCREMENTAL_DIR, settings.RUN_DIR):
        path.mkdir(parents=True)
    return root


@pytest.fixture(autouse=True)
def fresh_process_state():
    """What a server process remembers between requests starts empty in each test:
    its cache (pool status), whether it has seen an API key (a test's rollback
    takes its keys away) and what its estimates refresh saw of the chunks."""
    from django.core.cache import caches

    from batches.estimates import PROGRESS
    from core.auth import forget_keys_seen

    caches["default"].clear()
    forget_keys_seen()
    PROGRESS.forget()  # the estimates refresh's memory of the workers' figures
    yield
    forget_keys_seen()


@pytest.fixture
def two_models(settings):
    """The server serves "m" (the default, first) and "e"."""
    from serving.model_info import served_models

    settings.BATCHGEN_MODELS = "m=/models/m,e=/models/e"
    served_models.cache_clear()
    yield
    served_models.cache_clear()


@pytest.fixture
def api() -> APIClient:
    return APIClient()


def chat_line(custom_id: str, content: str = "Hello", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": content}], **body}}


def completion_line(custom_id: str, prompt: str = "Once upon", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"model": "m", "prompt": prompt, **body}}


def jsonl(items) -> bytes:
    return b"".join(
        (item if isinstance(item, bytes) else json.dumps(item).encode()) + b"\n" for item in items
    )


def error_of(response, status: int) -> dict:
    """The OpenAI error envelope of a response, checked in full; returns its `error`."""
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = json.loads(response.content)
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert error["param"] is None or isinstance(error["param"], str)
    assert error["code"] is None or isinstance(error["code"], str)
    return error


@pytest.fixture
def upload(api):
    """Upload bytes through the API; returns the File JSON."""

    def _upload(content: bytes, filename: str = "input.jsonl") -> dict:
        from io import BytesIO

        handle = BytesIO(content)
        handle.name = filename
        response = api.post("/v1/files", {"file": handle, "purpose": "batch"},
                            format="multipart")
        assert response.status_code == 200, response.content
        return response.json()

    return _upload


@pytest.fixture
def published(monkeypatch):
    """Record tasks sent to the broker instead of sending them."""
    sent: list[tuple[str, tuple]] = []

    def fake_apply_async(self, args=None, kwargs=None, **options):
        sent.append((self.name, tuple(args or ())))

    def fake_send_task(self, name, args=None, kwargs=None, **options):
        sent.append((name, tuple(args or ())))

    from celery import Celery
    from celery.app.task import Task

    monkeypatch.setattr(Task, "apply_async", fake_apply_async)
    monkeypatch.setattr(Celery, "send_task", fake_send_task)  # tasks published by name
    return sent


@pytest.fixture
def runtime_factory(published):
    """Start inference runtimes on the simulated engine, in process; all are stopped
    at the end of the test."""
    from inference.runtime import InferenceRuntime
    from serving.engines.base import EngineConfig

    runtimes = []

    def _make(*, capacity: int = 64, latency_ms: float = 0.0):
        runtime = InferenceRuntime(
            config=EngineConfig(engine="simulated", model="/nonexistent",
                                served_model_name="m", sim_latency_ms=latency_ms),
            capacity=capacity, name=f"test-worker-{len(runtimes)}")
        runtime.start()
        assert runtime.ready.wait(30)
        runtimes.append(runtime)
        return runtime

    yield _make
    for runtime in runtimes:
        runtime.stop()


@pytest.fixture
def batch_in_progress(upload, settings):
    """A validated batch of `requests` chat lines in chunks of `chunk_size`."""
    from batches import services
    from batches.models import BatchStatus

    def _make(requests: int, *, chunk_size: int):
        settings.BATCHGEN_CHUNK_SIZE = chunk_size
        file = upload(jsonl([chat_line(f"req-{i}", f"question {i}") for i in range(requests)]))
        batch = services.batch_create(input_file_id=file["id"], endpoint="/v1/chat/completions",
                                      model="sim")
        batch = services.batch_validate(batch_id=batch.id)
        assert batch.status == BatchStatus.IN_PROGRESS
        return batch

    return _make


@pytest.fixture
def hold_intake():
    """Fill the IntakePool by `requests`, as an in-progress batch holding them would
    (the pool's size is the sum of what active batches hold)."""

    def _hold(requests: int):
        from datetime import timedelta

        from django.utils import timezone

        from batches.models import Batch, BatchStatus

        return Batch.objects.create(
            id=f"batch_holder{Batch.objects.count()}", endpoint="/v1/chat/completions",
            model="m", input_file_id="file-holder", status=BatchStatus.IN_PROGRESS,
            expires_at=timezone.now() + timedelta(days=1), total=requests,
            intake_reserved=requests)

    return _hold
