"""Fair sharing across API keys (batches.dispatch.batch_shares): keys share the
workers by their weight, a key's batches split its share by priority, so a key gains
nothing by splitting its work into many batches."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from batches import dispatch, services
from batches.dispatch import batch_shares
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from core.auth import apikey_create
from tests.conftest import chat_line, jsonl

pytestmark = pytest.mark.django_db


def test_keys_share_by_weight_and_a_keys_batches_split_its_share_by_priority():
    shares = batch_shares([("a1", 1, 1, 2), ("b1", 1, 2, 1), ("b2", 3, 2, 1)])

    assert shares == {"a1": 2.0, "b1": 0.25, "b2": 0.75}


def test_without_keys_batches_share_by_priority_alone():
    shares = batch_shares([("x", 1, None, None), ("y", 3, None, None)])

    assert shares["y"] == 3 * shares["x"]


@pytest.fixture
def keyed(api, upload, settings, published, django_capture_on_commit_callbacks):
    settings.BATCHGEN_CHUNK_SIZE = 1  # a chunk per request: shares are exact

    def _batch(raw: str, key, requests: int, **options) -> Batch:
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        file = upload(jsonl([chat_line(f"r{i}") for i in range(requests)]))
        batch = services.batch_create(input_file_id=file["id"], endpoint="/v1/chat/completions",
                                      model="m", owner=key, **options)
        with django_capture_on_commit_callbacks(execute=False):  # no dispatch yet
            batch = services.batch_validate(batch_id=batch.id)
        assert batch.status == BatchStatus.IN_PROGRESS
        return batch

    return _batch


def test_a_key_of_weight_two_gets_twice_the_requests_of_a_key_with_two_batches(
        keyed, monkeypatch):
    a, raw_a = apikey_create(name="team-a", weight=2)
    b, raw_b = apikey_create(name="team-b")
    batch_a = keyed(raw_a, a, 40)
    b1, b2 = keyed(raw_b, b, 40), keyed(raw_b, b, 40)
    monkeypatch.setattr("fleet.selectors.dispatch_window", lambda model: 30)

    assert dispatch.dispatch() == 30

    by_batch = Counter(Chunk.objects.filter(status=ChunkStatus.QUEUED)
                       .values_list("batch_id", flat=True))
    assert by_batch[batch_a.id] == 20
    assert by_batch[b1.id] == by_batch[b2.id] == 5


@pytest.mark.parametrize("older", [0, 1])
def test_level_passes_go_to_the_older_batch_whatever_their_ids(keyed, monkeypatch, older):
    """A new batch starts level with the lowest pass: the older one goes first (first
    come, first served), not the one whose random id sorts first."""
    key, raw = apikey_create(name="team")
    batches = sorted((keyed(raw, key, 3) for _ in range(2)), key=lambda batch: batch.id)
    now = timezone.now()
    for n, batch in enumerate(batches):
        Batch.objects.filter(id=batch.id).update(
            dispatch_pass=7.0, created_at=now - timedelta(minutes=1 if n == older else 0))
    monkeypatch.setattr("fleet.selectors.dispatch_window", lambda model: 5)

    assert dispatch.dispatch() == 5

    # Turn about from the same pass, the older first: it has the odd fifth chunk.
    by_batch = Counter(Chunk.objects.filter(status=ChunkStatus.QUEUED)
                       .values_list("batch_id", flat=True))
    assert (by_batch[batches[older].id], by_batch[batches[1 - older].id]) == (3, 2)


def test_a_weight_changed_in_the_admin_applies_at_the_next_dispatch(keyed, monkeypatch):
    a, raw_a = apikey_create(name="team-a")
    b, raw_b = apikey_create(name="team-b")
    batch_a, batch_b = keyed(raw_a, a, 40), keyed(raw_b, b, 40)
    a.weight = 3
    a.save()
    monkeypatch.setattr("fleet.selectors.dispatch_window", lambda model: 20)

    dispatch.dispatch()

    by_batch = Counter(Chunk.objects.filter(status=ChunkStatus.QUEUED)
                       .values_list("batch_id", flat=True))
    assert (by_batch[batch_a.id], by_batch[batch_b.id]) == (15, 5)
