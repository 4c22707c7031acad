"""Two mutating calls on one object at the same moment, through the API, on real
threads with their own connections and transactions (PostgreSQL with DATABASE_URL,
else the file-backed SQLite test database). Each race runs many times: whichever call
wins, the other gets a clear answer and the object ends in one consistent state."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from batches import services
from batches.intake import intake_reserved
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from batches.services import OPEN_CHUNKS
from files.models import File, FilePurpose
from tests.concurrency import at_once, require_concurrent_database
from tests.conftest import chat_line, error_of, jsonl

pytestmark = pytest.mark.django_db(transaction=True)

S = BatchStatus
# Before the fix, create and delete both succeeded in about half of the trials.
TRIALS = 20


@pytest.fixture(autouse=True)
def _concurrent_database():
    require_concurrent_database()


def create(file_id: str):
    return lambda: APIClient().post("/v1/batches", {"input_file_id": file_id}, format="json")


def delete(file_id: str):
    return lambda: APIClient().delete(f"/v1/files/{file_id}")  # more races: tests/corpus


def cancel(batch_id: str):
    return lambda: APIClient().post(f"/v1/batches/{batch_id}/cancel")


def finalize(batch_id: str):
    return lambda: services.batch_finalize(batch_id=batch_id)


def validate(batch_id: str):
    return lambda: services.batch_validate(batch_id=batch_id)


def settled(batch_id: str) -> Batch:
    """The batch once the race is over: nothing of it left open or reserved."""
    assert not Chunk.objects.filter(batch_id=batch_id, status__in=OPEN_CHUNKS).exists()
    assert intake_reserved() == 0
    return Batch.objects.get(id=batch_id)


def test_create_and_delete_of_one_file_at_once_one_wins_the_other_is_refused(
        upload, published):
    for _ in range(TRIALS):
        file_id = upload(jsonl([chat_line("a")]))["id"]

        created, deleted = at_once(create(file_id), delete(file_id))

        if created.status_code == 200:
            assert error_of(deleted, 400)["code"] == "file_in_use"
            batch = services.batch_validate(batch_id=created.json()["id"])
            assert batch.status == S.IN_PROGRESS  # its input is still there
        else:
            assert deleted.status_code == 200, deleted.content
            assert error_of(created, 400)["code"] == "invalid_input_file"
            assert not File.objects.filter(id=file_id).exists()
            assert not Batch.objects.filter(input_file_id=file_id).exists()


def test_two_cancels_of_a_running_batch_at_once_cancel_it_once(running_batch):
    for _ in range(TRIALS // 2):
        batch = running_batch(4, chunk_size=1)

        answers = at_once(cancel(batch.id), cancel(batch.id))

        # The second either sees the cancel under way (200) or already done (400).
        assert any(a.status_code == 200 for a in answers), answers
        for answer in answers:
            if answer.status_code != 200:
                assert error_of(answer, 400)["code"] == "batch_not_cancellable"
        done = settled(batch.id)
        assert done.status == S.CANCELLED
        assert File.objects.filter(purpose=FilePurpose.BATCH_OUTPUT,
                                   filename=f"{batch.id}_output.jsonl").count() == 1


def test_two_cancels_of_a_validating_batch_at_once_cancel_it_once(create_batch):
    for _ in range(TRIALS // 2):
        batch = create_batch()

        answers = at_once(cancel(batch.id), cancel(batch.id))

        assert any(a.status_code == 200 for a in answers), answers
        for answer in answers:
            if answer.status_code != 200:
                assert error_of(answer, 400)["code"] == "batch_not_cancellable"
        assert settled(batch.id).status == S.CANCELLED


def test_cancel_and_finalize_at_once_end_in_one_status_with_one_output_file(running_batch):
    for _ in range(TRIALS // 2):
        batch = running_batch(2, chunk_size=1)
        Chunk.objects.filter(batch_id=batch.id).update(status=ChunkStatus.DONE)

        answer, finalized = at_once(cancel(batch.id), finalize(batch.id))

        assert isinstance(finalized, Batch), finalized
        done = settled(batch.id)
        if answer.status_code == 200:
            assert done.status == S.CANCELLED  # the cancel came first: no completion
        else:
            assert error_of(answer, 400)["code"] == "batch_not_cancellable"
            assert done.status == S.COMPLETED
        outputs = File.objects.filter(filename=f"{batch.id}_output.jsonl")
        assert [f.id for f in outputs] == [done.output_file_id]


def test_cancel_and_validation_at_once_leave_a_cancelled_batch_holding_nothing(create_batch):
    for _ in range(TRIALS // 2):
        batch = create_batch([chat_line(f"r{i}") for i in range(3)])

        answer, validated = at_once(cancel(batch.id), validate(batch.id))

        assert answer.status_code == 200, answer.content
        assert isinstance(validated, Batch), validated
        assert settled(batch.id).status == S.CANCELLED


def test_cancel_and_expiry_at_once_end_in_one_status_with_one_output_file(running_batch):
    from datetime import timedelta

    from django.utils import timezone

    for _ in range(TRIALS // 2):
        batch = running_batch(4, chunk_size=1)
        Batch.objects.filter(id=batch.id).update(expires_at=timezone.now() - timedelta(1))

        answer, expired = at_once(cancel(batch.id), services.batches_expire)

        done = settled(batch.id)
        if answer.status_code == 200:
            assert (done.status, expired) == (S.CANCELLED, 0)
        else:
            assert error_of(answer, 400)["code"] == "batch_not_cancellable"
            assert (done.status, done.error["code"], expired) == (S.FAILED, "batch_failed", 1)
        outputs = File.objects.filter(filename=f"{batch.id}_output.jsonl")
        assert [f.id for f in outputs] == [done.output_file_id]
