"""The maintenance commands: each calls its service, is idempotent and has --help."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError
from django.utils import timezone

from batches.models import Batch, Chunk, ChunkStatus
from files import storage
from files.management.commands.purge_files import parse_duration
from files.models import File
from tests.ops.conftest import chunks_of, result_line

pytestmark = pytest.mark.django_db

COMMANDS = {
    "pool_status": "batches", "recover": "batches", "expire_batches": "batches",
    "cancel_batch": "batches", "purge_files": "files",
}


def run(*args, **options) -> str:
    out = StringIO()
    call_command(*args, stdout=out, **options)
    return out.getvalue()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_explains_itself_in_help(name):
    command = load_command_class(COMMANDS[name], name)

    text = command.create_parser("manage.py", name).format_help()

    assert f"usage: manage.py {name}" in text
    assert len(command.help) > 40, "the help says what the command does"


# --- pool_status -----------------------------------------------------------------------


def test_pool_status_prints_what_the_api_answers(api, make_batch, worker_row):
    worker_row(slots_active=3, slots_capacity=16)
    make_batch(5)

    as_json = json.loads(run("pool_status", "--json"))
    as_text = run("pool_status")

    assert as_json == api.get("/v1/pool/status").json()
    assert as_json["scheduling_pool_active"] == 3 and as_json["active_batches"] == 1
    for key, value in as_json.items():
        assert f"{key} " in as_text and as_text.count(json.dumps(value)) >= 1


# --- recover ------------------------------------------------------------------------------


def test_recover_after_a_crash_requeues_repairs_and_finalizes(make_batch, run_chunk, worker_row,
                                                              published,
                                                              django_capture_on_commit_callbacks):
    # Given: a worker died holding a chunk of one batch, mid-write (a torn last line),
    crashed = make_batch(6)
    dead = worker_row("host-a:999:1", age=3600)
    lost = run_chunk(chunks_of(crashed)[0], worker=dead.name, completed=1, close=False)
    Chunk.objects.filter(id=lost.id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=5))
    incremental = storage.absolute(storage.incremental_name(crashed.id))
    with incremental.open("ab") as fh:
        fh.write(b'{"custom_id": "req-1", "respo')
    # and another batch's last chunk closed without its finalizer running.
    finished = make_batch(2)
    chunk = chunks_of(finished)[0]
    Chunk.objects.filter(id=chunk.id).update(status=ChunkStatus.DONE, completed=2,
                                             finished_at=timezone.now())
    published.clear()

    # When
    with django_capture_on_commit_callbacks(execute=True):
        report = run("recover")

    # Then: the lost chunk is back in the queue, unowned, and published again;
    lost.refresh_from_db()
    assert lost.status in (ChunkStatus.QUEUED, ChunkStatus.PENDING) and lost.worker == ""
    assert ("inference.run_chunk", (crashed.id, lost.id)) in published
    assert lost.completed == 1  # what it wrote before dying stays accounted
    # the torn line is cut back to the last whole line;
    assert incremental.read_bytes() == result_line("req-0")
    # the finished batch is completed with its output.
    finished.refresh_from_db()
    assert finished.status == "completed" and finished.output_file_id is not None
    assert "1 chunk(s) requeued" in report
    assert "1 batch(es) finalized" in report
    assert "1 torn line(s) repaired" in report


def test_recover_twice_changes_nothing_the_second_time(make_batch, run_chunk, worker_row,
                                                      published,
                                                      django_capture_on_commit_callbacks):
    batch = make_batch(4)
    dead = worker_row("host-a:999:1", age=3600)
    lost = run_chunk(chunks_of(batch)[0], worker=dead.name, completed=0, close=False)
    Chunk.objects.filter(id=lost.id).update(lease_expires_at=timezone.now())

    with django_capture_on_commit_callbacks(execute=True):
        first = run("recover")
    with django_capture_on_commit_callbacks(execute=True):
        second = run("recover")

    assert "1 chunk(s) requeued" in first
    assert second.strip() == ("recovery: 0 chunk(s) requeued, 0 validation(s) restarted, "
                              "0 failed for good, 0 batch(es) finalized, "
                              "0 torn line(s) repaired")


# --- expire_batches -----------------------------------------------------------------------


def test_expire_batches_fails_overdue_batches_once(make_batch, run_chunk):
    overdue = make_batch(4)
    run_chunk(chunks_of(overdue)[0])
    on_time = make_batch(4)
    Batch.objects.filter(id=overdue.id).update(expires_at=timezone.now() - timedelta(minutes=1))

    first = run("expire_batches")
    second = run("expire_batches")

    overdue.refresh_from_db()
    on_time.refresh_from_db()
    assert first.strip() == "1 batch(es) expired"
    assert second.strip() == "0 batch(es) expired"
    assert overdue.status == "failed" and overdue.error["code"] == "batch_failed"
    assert overdue.output_file_id is not None  # the two results written are kept
    assert on_time.status == "in_progress"


# --- purge_files --------------------------------------------------------------------------


def test_purge_files_older_than_keeps_recent_and_in_use_files(make_batch, upload,
                                                             django_capture_on_commit_callbacks):
    old = upload(b'{"a": 1}\n')["id"]
    recent = upload(b'{"b": 1}\n')["id"]
    in_use = make_batch(2).input_file_id
    eight_days_ago = timezone.now() - timedelta(days=8)
    File.objects.filter(id__in=[old, in_use]).update(created_at=eight_days_ago)
    old_path = storage.absolute(File.objects.get(id=old).storage_name)

    with django_capture_on_commit_callbacks(execute=True):
        first = run("purge_files", "--older-than", "7d")
    second = run("purge_files", "--older-than", "7d")

    assert first.strip() == "1 file(s) deleted"
    assert second.strip() == "0 file(s) deleted"
    assert set(File.objects.values_list("id", flat=True)) == {recent, in_use}
    assert not old_path.exists()


def test_purge_files_without_an_age_deletes_expired_files(upload):
    expired = upload(b'{"a": 1}\n')["id"]
    kept = upload(b'{"b": 1}\n')["id"]
    File.objects.filter(id=expired).update(expires_at=timezone.now() - timedelta(hours=1))

    out = run("purge_files")

    assert out.strip() == "1 file(s) deleted"
    assert list(File.objects.values_list("id", flat=True)) == [kept]


@pytest.mark.parametrize("text, expected", [
    ("7d", timedelta(days=7)), ("12h", timedelta(hours=12)), ("30m", timedelta(minutes=30)),
    ("45s", timedelta(seconds=45)), ("2w", timedelta(weeks=2)), ("1.5h", timedelta(minutes=90)),
    (" 3D ", timedelta(days=3)),
])
def test_durations_parse(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["7", "d", "-1d", "7 days", "1y", ""])
def test_purge_files_rejects_a_bad_duration(text, upload):
    upload(b'{"a": 1}\n')

    with pytest.raises(CommandError, match="not a duration"):
        run("purge_files", f"--older-than={text}")

    assert File.objects.count() == 1


# --- cancel_batch -------------------------------------------------------------------------


def test_cancel_batch_cancels_through_the_service_and_is_idempotent(make_batch, run_chunk):
    batch = make_batch(4)
    run_chunk(chunks_of(batch)[0])

    first = run("cancel_batch", batch.id)
    second = run("cancel_batch", batch.id)

    batch.refresh_from_db()
    assert first.strip() == f"{batch.id} is cancelled"
    assert second.strip() == f"{batch.id} is already cancelled"
    assert batch.status == "cancelled" and batch.completed == 2
    assert batch.output_file_id is not None


def test_cancel_batch_with_a_running_chunk_leaves_it_cancelling(make_batch, run_chunk):
    batch = make_batch(4)
    run_chunk(chunks_of(batch)[0], close=False)

    out = run("cancel_batch", batch.id)

    assert out.strip() == f"{batch.id} is cancelling"
    assert run("cancel_batch", batch.id).strip() == f"{batch.id} is cancelling"


def test_cancel_batch_explains_unknown_and_finished_batches(make_batch, run_chunk):
    finished = make_batch(2)
    run_chunk(chunks_of(finished)[0])

    with pytest.raises(CommandError, match="No such batch: batch_nope"):
        run("cancel_batch", "batch_nope")
    with pytest.raises(CommandError, match="is completed and can no longer be cancelled"):
        run("cancel_batch", finished.id)

    finished.refresh_from_db()
    assert finished.status == "completed"
