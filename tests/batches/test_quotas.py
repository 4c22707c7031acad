"""Per-key quotas (batches.quotas): the intake quota and the daily token quota at
create (429 quota_exceeded, Retry-After) and at admission (the batch fails whole,
nothing admitted), and race-free under the admission lock on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from io import BytesIO

import pytest
from rest_framework.test import APIClient

from batches import quotas, services
from batches.intake import intake_reserved
from batches.models import Batch, BatchStatus, Chunk
from core.auth import apikey_create
from core.errors import QuotaExceeded
from core.models import KeyUsage
from tests.concurrency import require_concurrent_database, run_together
from tests.conftest import chat_line, error_of, jsonl

pytestmark = pytest.mark.django_db

S = BatchStatus


def client_for(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def upload_lines(client: APIClient, count: int, prefix: str = "r") -> str:
    handle = BytesIO(jsonl([chat_line(f"{prefix}{i}") for i in range(count)]))
    handle.name = "in.jsonl"
    response = client.post("/v1/files", {"file": handle, "purpose": "batch"},
                           format="multipart")
    assert response.status_code == 200, response.content
    return response.json()["id"]


def create(client: APIClient, file_id: str):
    return client.post("/v1/batches", {"input_file_id": file_id,
                                       "endpoint": "/v1/chat/completions",
                                       "completion_window": "24h"}, format="json")


def validate(batch_id: str, capture) -> Batch:
    with capture(execute=True):
        return services.batch_validate(batch_id=batch_id)


def used_today(key, *, input_tokens: int, output_tokens: int = 0) -> None:
    KeyUsage.objects.create(key=key, day=quotas.utc_today(), input_tokens=input_tokens,
                            output_tokens=output_tokens)


# --- the intake quota ------------------------------------------------------------------


def test_a_key_at_its_intake_quota_is_refused_at_create_with_429_and_retry_after(
        published, settings, django_capture_on_commit_callbacks):
    settings.BATCHGEN_RETRY_AFTER_SECONDS = 17
    key, raw = apikey_create(name="team-a", max_intake_requests=3)
    client = client_for(raw)
    first = create(client, upload_lines(client, 3))
    assert first.status_code == 200, first.content
    assert validate(first.json()["id"], django_capture_on_commit_callbacks).status == S.IN_PROGRESS

    refused = create(client, upload_lines(client, 1, "s"))

    error = error_of(refused, 429)
    assert error["code"] == "quota_exceeded"
    assert error["type"] == "rate_limit_error"
    assert "team-a" in error["message"] and "3" in error["message"]
    assert refused["Retry-After"] == "17"
    assert Batch.objects.filter(owner=key).count() == 1  # nothing recorded


def test_another_key_still_gets_in_while_one_is_at_its_quota(
        published, django_capture_on_commit_callbacks):
    _, raw_a = apikey_create(name="team-a", max_intake_requests=2)
    _, raw_b = apikey_create(name="team-b")
    a, b = client_for(raw_a), client_for(raw_b)
    validate(create(a, upload_lines(a, 2)).json()["id"], django_capture_on_commit_callbacks)

    assert error_of(create(a, upload_lines(a, 1)), 429)["code"] == "quota_exceeded"
    accepted = create(b, upload_lines(b, 50))
    assert accepted.status_code == 200, accepted.content
    assert validate(accepted.json()["id"],
                    django_capture_on_commit_callbacks).status == S.IN_PROGRESS


def test_a_batch_that_does_not_fit_the_key_fails_whole_at_admission(
        published, django_capture_on_commit_callbacks):
    key, raw = apikey_create(name="team-a", max_intake_requests=5)
    client = client_for(raw)
    running = create(client, upload_lines(client, 3)).json()["id"]
    validate(running, django_capture_on_commit_callbacks)
    # Create passes (the key has room and the line count is unknown before validation).
    late = create(client, upload_lines(client, 4, "s"))
    assert late.status_code == 200, late.content

    batch = validate(late.json()["id"], django_capture_on_commit_callbacks)

    assert batch.status == S.FAILED
    assert batch.error["code"] == "quota_exceeded"
    assert "room for 2, not 4" in batch.error["message"]
    assert batch.total == 4 and batch.intake_reserved == 0
    assert not Chunk.objects.filter(batch_id=batch.id).exists()
    assert intake_reserved() == 3
    assert quotas.key_intake_held(key_id=key.pk) == 3


def test_a_batch_larger_than_the_quota_itself_is_told_to_split(
        published, django_capture_on_commit_callbacks):
    _, raw = apikey_create(name="team-a", max_intake_requests=5)
    client = client_for(raw)

    batch = validate(create(client, upload_lines(client, 6)).json()["id"],
                     django_capture_on_commit_callbacks)

    assert batch.status == S.FAILED and batch.error["code"] == "quota_exceeded"
    assert "split" in batch.error["message"]


def test_capacity_given_back_as_requests_finish_lets_the_key_in_again(
        running_batch, api, published, django_capture_on_commit_callbacks):
    from batches import chunks

    key, raw = apikey_create(name="team-a", max_intake_requests=4)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    batch = running_batch(4, chunk_size=4, owner=key)
    with pytest.raises(QuotaExceeded):
        quotas.quota_check_create(owner=key)
    (chunk_id,) = Chunk.objects.filter(batch=batch).values_list("id", flat=True)
    Chunk.objects.filter(id=chunk_id).update(status="queued")
    chunks.chunk_claim(chunk_id=chunk_id, worker="w1")

    chunks.chunks_flush(worker="w1", progress={chunk_id: (2, 0)}, holding=[chunk_id])

    assert quotas.key_intake_held(key_id=key.pk) == 2
    quotas.quota_check_create(owner=key)  # room again: no error


def test_a_quota_raised_in_the_admin_applies_to_the_next_admission(
        published, django_capture_on_commit_callbacks):
    key, raw = apikey_create(name="team-a", max_intake_requests=1)
    client = client_for(raw)
    pending = create(client, upload_lines(client, 3)).json()["id"]
    key.max_intake_requests = 10
    key.save()

    assert validate(pending, django_capture_on_commit_callbacks).status == S.IN_PROGRESS


def test_a_key_without_quotas_and_an_open_server_are_not_limited(
        published, django_capture_on_commit_callbacks, upload):
    batch = services.batch_create(input_file_id=upload(jsonl([chat_line("a")]))["id"],
                                  endpoint="/v1/chat/completions", model="m")
    assert validate(batch.id, django_capture_on_commit_callbacks).status == S.IN_PROGRESS
    key, _ = apikey_create(name="free")
    assert quotas.quota_refusal(key=key, requests=10**9) is None


# --- the daily token quota -------------------------------------------------------------


def test_a_key_over_its_tokens_for_today_is_refused_until_midnight_utc(published):
    key, raw = apikey_create(name="team-a", tokens_per_day=1000)
    used_today(key, input_tokens=700, output_tokens=300)
    client = client_for(raw)

    refused = create(client, upload_lines(client, 1))

    error = error_of(refused, 429)
    assert error["code"] == "quota_exceeded"
    assert "1000 of its 1000 tokens" in error["message"]
    wait = int(refused["Retry-After"])
    assert 0 < wait <= 86400
    assert abs(wait - quotas.seconds_until_next_utc_day()) <= 2


def test_yesterdays_tokens_do_not_count_today(published, django_capture_on_commit_callbacks):
    key, raw = apikey_create(name="team-a", tokens_per_day=1000)
    KeyUsage.objects.create(key=key, day="2020-01-01", input_tokens=5000)
    used_today(key, input_tokens=999)
    client = client_for(raw)

    accepted = create(client, upload_lines(client, 1))

    assert accepted.status_code == 200, accepted.content
    assert quotas.key_tokens_today(key_id=key.pk) == 999


def test_tokens_used_up_while_a_batch_validates_fail_it_at_admission(
        published, django_capture_on_commit_callbacks):
    key, raw = apikey_create(name="team-a", tokens_per_day=100)
    client = client_for(raw)
    batch_id = create(client, upload_lines(client, 2)).json()["id"]
    used_today(key, input_tokens=60, output_tokens=40)  # another batch's flush meanwhile

    batch = validate(batch_id, django_capture_on_commit_callbacks)

    assert batch.status == S.FAILED and batch.error["code"] == "quota_exceeded"
    assert not Chunk.objects.filter(batch_id=batch_id).exists()


def test_seconds_until_the_next_utc_day():
    assert quotas.seconds_until_next_utc_day(datetime(2026, 12, 1, 23, 59, 30, tzinfo=UTC)) == 30
    assert quotas.seconds_until_next_utc_day(datetime(2026, 12, 1, 0, 0, tzinfo=UTC)) == 86400


# --- races -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_admissions_of_one_key_cannot_both_pass(upload, api, published):
    require_concurrent_database()
    key, raw = apikey_create(name="team-a", max_intake_requests=6)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    batches = [services.batch_create(
        input_file_id=upload(jsonl([chat_line(f"b{n}-{i}") for i in range(4)]))["id"],
        endpoint="/v1/chat/completions", model="m", owner=key) for n in range(2)]

    outcomes = run_together(2, lambda i: services.batch_validate(batch_id=batches[i].id))

    assert all(isinstance(o, Batch) for o in outcomes), outcomes
    assert sorted(o.status for o in outcomes) == [S.FAILED, S.IN_PROGRESS]
    assert [o.error["code"] for o in outcomes if o.status == S.FAILED] == ["quota_exceeded"]
    assert quotas.key_intake_held(key_id=key.pk) == 4


@pytest.mark.django_db(transaction=True)
def test_concurrent_admissions_of_two_keys_each_fill_their_own_quota(published):
    require_concurrent_database()
    made = [apikey_create(name=f"team-{n}", max_intake_requests=5) for n in range(2)]
    keys = [key for key, _ in made]
    clients = [client_for(raw) for _, raw in made]
    batches = [services.batch_create(
        input_file_id=upload_lines(clients[n % 2], 3, f"b{n}-"),
        endpoint="/v1/chat/completions", model="m", owner=keys[n % 2]) for n in range(4)]

    outcomes = run_together(4, lambda i: services.batch_validate(batch_id=batches[i].id))

    assert all(isinstance(o, Batch) for o in outcomes), outcomes
    for key in keys:
        mine = [o for o in outcomes if o.owner_id == key.pk]
        assert sorted(o.status for o in mine) == [S.FAILED, S.IN_PROGRESS]
        assert quotas.key_intake_held(key_id=key.pk) == 3
