"""File services called directly: sanitising names, output registration, purge."""

from __future__ import annotations

import hashlib
import os
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from batches.models import Batch, BatchStatus
from files.models import File, FilePurpose
from files.services import file_register_output, files_purge, sanitize_filename
from tests.conftest import chat_line, jsonl

CONTENT = jsonl([chat_line("a")])


@pytest.mark.parametrize("given, shown", [
    ("input.jsonl", "input.jsonl"),
    ("../../etc/passwd", "passwd"),
    ("a/b/../c.jsonl", "c.jsonl"),
    ("C:\\Users\\me\\in.jsonl", "in.jsonl"),
    ("..", "upload.jsonl"),
    (".", "upload.jsonl"),
    ("dir/..", "upload.jsonl"),
    ("", "upload.jsonl"),
    (None, "upload.jsonl"),
    ("bad\x00name\x1f.jsonl", "badname.jsonl"),
    ("  spaced.jsonl  ", "spaced.jsonl"),
    ("x" * 300, "x" * 255),
])
def test_sanitize_filename_keeps_only_a_safe_last_component(given, shown):
    assert sanitize_filename(given) == shown


@pytest.mark.django_db
def test_register_output_records_the_incremental_file_as_it_is(storage):
    content = b'{"custom_id":"a"}\n{"custom_id":"b"}\n'
    (storage / "incremental" / "batch_1.jsonl").write_bytes(content)

    output = file_register_output(batch_id="batch_1")

    assert output.purpose == FilePurpose.BATCH_OUTPUT
    assert output.storage_name == "incremental/batch_1.jsonl"
    assert output.bytes == len(content)
    assert output.checksum == "sha256:" + hashlib.sha256(content).hexdigest()
    assert (storage / "incremental" / "batch_1.jsonl").read_bytes() == content


@pytest.mark.django_db
def test_register_output_of_a_batch_with_no_results_is_an_empty_file(storage):
    output = file_register_output(batch_id="batch_2")

    assert output.bytes == 0
    assert (storage / "incremental" / "batch_2.jsonl").read_bytes() == b""


# --- purge ----------------------------------------------------------------------------


def make_file(storage, *, expired: bool, name: str) -> File:
    path = storage / "uploads" / f"{name}.jsonl"
    path.write_bytes(CONTENT)
    return File.objects.create(
        id=name, purpose=FilePurpose.BATCH, filename="in.jsonl", bytes=len(CONTENT),
        checksum="sha256:x", storage_name=f"uploads/{name}.jsonl",
        expires_at=timezone.now() + timedelta(days=-1 if expired else 1),
    )


def make_batch(file: File, status: str) -> Batch:
    return Batch.objects.create(
        id=f"batch_{file.id}", endpoint="/v1/chat/completions", model="m", input_file=file,
        status=status, expires_at=timezone.now() + timedelta(hours=24),
    )


@pytest.mark.django_db
def test_purge_deletes_expired_files_and_their_bytes(storage, django_capture_on_commit_callbacks):
    expired = make_file(storage, expired=True, name="file-old")
    fresh = make_file(storage, expired=False, name="file-new")

    with django_capture_on_commit_callbacks(execute=True):
        deleted = files_purge()

    assert deleted == 1
    assert list(File.objects.values_list("id", flat=True)) == [fresh.id]
    assert not (storage / expired.storage_name).exists()
    assert (storage / fresh.storage_name).exists()


@pytest.mark.django_db
def test_purge_keeps_expired_files_an_active_batch_uses(
        storage, django_capture_on_commit_callbacks):
    in_use = make_file(storage, expired=True, name="file-busy")
    make_batch(in_use, BatchStatus.IN_PROGRESS)
    finished_with = make_file(storage, expired=True, name="file-done")
    make_batch(finished_with, BatchStatus.COMPLETED)

    with django_capture_on_commit_callbacks(execute=True):
        deleted = files_purge()

    assert deleted == 1
    assert list(File.objects.values_list("id", flat=True)) == [in_use.id]
    assert (storage / in_use.storage_name).read_bytes() == CONTENT
    assert not (storage / finished_with.storage_name).exists()


@pytest.mark.django_db
def test_purge_keeps_the_output_file_of_an_active_batch(
        storage, django_capture_on_commit_callbacks):
    input_file = make_file(storage, expired=False, name="file-in")
    batch = make_batch(input_file, BatchStatus.FINALIZING)
    output = file_register_output(batch_id=batch.id)
    File.objects.filter(id=output.id).update(expires_at=timezone.now() - timedelta(days=1))
    Batch.objects.filter(id=batch.id).update(output_file=output)

    with django_capture_on_commit_callbacks(execute=True):
        assert files_purge() == 0

    assert File.objects.filter(id=output.id).exists()


@pytest.mark.django_db
def test_purge_older_than_deletes_by_age_not_expiry(storage, django_capture_on_commit_callbacks):
    old = make_file(storage, expired=False, name="file-aged")
    File.objects.filter(id=old.id).update(created_at=timezone.now() - timedelta(days=10))
    young = make_file(storage, expired=False, name="file-young")

    with django_capture_on_commit_callbacks(execute=True):
        assert files_purge(older_than=timedelta(days=5)) == 1

    assert list(File.objects.values_list("id", flat=True)) == [young.id]


@pytest.mark.django_db
def test_purge_removes_old_partial_uploads_and_keeps_recent_ones(storage):
    uploads = storage / "uploads"
    stale = uploads / ".partial-stale"
    stale.write_bytes(b"half an upload")
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(stale, (two_days_ago, two_days_ago))
    recent = uploads / ".partial-recent"  # an upload streaming right now
    recent.write_bytes(b"in flight")

    files_purge()

    assert not stale.exists()
    assert recent.exists()
