"""The Batches API: create, list, retrieve, cancel, and /v1/pool/status."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from files.models import File, FilePurpose
from fleet.models import Worker
from serving.model_info import served_model
from tests.conftest import chat_line, jsonl
from tests.files.test_api import assert_envelope

pytestmark = pytest.mark.django_db

CONTENT = jsonl([chat_line("a"), chat_line("b")])
TIMESTAMP_FIELDS = ("in_progress_at", "started_at", "finalizing_at", "completed_at",
                    "failed_at", "cancelling_at", "cancelled_at")
PARAM_FIELDS = ("max_decoding_length", "max_context_length", "temperature", "top_p", "top_k")


@pytest.fixture
def input_file(upload) -> dict:
    return upload(CONTENT)


def create(api, **body):
    return api.post("/v1/batches", body, format="json")


# --- create ---------------------------------------------------------------------------


def test_create_with_defaults_returns_a_validating_batch_with_every_field(
        api, input_file, published):
    response = create(api, input_file_id=input_file["id"])

    assert response.status_code == 200, response.content
    batch = response.json()
    assert batch["id"].startswith("batch_")
    assert batch["object"] == "batch"
    assert batch["endpoint"] == "/v1/chat/completions"
    assert batch["model"] == served_model().id
    assert batch["input_file_id"] == input_file["id"]
    assert batch["output_file_id"] is None
    assert batch["error_file_id"] is None
    assert batch["completion_window"] == "24h"
    assert batch["status"] == "validating"
    assert isinstance(batch["created_at"], int)
    assert isinstance(batch["expires_at"], int)
    for field in TIMESTAMP_FIELDS:
        assert batch[field] is None, field
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert batch["error"] is None
    assert batch["errors"] is None
    assert batch["metadata"] is None
    for field in PARAM_FIELDS:
        assert batch[field] is None, field


def test_create_sets_expiry_to_the_24h_completion_window(api, input_file, published):
    batch = create(api, input_file_id=input_file["id"]).json()

    row = Batch.objects.get(id=batch["id"])
    assert abs(row.expires_at - row.created_at - timedelta(hours=24)) < timedelta(seconds=1)
    assert batch["expires_at"] - batch["created_at"] in (86_399, 86_400)


def test_create_echoes_batch_level_parameters_and_metadata(api, input_file, published):
    body = {"input_file_id": input_file["id"], "endpoint": "/v1/completions",
            "metadata": {"team": "search", "run": ""}, "max_decoding_length": 64,
            "max_context_length": 512, "temperature": 0.7, "top_p": 0.9, "top_k": 40}

    batch = create(api, **body).json()

    assert batch["endpoint"] == "/v1/completions"
    assert batch["metadata"] == {"team": "search", "run": ""}
    assert {field: batch[field] for field in PARAM_FIELDS} == {
        "max_decoding_length": 64, "max_context_length": 512, "temperature": 0.7,
        "top_p": 0.9, "top_k": 40}


def test_create_publishes_validation_only_after_commit(
        api, input_file, published, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        batch = create(api, input_file_id=input_file["id"]).json()

    assert published == []  # nothing left while the transaction was open
    for callback in callbacks:
        callback()
    assert published == [("batches.validate_batch", (batch["id"],))]


def test_create_on_an_unknown_file_is_400(api, published):
    response = create(api, input_file_id="file-nope")

    assert_envelope(response, 400, param="input_file_id", code="invalid_input_file")
    assert Batch.objects.count() == 0


def test_create_on_a_file_that_is_not_a_batch_input_is_400(api, storage, published):
    from files.services import file_register_output

    output = file_register_output(batch_id="batch_earlier")
    assert output.purpose == FilePurpose.BATCH_OUTPUT

    response = create(api, input_file_id=output.id)

    assert_envelope(response, 400, param="input_file_id", code="invalid_input_file")
    assert Batch.objects.count() == 0


def test_create_without_input_file_id_is_400(api, published):
    assert_envelope(create(api, endpoint="/v1/chat/completions"), 400, param="input_file_id")


@pytest.mark.parametrize("endpoint", ["/v1/audio/speech", "/v1/moderations", "chat", ""])
def test_create_with_another_endpoint_is_400(api, input_file, published, endpoint):
    response = create(api, input_file_id=input_file["id"], endpoint=endpoint)

    assert_envelope(response, 400, param="endpoint")
    assert Batch.objects.count() == 0


@pytest.mark.parametrize("window", ["200h", "30m", "24", "", "0h", "h24"])
def test_create_with_a_completion_window_outside_the_bounds_or_malformed_is_400(
        api, input_file, published, window):
    response = create(api, input_file_id=input_file["id"], completion_window=window)

    assert_envelope(response, 400, param="completion_window")


@pytest.mark.parametrize("metadata", [
    {f"k{i}": "v" for i in range(17)},
    {"k" * 65: "v"},
    {"k": "v" * 513},
    ["not", "an", "object"],
], ids=["17-keys", "65-char-key", "513-char-value", "list"])
def test_create_with_metadata_over_the_limits_is_400(api, input_file, published, metadata):
    response = create(api, input_file_id=input_file["id"], metadata=metadata)

    error = assert_envelope(response, 400)
    assert error["param"].startswith("metadata")
    assert Batch.objects.count() == 0


@pytest.mark.parametrize("value, kind", [
    (5, "a number"), (1.5, "a number"), (True, "a boolean"), (["a"], "an array"),
    ({"a": "b"}, "an object"),
])
def test_create_with_a_metadata_value_that_is_not_a_string_is_400_naming_its_key(
        api, input_file, published, value, kind):
    response = create(api, input_file_id=input_file["id"], metadata={"ok": "v", "k": value})

    error = assert_envelope(response, 400, param="metadata.k", code="invalid_type")
    assert f"must be strings; got {kind}" in error["message"]
    assert Batch.objects.count() == 0


def test_create_accepts_metadata_at_the_limits(api, input_file, published):
    metadata = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}

    response = create(api, input_file_id=input_file["id"], metadata=metadata)

    assert response.status_code == 200, response.content
    assert response.json()["metadata"] == metadata


@pytest.mark.parametrize("field, value", [
    ("max_decoding_length", 0),
    ("max_decoding_length", -5),
    ("max_decoding_length", "lots"),
    ("max_context_length", 0),
    ("temperature", -0.1),
    ("temperature", "hot"),
    ("temperature", 3),  # OpenAI's range is 0 to 2, as in a request body
    ("temperature", 2.01),
    ("temperature", "nan"),
    ("top_p", 0),
    ("top_p", 1.5),
    ("top_p", 1.01),
    ("top_p", -0.5),
    ("top_k", -2),
    ("top_k", 2.5),
])
def test_create_with_bad_batch_level_parameters_is_400(api, input_file, published, field, value):
    response = create(api, input_file_id=input_file["id"], **{field: value})

    assert_envelope(response, 400, param=field)
    assert Batch.objects.count() == 0


@pytest.mark.parametrize("field, value", [
    ("temperature", 0), ("temperature", 2), ("top_p", 1), ("top_p", 0.01), ("top_k", -1),
    ("top_k", 0), ("max_decoding_length", 1),
])
def test_create_accepts_batch_level_parameters_at_the_bounds_of_a_body(
        api, input_file, published, field, value):
    response = create(api, input_file_id=input_file["id"], **{field: value})

    assert response.status_code == 200, response.content
    assert response.json()[field] == value


def test_create_with_max_context_length_over_the_models_is_400(api, input_file, published):
    limit = served_model().max_context_length
    assert limit > 0

    response = create(api, input_file_id=input_file["id"], max_context_length=limit + 1)

    assert_envelope(response, 400, param="max_context_length")
    ok = create(api, input_file_id=input_file["id"], max_context_length=limit)
    assert ok.status_code == 200, ok.content


def test_a_second_active_batch_on_the_same_file_is_400(api, input_file, published):
    first = create(api, input_file_id=input_file["id"])
    assert first.status_code == 200

    second = create(api, input_file_id=input_file["id"])

    assert_envelope(second, 400, param="input_file_id", code="duplicate_batch")
    assert Batch.objects.count() == 1


def test_a_file_can_be_batched_again_once_its_batch_is_over(api, input_file, published):
    first = create(api, input_file_id=input_file["id"]).json()
    api.post(f"/v1/batches/{first['id']}/cancel")

    again = create(api, input_file_id=input_file["id"])

    assert again.status_code == 200, again.content


def test_create_when_the_intake_pool_is_full_is_429_with_retry_after(
        api, input_file, published, settings, hold_intake):
    settings.BATCHGEN_MAX_INTAKE_CAPACITY = 10
    settings.BATCHGEN_RETRY_AFTER_SECONDS = 17
    holder = hold_intake(10)

    response = create(api, input_file_id=input_file["id"])

    assert_envelope(response, 429, code="intake_pool_full")
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert response["Retry-After"] == "17"
    assert list(Batch.objects.all()) == [holder]
    assert published == []


@pytest.mark.parametrize("body", ["[1, 2]", '"text"', "42", "null"])
def test_create_with_a_json_body_that_is_not_an_object_is_400(api, published, body):
    response = api.post("/v1/batches", data=body, content_type="application/json")

    assert_envelope(response, 400)
    assert Batch.objects.count() == 0


def test_create_with_malformed_json_is_400(api, published):
    response = api.post("/v1/batches", data='{"input_file_id": ', content_type="application/json")

    assert_envelope(response, 400)


# --- list and retrieve ------------------------------------------------------------------


@pytest.fixture
def three_batches(api, upload, published) -> list[str]:
    ids = []
    for i in range(3):
        file = upload(jsonl([chat_line(f"x{i}")]))
        ids.append(create(api, input_file_id=file["id"]).json()["id"])
    return ids


def test_list_is_newest_first(api, three_batches):
    body = api.get("/v1/batches").json()

    assert body["object"] == "list"
    assert [b["id"] for b in body["data"]] == three_batches[::-1]
    assert body["has_more"] is False
    assert body["first_id"] == three_batches[2]
    assert body["last_id"] == three_batches[0]
    assert all(b["object"] == "batch" for b in body["data"])


def test_list_pages_with_limit_and_after(api, three_batches):
    first = api.get("/v1/batches", {"limit": 2}).json()
    assert [b["id"] for b in first["data"]] == three_batches[:0:-1]
    assert first["has_more"] is True
    assert (first["first_id"], first["last_id"]) == (three_batches[2], three_batches[1])

    rest = api.get("/v1/batches", {"limit": 2, "after": first["last_id"]}).json()
    assert [b["id"] for b in rest["data"]] == [three_batches[0]]
    assert rest["has_more"] is False
    assert rest["first_id"] == rest["last_id"] == three_batches[0]


@pytest.mark.parametrize("after", [
    "batch_unknown",  # sorts after every id: the first page, before the fix
    "batch_066188dde2cbcc4ad1538b7c",  # shaped like an id, but of no batch
    "file-066188dde2cbcc4ad1538b7c",  # a file's id
])
def test_list_after_an_id_of_no_batch_is_400_not_the_first_page(api, three_batches, after):
    error = assert_envelope(api.get("/v1/batches", {"after": after}), 400, param="after",
                            code="invalid_cursor")

    assert after in error["message"]


def test_list_after_another_keys_batch_is_400_as_if_it_did_not_exist(api, three_batches):
    from core.auth import apikey_create

    api.credentials(HTTP_AUTHORIZATION=f"Bearer {apikey_create(name='other')[1]}")

    assert_envelope(api.get("/v1/batches", {"after": three_batches[1]}), 400, param="after",
                    code="invalid_cursor")


def test_empty_list(api):
    assert api.get("/v1/batches").json() == {
        "object": "list", "data": [], "has_more": False, "first_id": None, "last_id": None}


@pytest.mark.parametrize("limit", [0, 101, -1, "ten"])
def test_list_with_limit_out_of_range_is_400(api, limit):
    assert_envelope(api.get("/v1/batches", {"limit": limit}), 400, param="limit")


def test_list_accepts_the_limit_bounds(api, three_batches):
    assert len(api.get("/v1/batches", {"limit": 1}).json()["data"]) == 1
    assert len(api.get("/v1/batches", {"limit": 100}).json()["data"]) == 3


def test_retrieve_returns_the_batch(api, three_batches):
    response = api.get(f"/v1/batches/{three_batches[0]}")

    assert response.status_code == 200
    assert response.json()["id"] == three_batches[0]


def test_retrieve_of_an_unknown_batch_is_404(api):
    assert_envelope(api.get("/v1/batches/batch_nope"), 404, param="batch_id", code="not_found")


def test_cancel_of_an_unknown_batch_is_404(api):
    assert_envelope(api.post("/v1/batches/batch_nope/cancel"), 404, param="batch_id")


# --- cancel ---------------------------------------------------------------------------


def test_cancel_of_a_validating_batch_cancels_it_at_once(api, input_file, published):
    batch = create(api, input_file_id=input_file["id"]).json()

    response = api.post(f"/v1/batches/{batch['id']}/cancel")

    assert response.status_code == 200, response.content
    cancelled = response.json()
    assert cancelled["status"] == "cancelled"
    assert isinstance(cancelled["cancelled_at"], int)
    assert cancelled["output_file_id"] is None  # nothing ever ran


def test_cancel_while_a_chunk_runs_is_cancelling_and_skips_the_queued_chunks(
        api, running_batch, reserved):
    batch = running_batch(5, chunk_size=2)  # chunks of 2, 2 and 1 requests
    chunks = list(Chunk.objects.filter(batch=batch).order_by("index"))
    Chunk.objects.filter(id=chunks[0].id).update(
        status=ChunkStatus.RUNNING, worker="w1",
        lease_expires_at=timezone.now() + timedelta(minutes=1))
    assert reserved() == 5

    response = api.post(f"/v1/batches/{batch.id}/cancel")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "cancelling"
    assert isinstance(body["cancelling_at"], int)
    assert body["cancelled_at"] is None
    statuses = list(Chunk.objects.filter(batch=batch).order_by("index")
                    .values_list("status", flat=True))
    assert statuses == [ChunkStatus.RUNNING, ChunkStatus.SKIPPED, ChunkStatus.SKIPPED]
    # The queued requests gave their capacity back; the running chunk still holds its own.
    assert reserved() == 2
    assert Batch.objects.get(id=batch.id).intake_reserved == 2


def test_cancel_when_no_chunk_runs_is_cancelled_with_the_partial_output(
        api, running_batch, reserved, storage):
    batch = running_batch(5, chunk_size=2)
    done = Chunk.objects.filter(batch=batch, index=0)
    done.update(status=ChunkStatus.DONE, completed=2)
    partial = b'{"custom_id": "req-0"}\n{"custom_id": "req-1"}\n'
    (storage / "incremental" / f"{batch.id}.jsonl").write_bytes(partial)

    body = api.post(f"/v1/batches/{batch.id}/cancel").json()

    assert body["status"] == "cancelled"
    assert isinstance(body["cancelled_at"], int)
    assert reserved() == 0
    assert not Chunk.objects.filter(batch=batch, status=ChunkStatus.QUEUED).exists()
    output = File.objects.get(id=body["output_file_id"])
    assert output.purpose == FilePurpose.BATCH_OUTPUT
    content = api.get(f"/v1/files/{output.id}/content")
    assert b"".join(content.streaming_content) == partial


def test_cancel_of_a_cancelling_batch_answers_the_batch_again(api, running_batch):
    batch = running_batch(3, chunk_size=1)
    Chunk.objects.filter(batch=batch, index=0).update(
        status=ChunkStatus.RUNNING, worker="w1",
        lease_expires_at=timezone.now() + timedelta(minutes=1))
    assert api.post(f"/v1/batches/{batch.id}/cancel").json()["status"] == "cancelling"

    again = api.post(f"/v1/batches/{batch.id}/cancel")

    assert again.status_code == 200
    assert again.json()["status"] == "cancelling"


@pytest.mark.parametrize("status", [BatchStatus.COMPLETED, BatchStatus.FAILED,
                                    BatchStatus.CANCELLED])
def test_cancel_of_a_finished_batch_is_400(api, input_file, published, status):
    batch = create(api, input_file_id=input_file["id"]).json()
    Batch.objects.filter(id=batch["id"]).update(status=status)

    response = api.post(f"/v1/batches/{batch['id']}/cancel")

    assert_envelope(response, 400, param="batch_id", code="batch_not_cancellable")
    assert Batch.objects.get(id=batch["id"]).status == status


# --- pool status ----------------------------------------------------------------------


def test_pool_status_has_every_field_and_counts_what_is_queued(api, running_batch, settings):
    running_batch(5, chunk_size=2)
    Worker.objects.create(name="w1", hostname="h", pid=1, engine="simulated", model="m",
                          slots_capacity=16, slots_active=3, ready=True,
                          tokens_active=700, token_budget=4096,
                          heartbeat_at=timezone.now())
    Worker.objects.create(name="gone", hostname="h", pid=2, engine="simulated", model="m",
                          slots_capacity=100, slots_active=50, ready=True,
                          storage_error="No space left on device writing results to /x",
                          heartbeat_at=timezone.now() - timedelta(hours=1))

    response = api.get("/v1/pool/status")

    assert response.status_code == 200
    assert response.json() == {
        "intake_pool_size": 2,  # 5 admitted, 3 of them inside the engine
        "intake_pool_capacity": settings.BATCHGEN_MAX_INTAKE_CAPACITY,
        "scheduling_pool_active": 3,
        "scheduling_pool_free": 13,
        "scheduling_pool_capacity": 16,  # the stale worker does not count
        "active_batches": 1,
        "pool_mode": True,
        "scheduling_pool_tokens_active": 700,
        "scheduling_pool_token_budget": 4096,
        "storage_error": None,  # only the stale worker's
        # The same, per served model (here the one): the top level is their total
        "models": [{
            "model": "m", "workers": 1, "requests_waiting": 5, "scheduling_pool_active": 3,
            "scheduling_pool_free": 13, "scheduling_pool_capacity": 16,
            "scheduling_pool_tokens_active": 700, "scheduling_pool_token_budget": 4096,
            "resident_on": ["w1"], "waiting_seconds": None,
        }],
        "multiplexing": None,  # no worker multiplexes (fleet/residency.py)
        "adaptive_concurrency": [],  # no openai-http worker (inference/adaptive.py)
    }


def test_pool_status_is_served_from_a_cache_of_about_a_second(api, settings):
    settings.BATCHGEN_POOL_STATUS_CACHE_SECONDS = 1.0
    first = api.get("/v1/pool/status").json()
    Worker.objects.create(name="w1", hostname="h", pid=1, engine="simulated", model="m",
                          slots_capacity=16, ready=True, heartbeat_at=timezone.now())

    # Within the cache's life the figures stay as they were...
    assert api.get("/v1/pool/status").json() == first
    # ...and without a cache they are fresh
    settings.BATCHGEN_POOL_STATUS_CACHE_SECONDS = 0
    assert api.get("/v1/pool/status").json()["scheduling_pool_capacity"] == 16


def test_pool_status_of_an_idle_server(api, settings):
    body = api.get("/v1/pool/status").json()

    assert body == {
        "intake_pool_size": 0,
        "intake_pool_capacity": settings.BATCHGEN_MAX_INTAKE_CAPACITY,
        "scheduling_pool_active": 0,
        "scheduling_pool_free": 0,
        "scheduling_pool_capacity": 0,
        "active_batches": 0,
        "pool_mode": True,
        "scheduling_pool_tokens_active": 0,
        "scheduling_pool_token_budget": None,
        "storage_error": None,
        "models": [{
            "model": "m", "workers": 0, "requests_waiting": 0, "scheduling_pool_active": 0,
            "scheduling_pool_free": 0, "scheduling_pool_capacity": 0,
            "scheduling_pool_tokens_active": 0, "scheduling_pool_token_budget": None,
            "resident_on": [], "waiting_seconds": None,
        }],
        "multiplexing": None,
        "adaptive_concurrency": [],
    }


def test_batch_json_round_trips_through_the_openai_sdk_shape(api, input_file, published):
    # Every key the openai SDK's Batch model knows is present (extra keys are allowed).
    batch = create(api, input_file_id=input_file["id"]).json()
    from openai.types import Batch as SdkBatch

    parsed = SdkBatch.model_validate(json.loads(json.dumps(batch)))

    assert parsed.id == batch["id"]
    assert parsed.status == "validating"
    assert set(SdkBatch.model_fields) - {"usage"} <= set(batch)


# --- output (the incremental file, from a byte offset) ---------------------------------

LINES = [b'{"custom_id": "a"}\n', b'{"custom_id": "bb"}\n', b'{"custom_id": "ccc"}\n']


@pytest.fixture
def batch_with_output(api, input_file, published, storage) -> str:
    batch_id = create(api, input_file_id=input_file["id"]).json()["id"]
    # Two whole lines and the torn start of a third, as a writer mid-append leaves them.
    (storage / "incremental" / f"{batch_id}.jsonl").write_bytes(
        LINES[0] + LINES[1] + LINES[2][:5])
    return batch_id


def test_output_from_every_line_start_is_the_whole_lines_from_there(api, batch_with_output):
    for offset, expected in [(0, LINES[0] + LINES[1]), (len(LINES[0]), LINES[1]),
                             (len(LINES[0] + LINES[1]), b"")]:
        response = api.get(f"/v1/batches/{batch_with_output}/output", {"offset": offset})

        assert response.status_code == 200
        assert b"".join(response.streaming_content) == expected
        assert response["X-Next-Offset"] == str(len(LINES[0] + LINES[1]))


@pytest.mark.parametrize("offset", [1, len(LINES[0]) - 1, len(LINES[0]) + 7])
def test_output_from_an_offset_inside_a_line_is_400_naming_the_nearest_line_starts(
        api, batch_with_output, offset):
    line = 0 if offset < len(LINES[0]) else 1
    start = len(b"".join(LINES[:line]))

    error = assert_envelope(api.get(f"/v1/batches/{batch_with_output}/output",
                                    {"offset": offset}), 400, param="offset",
                            code="offset_not_at_line_start")

    assert f"start at {start} and {start + len(LINES[line])}" in error["message"]


# --- line errors (the batch object shows the first 100; /errors pages through all) -------


@pytest.fixture
def batch_with_bad_lines(upload, published):
    """A batch validated and failed: lines 1..count are not JSON, line count+1 is good."""

    def _make(count: int) -> dict:
        from batches import services

        file = upload(b"not json\n" * count + jsonl([chat_line("good")]))
        batch = services.batch_create(input_file_id=file["id"], endpoint="/v1/chat/completions",
                                      model="m")
        return {"id": services.batch_validate(batch_id=batch.id).id}

    return _make


def test_a_batch_with_10001_bad_lines_stays_small_and_the_sdk_still_parses_it(
        api, batch_with_bad_lines):
    from openai.types import Batch as SdkBatch

    batch_id = batch_with_bad_lines(10_001)["id"]

    response = api.get(f"/v1/batches/{batch_id}")

    assert len(response.content) < 30_000  # 1.5 MB before: every error on every poll
    errors = response.json()["errors"]
    assert [e["line"] for e in errors["data"]] == list(range(1, 101))
    assert (errors["total"], errors["has_more"]) == (10_001, True)
    assert "10001 input line(s)" in response.json()["error"]["message"]
    parsed = SdkBatch.model_validate(response.json())
    assert len(parsed.errors.data) == 100 and parsed.errors.data[0].code == "invalid_json"


def test_errors_endpoint_pages_through_every_kept_error_by_line(api, batch_with_bad_lines):
    batch_id = batch_with_bad_lines(10_001)["id"]

    first = api.get(f"/v1/batches/{batch_id}/errors").json()
    rest = api.get(f"/v1/batches/{batch_id}/errors",
                   {"after": first["data"][-1]["line"], "limit": 10_000}).json()

    assert (first["object"], len(first["data"]), first["has_more"]) == ("list", 1000, True)
    assert first["total"] == rest["total"] == 10_001
    lines = [e["line"] for e in first["data"] + rest["data"]]
    assert lines == list(range(1, 10_001))  # the first 10,000 are kept
    assert rest["has_more"] is False
    assert set(first["data"][0]) == {"code", "message", "line", "param"}


def test_a_batch_with_a_few_bad_lines_lists_them_all_on_the_batch_and_the_endpoint(
        api, batch_with_bad_lines):
    batch_id = batch_with_bad_lines(3)["id"]

    errors = api.get(f"/v1/batches/{batch_id}").json()["errors"]
    listed = api.get(f"/v1/batches/{batch_id}/errors").json()

    assert (errors["total"], errors["has_more"]) == (3, False)
    assert listed == {"object": "list", "data": errors["data"], "has_more": False, "total": 3}


def test_errors_of_a_batch_without_bad_lines_is_an_empty_list(api, input_file, published):
    batch_id = create(api, input_file_id=input_file["id"]).json()["id"]

    assert api.get(f"/v1/batches/{batch_id}/errors").json() == {
        "object": "list", "data": [], "has_more": False, "total": 0}


@pytest.mark.parametrize("query, param", [({"limit": 0}, "limit"), ({"limit": 10_001}, "limit"),
                                          ({"after": -1}, "after"), ({"after": "x"}, "after")])
def test_errors_endpoint_refuses_bad_query_parameters(api, input_file, published, query, param):
    batch_id = create(api, input_file_id=input_file["id"]).json()["id"]

    assert_envelope(api.get(f"/v1/batches/{batch_id}/errors", query), 400, param=param)


def test_errors_of_an_unknown_batch_is_404(api):
    assert_envelope(api.get("/v1/batches/batch_nope/errors"), 404, param="batch_id",
                    code="not_found")


def test_a_batch_failed_before_the_upgrade_keeps_every_error_on_the_endpoint(api, input_file,
                                                                              published):
    import importlib

    from django.apps import apps

    upgrade = importlib.import_module("batches.migrations.0007_line_errors")
    batch_id = create(api, input_file_id=input_file["id"]).json()["id"]
    legacy = [{"code": "invalid_json", "message": "bad", "line": n, "param": None}
              for n in range(1, 251)]
    Batch.objects.filter(id=batch_id).update(status=BatchStatus.FAILED, errors=legacy)

    upgrade.move_line_errors(apps, None)

    shown = api.get(f"/v1/batches/{batch_id}").json()["errors"]
    assert (len(shown["data"]), shown["total"], shown["has_more"]) == (100, 250, True)
    assert api.get(f"/v1/batches/{batch_id}/errors").json()["data"] == legacy
