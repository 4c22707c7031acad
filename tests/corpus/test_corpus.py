"""Every case of the bad-input corpus (tests/corpus/cases.py) through the API, in
process: each gets exactly its expected outcome, and none a 5xx. Races send their two
calls at once on threads of their own (transactions of their own, too)."""

from __future__ import annotations

import json
from io import BytesIO
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db.models import Sum

from batches import services
from batches.input_file import read_chunk
from batches.intake import intake_reserved
from batches.models import ACTIVE_STATUSES, Batch, Chunk
from batches.services import OPEN_CHUNKS
from files import storage as file_storage
from files.models import File
from tests.concurrency import at_once, require_concurrent_database
from tests.conftest import error_of
from tests.corpus.cases import (
    ALL_CASES,
    ANY,
    INPUT_FILES,
    INPUTS,
    OUTPUT_LINES,
    RACES,
    Answered,
    BatchFails,
    Call,
    CreateBatch,
    ErrorsCapped,
    InputFile,
    LineErrors,
    Refused,
    Request,
    Stored,
    Upload,
    Validates,
)
from tests.corpus.generated import chat_line

pytestmark = pytest.mark.django_db


def check_refused(response, expected: Refused) -> None:
    error = error_of(response, expected.status)
    assert error["type"] == ("authentication_error" if expected.status == 401
                             else "invalid_request_error")
    if expected.code is not ANY:
        assert error["code"] == expected.code, error
    if expected.param is not ANY:
        assert error["param"] == expected.param, error


def upload(api, content: bytes, filename: str = "input.jsonl") -> str:
    handle = BytesIO(content)
    handle.name = filename
    response = api.post("/v1/files", {"file": handle, "purpose": "batch"}, format="multipart")
    assert response.status_code == 200, response.content[:500]
    return response.json()["id"]


def create(api, file_id: str, endpoint: str) -> dict:
    response = api.post("/v1/batches", {"input_file_id": file_id, "endpoint": endpoint},
                        format="json")
    assert response.status_code == 200, response.content[:500]
    return response.json()


# --- one runner per kind of case ---------------------------------------------------------------


def run_input_file(case: InputFile, api, settings, storage) -> None:
    for name, value in case.settings.items():
        setattr(settings, name, value)
    batch_id = create(api, upload(api, case.content()), case.endpoint)["id"]

    services.batch_validate(batch_id=batch_id)

    response = api.get(f"/v1/batches/{batch_id}")
    assert response.status_code == 200
    batch = response.json()
    expected = case.expected
    if isinstance(expected, Validates):
        assert (batch["status"], batch["error"], batch["errors"]) == ("in_progress", None, None)
        assert batch["request_counts"]["total"] == len(expected.custom_ids)
        assert sorted(read_back(batch_id)) == sorted(expected.custom_ids)
        return
    assert batch["status"] == "failed"
    assert Chunk.objects.filter(batch_id=batch_id).count() == 0  # nothing queued
    if isinstance(expected, BatchFails):
        assert batch["error"]["code"] == expected.code
        assert batch["errors"] is None
        return
    assert batch["error"]["code"] == "invalid_input"
    errors = every_line_error(api, batch_id)
    assert batch["errors"]["data"] == errors[:100]  # the batch object shows the first 100
    assert batch["errors"]["total"] == getattr(expected, "invalid", len(errors))
    for error in errors:
        assert set(error) == {"code", "message", "line", "param"}
        assert isinstance(error["message"], str) and error["message"]
    if isinstance(expected, ErrorsCapped):
        assert len(errors) == expected.listed
        assert {e["code"] for e in errors} == {expected.code}
        assert [e["line"] for e in errors] == list(range(1, expected.listed + 1))
        assert str(expected.invalid) in batch["error"]["message"]
        return
    assert isinstance(expected, LineErrors)
    assert [(e["code"], e["line"], e["param"]) for e in errors] == list(expected.errors)
    assert max(len(e["message"]) for e in errors) <= expected.max_message_chars


def every_line_error(api, batch_id: str) -> list[dict]:
    """All the line errors of a failed batch, page by page (GET /v1/batches/{id}/errors)."""
    errors: list[dict] = []
    query: dict = {"limit": 3000}
    while True:
        page = api.get(f"/v1/batches/{batch_id}/errors", query).json()
        errors += page["data"]
        if not page["has_more"]:
            return errors
        query["after"] = page["data"][-1]["line"]


def read_back(batch_id: str) -> list[str]:
    """The custom_ids of the requests, read from the chunks as a worker reads them."""
    batch = Batch.objects.select_related("input_file").get(id=batch_id)
    input_path = file_storage.absolute(batch.input_file.storage_name)
    order_path = (file_storage.absolute(file_storage.order_name(batch_id)) if batch.grouped
                  else None)
    return [request["custom_id"]
            for chunk in Chunk.objects.filter(batch_id=batch_id).order_by("index")
            for request in read_chunk(input_path, start=chunk.start_offset,
                                      end=chunk.end_offset,
                                      max_line_bytes=django_settings.BATCHGEN_MAX_LINE_BYTES,
                                      order_path=order_path)]


