"""Batch services called directly: validate and enqueue, finalize, fail and expire,
recovery, and the transition rules."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from batches import recovery, services
from batches.intake import intake_reserved
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from batches.services import IllegalTransition, batch_transition
from files.models import File, FilePurpose
from tests.concurrency import require_concurrent_database, run_together
from tests.conftest import chat_line, jsonl

pytestmark = pytest.mark.django_db

S = BatchStatus


def incremental(storage, batch):
    return storage / "incremental" / f"{batch.id}.jsonl"


def result(custom_id: str) -> bytes:
    return json.dumps({"id": f"batch_req_{custom_id}", "custom_id": custom_id,
                       "response": {"status_code": 200}, "error": None}).encode() + b"\n"


def chunk_statuses(batch) -> list[str]:
    return list(Chunk.objects.filter(batch_id=batch.id).order_by("index")
                .values_list("status", flat=True))


def run_chunks(published) -> list[tuple]:
    return [args for name, args in published if name == "inference.run_chunk"]


def validate(batch_id: str, capture):
    with capture(execute=True):
        return services.batch_validate(batch_id=batch_id)


# --- validate and enqueue -----------------------------------------------------------------


def test_validate_enqueues_chunks_covering_every_line(
        create_batch, settings, storage, published, reserved,
        django_capture_on_commit_callbacks):
    settings.BATCHGEN_CHUNK_SIZE = 2
    settings.BATCHGEN_PREFIX_GROUPING = False  # chunks as byte ranges of the input
    content = jsonl([chat_line(f"r{i}", "z" * i) for i in range(5)])
    batch = create_batch(content=content)

    with django_capture_on_commit_callbacks() as callbacks:
        validated = services.batch_validate(batch_id=batch.id)
    assert run_chunks(published) == []  # nothing published inside the transaction
    with django_capture_on_commit_callbacks(execute=True):  # runs the dispatcher's too
        for callback in callbacks:
            callback()

    assert validated.status == S.IN_PROGRESS
    assert validated.in_progress_at is not None
    assert validated.total == 5
    chunks = list(Chunk.objects.filter(batch=batch).order_by("index"))
    assert [(c.index, c.first_line, c.count) for c in chunks] == [(0, 1, 2), (1, 3, 2), (2, 5, 1)]
    assert chunks[0].start_offset == 0
    assert all(a.end_offset == b.start_offset for a, b in zip(chunks, chunks[1:], strict=False))
    assert chunks[-1].end_offset == len(content)
    assert sum(c.count for c in chunks) == validated.total
    assert all(c.status == ChunkStatus.QUEUED for c in chunks)
    assert validated.intake_reserved == 5
    assert reserved() == 5
    assert sorted(run_chunks(published)) == sorted((batch.id, c.id) for c in chunks)
    assert not Chunk.objects.filter(batch=batch, published_at__isnull=True).exists()


def test_validating_twice_enqueues_once(running_batch, published, reserved,
                                        django_capture_on_commit_callbacks):
    batch = running_batch(3, chunk_size=1)
    before = len(run_chunks(published))

    again = validate(batch.id, django_capture_on_commit_callbacks)

    assert again.status == S.IN_PROGRESS
    assert Chunk.objects.filter(batch=batch).count() == 3
    assert len(run_chunks(published)) == before == 3
    assert reserved() == 3


BAD_LINES = [
    (b"{broken", "invalid_json"),
    ({k: v for k, v in chat_line("x").items() if k != "custom_id"}, "missing_custom_id"),
    (chat_line("ok-1"), "duplicate_custom_id"),
    ({**chat_line("x"), "method": "GET"}, "invalid_method"),
    ({**chat_line("x"), "url": "/v1/completions"}, "invalid_url"),
    ({**chat_line("x"), "body": {"model": "m"}}, "invalid_body"),
    ({**chat_line("x"), "body": {"messages": [{"role": "user", "content": "hi"}]}},
     "invalid_body"),
    (chat_line("x", temperature=-1), "invalid_body"),
    (chat_line("x", top_p=2), "invalid_body"),
    (json.dumps(chat_line("x", "w" * 2000)).encode(), "line_too_long"),
]


@pytest.mark.parametrize("line, code", BAD_LINES, ids=[c for _, c in BAD_LINES])
def test_one_bad_line_fails_the_batch_naming_its_code_and_line(
        api, create_batch, settings, published, reserved, line, code,
        django_capture_on_commit_callbacks):
    settings.BATCHGEN_MAX_LINE_BYTES = 1000
    batch = create_batch([chat_line("ok-1"), chat_line("ok-2"), line, chat_line("ok-3")])

    failed = validate(batch.id, django_capture_on_commit_callbacks)

    assert failed.status == S.FAILED
    assert failed.failed_at is not None
    assert failed.error["code"] == "invalid_input"
    body = api.get(f"/v1/batches/{batch.id}").json()
    assert body["errors"]["object"] == "list"
    assert [(e["code"], e["line"]) for e in body["errors"]["data"]] == [(code, 3)]
    assert not Chunk.objects.filter(batch=batch).exists()
    assert reserved() == 0
    assert run_chunks(published) == []


def test_completions_batch_without_prompt_fails_with_invalid_body(
        create_batch, published, django_capture_on_commit_callbacks):
    from tests.conftest import completion_line

    bad = completion_line("b")
    del bad["body"]["prompt"]
    batch = create_batch([completion_line("a"), bad], endpoint="/v1/completions")

    failed = validate(batch.id, django_capture_on_commit_callbacks)

    assert [(e["code"], e["line"], e["param"]) for e in failed.errors] == [
        ("invalid_body", 2, "body.prompt")]


def test_a_file_with_several_bad_lines_lists_them_all_and_queues_nothing(
        create_batch, published, reserved, django_capture_on_commit_callbacks):
    batch = create_batch([
        chat_line("a"), b"nope", chat_line("b"), {**chat_line("c"), "method": "DELETE"},
        chat_line("a"), chat_line("d"), {**chat_line("e"), "body": []},
    ])

    failed = validate(batch.id, django_capture_on_commit_callbacks)

    assert failed.status == S.FAILED
    assert [(e["code"], e["line"]) for e in failed.errors] == [
        ("invalid_json", 2), ("invalid_method", 4), ("duplicate_custom_id", 5),
        ("invalid_body", 7)]
    assert "4 input line(s)" in failed.error["message"]
    assert not Chunk.objects.filter(batch=batch).exists()
    assert Batch.objects.get(id=batch.id).intake_reserved == 0
    assert reserved() == 0
    assert run_chunks(published) == []


def test_bom_crlf_and_blank_lines_are_accepted(
        create_batch, settings, published, django_capture_on_commit_callbacks):
    settings.BATCHGEN_CHUNK_SIZE = 2
    lines = [json.dumps(chat_line(c)).encode() for c in "abc"]
    content = b"\xef\xbb\xbf" + lines[0] + b"\r\n\r\n" + lines[1] + b"\r\n\n" + lines[2] + b"\r\n"
    batch = create_batch(content=content)

    validated = validate(batch.id, django_capture_on_commit_callbacks)

    assert validated.status == S.IN_PROGRESS, validated.errors
    assert validated.total == 3
    assert sum(Chunk.objects.filter(batch=batch).values_list("count", flat=True)) == 3


def test_a_file_of_blank_lines_fails_as_empty(
        create_batch, published, reserved, django_capture_on_commit_callbacks):
    batch = create_batch(content=b"\n\r\n  \n\n")

    failed = validate(batch.id, django_capture_on_commit_callbacks)

    assert failed.status == S.FAILED
    assert failed.error["code"] == "empty_batch"
    assert not Chunk.objects.filter(batch=batch).exists()
    assert reserved() == 0


def test_a_batch_that_does_not_fit_the_intake_pool_fails_with_capacity_exceeded(
        create_batch, settings, published, reserved, django_capture_on_commit_callbacks,
        hold_intake):
    settings.BATCHGEN_MAX_INTAKE_CAPACITY = 10
    hold_intake(7)
    batch = create_batch([chat_line(f"r{i}") for i in range(4)])

    failed = validate(batch.id, django_capture_on_commit_callbacks)

    assert failed.status == S.FAILED
    assert failed.error["code"] == "capacity_exceeded"
    assert failed.total == 4
    assert failed.intake_reserved == 0
    assert reserved() == 7  # nothing of this batch was reserved
    assert not Chunk.objects.filter(batch=batch).exists()
    assert run_chunks(published) == []


def test_a_batch_that_exactly_fills_the_intake_pool_is_enqueued(
        create_batch, settings, published, reserved, django_capture_on_commit_callbacks,
        hold_intake):
    settings.BATCHGEN_MAX_INTAKE_CAPACITY = 10
    hold_intake(6)
    batch = create_batch([chat_line(f"r{i}") for i in range(4)])

    assert validate(batch.id, django_capture_on_commit_callbacks).status == S.IN_PROGRESS
    assert reserved() == 10


def test_validation_of_a_batch_cancelled_meanwhile_enqueues_nothing(
        create_batch, published, reserved, monkeypatch, django_capture_on_commit_callbacks):
    batch = create_batch([chat_line("a"), chat_line("b")])
    real_validate_file = services.validate_file

    def validate_then_cancel(*args, **kwargs):
        report = real_validate_file(*args, **kwargs)
        services.batch_cancel(batch_id=batch.id)  # the user cancels while we read
        return report

    monkeypatch.setattr(services, "validate_file", validate_then_cancel)

    result = validate(batch.id, django_capture_on_commit_callbacks)

    assert result.status == S.CANCELLED
    assert not Chunk.objects.filter(batch=batch).exists()
    assert reserved() == 0
    assert Batch.objects.get(id=batch.id).intake_reserved == 0
    assert run_chunks(published) == []


def test_validation_of_a_cancelled_batch_does_not_read_the_file(
        create_batch, published, monkeypatch, django_capture_on_commit_callbacks):
    batch = create_batch()
    services.batch_cancel(batch_id=batch.id)
    monkeypatch.setattr(services, "validate_file", lambda *a, **k: pytest.fail("read"))

    assert validate(batch.id, django_capture_on_commit_callbacks).status == S.CANCELLED


# --- finalize -----------------------------------------------------------------------------


def finish_all_chunks(batch) -> None:
    Chunk.objects.filter(batch=batch).update(status=ChunkStatus.DONE)


def test_finalize_registers_the_incremental_file_once_however_often_it_runs(
        running_batch, storage, reserved):
    batch = running_batch(3, chunk_size=2)
    content = result("req-0") + result("req-1") + result("req-2")
    incremental(storage, batch).write_bytes(content)
    finish_all_chunks(batch)

    first = services.batch_finalize(batch_id=batch.id)
    second = services.batch_finalize(batch_id=batch.id)

    assert first.status == second.status == S.COMPLETED
    assert first.completed_at is not None and first.finalizing_at is not None
    assert first.output_file_id is not None
    assert second.output_file_id == first.output_file_id
    outputs = File.objects.filter(purpose=FilePurpose.BATCH_OUTPUT)
    assert list(outputs.values_list("id", flat=True)) == [first.output_file_id]
    output = outputs.get()
    assert output.storage_name == f"incremental/{batch.id}.jsonl"
    # Whole lines are left exactly as written.
    assert incremental(storage, batch).read_bytes() == content
    assert output.bytes == len(content)
    assert output.checksum == "sha256:" + hashlib.sha256(content).hexdigest()
    assert reserved() == 0


def test_finalize_cuts_a_torn_tail_before_registering_the_output(running_batch, storage):
    # A worker died mid-line and its chunk was never run again (the batch failed):
    # the served output must still be whole lines only.
    batch = running_batch(2, chunk_size=2)
    whole = result("req-0")
    incremental(storage, batch).write_bytes(whole + result("req-1")[:25])
    services.batch_fail(batch_id=batch.id, code="batch_failed", message="worker lost")
    finish_all_chunks(batch)

    finalized = services.batch_finalize(batch_id=batch.id)

    output = File.objects.get(id=finalized.output_file_id)
    assert incremental(storage, batch).read_bytes() == whole
    assert output.bytes == len(whole)
    assert output.checksum == "sha256:" + hashlib.sha256(whole).hexdigest()


def test_finalize_waits_while_a_chunk_is_open(running_batch):
    batch = running_batch(4, chunk_size=2)
    Chunk.objects.filter(batch=batch, index=0).update(status=ChunkStatus.DONE)

    still = services.batch_finalize(batch_id=batch.id)

    assert still.status == S.IN_PROGRESS
    assert still.output_file_id is None


def test_finalize_of_a_batch_that_never_ran_registers_no_output(create_batch, published):
    batch = create_batch()
    services.batch_cancel(batch_id=batch.id)

    finalized = services.batch_finalize(batch_id=batch.id)

    assert finalized.status == S.CANCELLED
    assert finalized.output_file_id is None
    assert not File.objects.filter(purpose=FilePurpose.BATCH_OUTPUT).exists()


# --- fail and expire --------------------------------------------------------------------


def expire(batch) -> None:
    Batch.objects.filter(id=batch.id).update(expires_at=timezone.now() - timedelta(seconds=1))


def test_expired_batch_fails_keeping_its_partial_output(running_batch, storage, reserved):
    batch = running_batch(5, chunk_size=2)
    Chunk.objects.filter(batch=batch, index=0).update(status=ChunkStatus.DONE, completed=2)
    Batch.objects.filter(id=batch.id).update(completed=2)
    Batch.objects.filter(id=batch.id).update(intake_reserved=3)
    partial = result("req-0") + result("req-1")
    incremental(storage, batch).write_bytes(partial)
    expire(batch)

    assert services.batches_expire() == 1

    failed = Batch.objects.get(id=batch.id)
    assert failed.status == S.FAILED
    assert failed.failed_at is not None
    assert failed.error["code"] == "batch_failed"
    assert "24h" in failed.error["message"]
    assert chunk_statuses(batch) == [ChunkStatus.DONE, ChunkStatus.SKIPPED, ChunkStatus.SKIPPED]
    assert failed.intake_reserved == 0
    assert reserved() == 0
    output = File.objects.get(id=failed.output_file_id)
    assert output.purpose == FilePurpose.BATCH_OUTPUT
    assert output.bytes == len(partial)
    assert incremental(storage, batch).read_bytes() == partial


def test_expiry_leaves_batches_within_their_window_alone(running_batch):
    batch = running_batch(2)

    assert services.batches_expire() == 0
    assert Batch.objects.get(id=batch.id).status == S.IN_PROGRESS


def test_expired_validating_batch_fails_without_output(create_batch, published):
    batch = create_batch()
    expire(batch)

    assert services.batches_expire() == 1

    failed = Batch.objects.get(id=batch.id)
    assert (failed.status, failed.error["code"]) == (S.FAILED, "batch_failed")
    assert failed.output_file_id is None


def test_failing_a_batch_with_a_running_chunk_finalizes_once_the_chunk_is_done(
        running_batch, storage, reserved, published):
    batch = running_batch(4, chunk_size=2)
    Chunk.objects.filter(batch=batch, index=0).update(
        status=ChunkStatus.RUNNING, worker="w1",
        lease_expires_at=timezone.now() + timedelta(minutes=1))

    assert services.batch_fail(batch_id=batch.id, code="batch_failed", message="boom")

    failed = Batch.objects.get(id=batch.id)
    assert failed.status == S.FAILED
    assert failed.output_file_id is None  # the running chunk may still write
    assert chunk_statuses(batch) == [ChunkStatus.RUNNING, ChunkStatus.SKIPPED]
    assert reserved() == 2

    # When the running chunk closes and recovery (or its settle) finalizes
    Chunk.objects.filter(batch=batch, index=0).update(status=ChunkStatus.SKIPPED)
    report = recovery.recover()

    assert report.batches_finalized == 1
    finalized = Batch.objects.get(id=batch.id)
    assert finalized.status == S.FAILED
    assert finalized.output_file_id is not None
    assert reserved() == 0


def test_failing_a_finished_batch_is_refused(running_batch):
    batch = running_batch(1)
    finish_all_chunks(batch)
    services.batch_finalize(batch_id=batch.id)

    assert services.batch_fail(batch_id=batch.id, code="batch_failed", message="x") is False
    assert Batch.objects.get(id=batch.id).status == S.COMPLETED


# --- recovery -----------------------------------------------------------------------------


def test_recover_requeues_and_republishes_a_chunk_whose_lease_expired(running_batch, published):
    batch = running_batch(4, chunk_size=2)
    lost, waiting = Chunk.objects.filter(batch=batch).order_by("index")
    Chunk.objects.filter(id=lost.id).update(
        status=ChunkStatus.RUNNING, worker="dead", attempts=1,
        lease_expires_at=timezone.now() - timedelta(seconds=5))
    published.clear()

    report = recovery.recover()

    assert report.chunks_requeued == 1
    lost.refresh_from_db()
    assert (lost.status, lost.worker, lost.lease_expires_at) == (ChunkStatus.QUEUED, "", None)
    assert lost.published_at is not None
    assert run_chunks(published) == [(batch.id, lost.id)]  # the waiting one is not resent


def test_recover_leaves_a_chunk_with_a_live_lease_running(running_batch, published):
    batch = running_batch(2, chunk_size=2)
    Chunk.objects.filter(batch=batch).update(
        status=ChunkStatus.RUNNING, worker="alive",
        lease_expires_at=timezone.now() + timedelta(seconds=30))
    published.clear()

    assert recovery.recover().chunks_requeued == 0
    assert chunk_statuses(batch) == [ChunkStatus.RUNNING]
    assert run_chunks(published) == []


def test_recover_publishes_a_queued_chunk_whose_message_never_went_out(running_batch, published):
    batch = running_batch(2, chunk_size=1)
    unsent = Chunk.objects.get(batch=batch, index=1)
    Chunk.objects.filter(id=unsent.id).update(published_at=None)
    published.clear()

    recovery.recover()

    assert run_chunks(published) == [(batch.id, unsent.id)]


def test_recover_finalizes_an_in_progress_batch_whose_chunks_are_all_done(
        running_batch, storage, reserved):
    batch = running_batch(3, chunk_size=2)
    incremental(storage, batch).write_bytes(result("req-0") + result("req-1") + result("req-2"))
    finish_all_chunks(batch)

    report = recovery.recover()

    assert report.batches_finalized == 1
    done = Batch.objects.get(id=batch.id)
    assert done.status == S.COMPLETED
    assert done.output_file_id is not None
    assert reserved() == 0


def test_recover_restarts_a_validation_lost_with_its_worker(create_batch, published):
    batch = create_batch()
    Batch.objects.filter(id=batch.id).update(
        validation_started_at=timezone.now() - timedelta(hours=1))
    published.clear()

    report = recovery.recover()

    assert report.validations_restarted == 1
    assert published == [("batches.validate_batch", (batch.id,))]


def test_recover_restarts_a_lost_validation_a_bounded_number_of_times_then_fails_it(
        create_batch, published, settings, reserved):
    settings.BATCHGEN_VALIDATION_MAX_RESTARTS = 2
    batch = create_batch()
    published.clear()

    for _ in range(4):  # each pass finds the validation lost again
        Batch.objects.filter(id=batch.id).update(
            validation_started_at=timezone.now() - timedelta(hours=1))
        recovery.recover()

    assert published == [("batches.validate_batch", (batch.id,))] * 2
    failed = Batch.objects.get(id=batch.id)
    assert failed.status == S.FAILED
    assert failed.error["code"] == "validation_failed"
    assert "BATCHGEN_VALIDATION_MAX_RESTARTS" in failed.error["message"]
    assert reserved() == 0


@pytest.mark.parametrize("gone", ["row", "bytes"])
def test_validation_of_a_batch_whose_input_file_is_gone_fails_it_clearly(
        create_batch, storage, gone):
    batch = create_batch()
    if gone == "row":  # deleted behind the API's back (its in-use check is the guard)
        File.objects.filter(id=batch.input_file_id).delete()
    else:
        (storage / "uploads" / f"{batch.input_file_id}.jsonl").unlink()

    failed = services.batch_validate(batch_id=batch.id)

    assert failed.status == S.FAILED
    assert failed.error["code"] == "input_file_missing"
    assert batch.input_file_id in failed.error["message"]
    assert not Chunk.objects.filter(batch_id=batch.id).exists()


def test_recover_repairs_a_torn_tail_when_no_chunk_is_running(running_batch, storage):
    batch = running_batch(2, chunk_size=1)
    incremental(storage, batch).write_bytes(result("req-0") + b'{"custom_id": "req-1", "resp')

    report = recovery.recover()

    assert report.torn_lines_repaired == 1
    assert incremental(storage, batch).read_bytes() == result("req-0")


def test_recover_is_idempotent(running_batch, published):
    running_batch(2, chunk_size=1)
    recovery.recover()
    published.clear()

    report = recovery.recover()

    assert (report.chunks_requeued, report.validations_restarted,
            report.batches_finalized, report.torn_lines_repaired) == (0, 0, 0, 0)
    assert published == []


# --- transitions ------------------------------------------------------------------------


def bare_batch(status: str) -> Batch:
    file = File.objects.create(id=f"file-{status}", purpose=FilePurpose.BATCH, filename="f",
                               bytes=1, checksum="sha256:x", storage_name="uploads/f")
    return Batch.objects.create(id=f"batch_{status}", endpoint="/v1/chat/completions",
                                model="m", input_file=file, status=status,
                                expires_at=timezone.now() + timedelta(hours=24))


ILLEGAL = [
    (S.VALIDATING, S.COMPLETED), (S.VALIDATING, S.FINALIZING),
    (S.IN_PROGRESS, S.COMPLETED), (S.IN_PROGRESS, S.CANCELLED),
    (S.FINALIZING, S.CANCELLING), (S.FINALIZING, S.IN_PROGRESS),
    (S.CANCELLING, S.COMPLETED), (S.CANCELLING, S.IN_PROGRESS),
    (S.COMPLETED, S.FAILED), (S.COMPLETED, S.CANCELLING), (S.COMPLETED, S.IN_PROGRESS),
    (S.FAILED, S.IN_PROGRESS), (S.FAILED, S.COMPLETED),
    (S.CANCELLED, S.IN_PROGRESS), (S.CANCELLED, S.CANCELLING),
]


@pytest.mark.parametrize("source, target", ILLEGAL)
def test_illegal_transitions_are_refused_and_change_nothing(source, target):
    batch = bare_batch(source)

    assert batch_transition(batch_id=batch.id, to=target) is False

    after = Batch.objects.get(id=batch.id)
    assert after.status == source
    assert (after.completed_at, after.failed_at, after.cancelled_at,
            after.cancelling_at, after.in_progress_at) == (None,) * 5


LEGAL = [
    (S.VALIDATING, S.IN_PROGRESS, "in_progress_at"), (S.VALIDATING, S.FAILED, "failed_at"),
    (S.VALIDATING, S.CANCELLED, "cancelled_at"), (S.IN_PROGRESS, S.FINALIZING, "finalizing_at"),
    (S.IN_PROGRESS, S.CANCELLING, "cancelling_at"), (S.IN_PROGRESS, S.FAILED, "failed_at"),
    (S.FINALIZING, S.COMPLETED, "completed_at"), (S.CANCELLING, S.CANCELLED, "cancelled_at"),
]


@pytest.mark.parametrize("source, target, stamp", LEGAL)
def test_legal_transitions_move_and_stamp_the_time(source, target, stamp):
    batch = bare_batch(source)

    assert batch_transition(batch_id=batch.id, to=target) is True

    after = Batch.objects.get(id=batch.id)
    assert after.status == target
    assert getattr(after, stamp) is not None


@pytest.mark.parametrize("status", [S.COMPLETED, S.FAILED, S.CANCELLED, S.FINALIZING])
def test_cancel_of_a_batch_past_running_raises_a_400_error(status):
    batch = bare_batch(status)

    with pytest.raises(IllegalTransition) as raised:
        services.batch_cancel(batch_id=batch.id)

    assert raised.value.status_code == 400
    assert raised.value.code == "batch_not_cancellable"
    assert Batch.objects.get(id=batch.id).status == status


# --- concurrency (real transactions, one connection per thread) ---------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_on_one_file_make_exactly_one_active_batch(upload, published):
    from core.errors import BatchGenError

    require_concurrent_database()

    file = upload(jsonl([chat_line("a")]))

    outcomes = run_together(4, lambda i: services.batch_create(
        input_file_id=file["id"], endpoint="/v1/chat/completions", model="m"))

    created = [o for o in outcomes if isinstance(o, Batch)]
    refused = [o for o in outcomes if isinstance(o, BatchGenError)]
    assert len(created) == 1, outcomes
    assert len(refused) == 3 and all(e.code == "duplicate_batch" for e in refused)
    assert Batch.objects.filter(input_file_id=file["id"]).count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_validations_never_reserve_past_capacity(upload, published, settings):
    require_concurrent_database()
    settings.BATCHGEN_MAX_INTAKE_CAPACITY = 10
    batches = [
        services.batch_create(input_file_id=upload(jsonl(
            [chat_line(f"b{n}-{i}") for i in range(4)]))["id"],
            endpoint="/v1/chat/completions", model="m")
        for n in range(4)
    ]

    outcomes = run_together(4, lambda i: services.batch_validate(batch_id=batches[i].id))

    assert all(isinstance(o, Batch) for o in outcomes), outcomes
    statuses = sorted(o.status for o in outcomes)
    assert statuses == [S.FAILED, S.FAILED, S.IN_PROGRESS, S.IN_PROGRESS]  # 4 + 4 <= 10
    assert all(o.error["code"] == "capacity_exceeded" for o in outcomes if o.status == S.FAILED)
    assert intake_reserved() == 8
    assert Chunk.objects.values("batch").distinct().count() == 2