def run_upload(case: Upload, api, settings, storage) -> None:
    response = api.generic("POST", "/v1/files", case.body(), content_type=case.content_type)

    uploads = sorted(p.name for p in (storage / "uploads").iterdir())
    if isinstance(case.expected, Refused):
        check_refused(response, case.expected)
        assert File.objects.count() == 0
        assert uploads == []  # no partial file left behind
        return
    assert response.status_code == 200, response.content[:500]
    file = response.json()
    assert file["filename"] == case.expected.filename
    # The bytes live under the id alone, whatever the name said.
    assert uploads == [f"{file['id']}.jsonl"]
    assert sorted(p.name for p in storage.rglob("*") if p.is_file()) == [f"{file['id']}.jsonl"]


def run_create(case: CreateBatch, api, settings, storage) -> None:
    file_id = upload(api, chat_line("a") + b"\n")
    body = case.body().replace(b"@FILE@", file_id.encode())

    response = api.generic("POST", "/v1/batches", body, content_type=case.content_type)

    check_refused(response, case.expected)
    assert Batch.objects.count() == 0


def run_request(case: Request, api, settings, storage) -> None:
    path = case.path
    if "@BATCH@" in path:
        path = path.replace("@BATCH@", create(api, upload(api, chat_line("a") + b"\n"),
                                              "/v1/chat/completions")["id"])
    if "@BATCH_WITH_OUTPUT@" in path:
        batch_id = create(api, upload(api, chat_line("a") + b"\n"), "/v1/chat/completions")["id"]
        (storage / "incremental" / f"{batch_id}.jsonl").write_bytes(OUTPUT_LINES)
        path = path.replace("@BATCH_WITH_OUTPUT@", batch_id)

    response = api.generic(case.method, path)

    if isinstance(case.expected, Answered):
        assert response.status_code == case.expected.status, response.content[:500]
        assert response.json()["object"] == case.expected.object
    else:
        check_refused(response, case.expected)


RUNNERS = {InputFile: run_input_file, Upload: run_upload, CreateBatch: run_create,
           Request: run_request}


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda case: f"{type(case).__name__}-{case.name}")
def test_corpus_case_gets_its_expected_outcome(case, api, settings, storage, published):
    RUNNERS[type(case)](case, api, settings, storage)


# --- races ----------------------------------------------------------------------------------------


def race_subject(kind: str) -> dict[str, str]:
    """A fresh file, and for a batch race a batch on it: the placeholders' values."""
    from rest_framework.test import APIClient

    subject = {"@FILE@": upload(APIClient(), chat_line("a") + b"\n" + chat_line("b") + b"\n")}
    if kind != "file":
        subject["@BATCH@"] = create(APIClient(), subject["@FILE@"], "/v1/chat/completions")["id"]
    if kind == "running":
        assert services.batch_validate(batch_id=subject["@BATCH@"]).status == "in_progress"
    return subject


def send(call: Call, subject: dict[str, str]):
    from rest_framework.test import APIClient

    path, body = call.path, json.dumps(call.body) if call.body else None
    for placeholder, value in subject.items():
        path = path.replace(placeholder, value)
        body = body.replace(placeholder, value) if body else body
    return lambda: APIClient().generic(call.method, path, body or "",
                                       content_type="application/json")


def answer_of(response) -> tuple[int, str | None]:
    if response.status_code < 400:
        return response.status_code, None
    return response.status_code, error_of(response, response.status_code)["code"]


def assert_capacity_accounted() -> None:
    """No batch that is over holds capacity or an open chunk, and the intake pool's
    reservation is what the active batches hold."""
    over = Batch.objects.exclude(status__in=ACTIVE_STATUSES)
    assert not over.filter(intake_reserved__gt=0).exists()
    assert not Chunk.objects.filter(batch__in=over, status__in=OPEN_CHUNKS).exists()
    held = (Batch.objects.filter(status__in=ACTIVE_STATUSES)
            .aggregate(held=Sum("intake_reserved"))["held"] or 0)
    assert intake_reserved() == held


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("race", RACES, ids=lambda race: f"Race-{race.name}")
def test_race_case_has_one_winner_and_a_clear_answer_for_the_other(race, published):
    require_concurrent_database()
    for _ in range(race.trials):
        subject = race_subject(race.subject)

        responses = at_once(*(send(call, subject) for call in race.calls))

        answers = tuple(answer_of(r) for r in responses)
        assert answers in race.outcomes, answers
        assert_capacity_accounted()


# --- the manifest itself ------------------------------------------------------------------------


def test_manifest_names_are_unique_and_every_input_file_has_a_case():
    names = [f"{type(case).__name__}-{case.name}" for case in [*ALL_CASES, *RACES]]
    assert len(names) == len(set(names))
    on_disk = {path.stem for path in Path(INPUTS).glob("*.jsonl")}
    from_files = {case.name for case in INPUT_FILES}
    assert on_disk <= from_files, f"files without a case: {sorted(on_disk - from_files)}"
    malformed = [case for case in ALL_CASES
                 if not isinstance(case.expected, (Validates, Stored, Answered))]
    assert len(malformed) >= 40
