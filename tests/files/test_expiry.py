"""Expiry options as OpenAI has them: `expires_after` on upload (multipart fields
`expires_after[anchor]`/`expires_after[seconds]`, as the openai SDK sends them) and
`output_expires_after` on batch create, within the server's bounds; the purge
honours them and never takes a file an active batch uses."""

from __future__ import annotations

from datetime import timedelta
from io import BytesIO

import pytest
from django.utils import timezone

from batches import services
from batches.models import Batch, BatchStatus, Chunk
from files.models import File
from files.services import files_purge
from tests.conftest import chat_line, jsonl
from tests.files.test_api import assert_envelope

pytestmark = pytest.mark.django_db

CONTENT = jsonl([chat_line("a"), chat_line("b")])


def post_upload(api, **fields):
    handle = BytesIO(CONTENT)
    handle.name = "input.jsonl"
    return api.post("/v1/files", {"file": handle, "purpose": "batch", **fields},
                    format="multipart")


def test_an_upload_with_expires_after_expires_that_long_after_its_creation(api):
    response = post_upload(api, **{"expires_after[anchor]": "created_at",
                                   "expires_after[seconds]": "7200"})

    assert response.status_code == 200, response.content
    file = response.json()
    assert file["expires_at"] - file["created_at"] == 7200
    assert api.get(f"/v1/files/{file['id']}").json()["expires_at"] == file["expires_at"]


def test_an_upload_without_expires_after_keeps_the_server_default(api, settings):
    settings.BATCHGEN_FILE_EXPIRY_DAYS = 2
    file = post_upload(api).json()
    assert file["expires_at"] - file["created_at"] == 2 * 86400


@pytest.mark.parametrize(("fields", "param"), [
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "3599"},
     "expires_after.seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592001"},
     "expires_after.seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "soon"},
     "expires_after.seconds"),
    ({"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"},
     "expires_after.anchor"),
    ({"expires_after[seconds]": "3600"}, "expires_after.anchor"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600",
      "expires_after[minutes]": "5"}, "expires_after"),
])
def test_a_bad_expires_after_is_a_400_naming_the_field(api, storage, fields, param):
    response = post_upload(api, **fields)

    error = assert_envelope(response, 400, param=param)
    assert File.objects.count() == 0
    assert not any((storage / "uploads").glob("file-*"))
    assert "expires_after" in error["message"]


def test_the_bounds_are_the_servers_settings(api, settings):
    settings.BATCHGEN_MIN_FILE_EXPIRY_SECONDS = 60
    settings.BATCHGEN_MAX_FILE_EXPIRY_SECONDS = 120
    ok = post_upload(api, **{"expires_after[anchor]": "created_at",
                             "expires_after[seconds]": "60"})
    too_long = post_upload(api, **{"expires_after[anchor]": "created_at",
                                   "expires_after[seconds]": "3600"})

    assert ok.status_code == 200
    error = assert_envelope(too_long, 400, param="expires_after.seconds")
    assert "between 60 and 120" in error["message"]


def test_batch_create_with_output_expires_after_is_kept_on_the_batch(api, upload, published):
    file = upload(CONTENT)
    response = api.post("/v1/batches", {
        "input_file_id": file["id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "output_expires_after": {"anchor": "created_at", "seconds": 86400}}, format="json")

    assert response.status_code == 200, response.content
    assert Batch.objects.get(id=response.json()["id"]).output_expires_after_seconds == 86400


@pytest.mark.parametrize(("policy", "param"), [
    ({"anchor": "created_at", "seconds": 60}, "output_expires_after.seconds"),
    ({"anchor": "created_at", "seconds": 10**12}, "output_expires_after.seconds"),
    ({"anchor": "created_at"}, "output_expires_after.seconds"),
    ({"anchor": "now", "seconds": 3600}, "output_expires_after.anchor"),
    ("3600", "output_expires_after"),
])
def test_a_bad_output_expires_after_is_a_400_and_no_batch(api, upload, published, policy,
                                                          param):
    file = upload(CONTENT)
    response = api.post("/v1/batches", {"input_file_id": file["id"],
                                        "endpoint": "/v1/chat/completions",
                                        "output_expires_after": policy}, format="json")

    assert_envelope(response, 400, param=param)
    assert Batch.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_the_output_file_expires_as_the_batch_asked_and_the_purge_honours_it(
        runtime_factory, upload, settings, django_capture_on_commit_callbacks):
    # Given: a batch whose output should live an hour, run and finalized
    settings.BATCHGEN_CHUNK_SIZE = 2
    file = upload(CONTENT)
    batch = services.batch_create(input_file_id=file["id"], endpoint="/v1/chat/completions",
                                  model="sim", output_expires_after_seconds=3600)
    services.batch_validate(batch_id=batch.id)
    runtime = runtime_factory()
    for chunk in Chunk.objects.filter(batch=batch):
        runtime.run_chunk(chunk.id)
    batch = services.batch_finalize(batch_id=batch.id)
    output = batch.output_file
    assert batch.status == BatchStatus.COMPLETED
    assert output.expires_at == output.created_at + timedelta(seconds=3600)

    # When: an hour and a bit later, the purge runs
    File.objects.filter(id=output.id).update(
        created_at=output.created_at - timedelta(hours=2),
        expires_at=timezone.now() - timedelta(minutes=1))
    with django_capture_on_commit_callbacks(execute=True):
        purged = files_purge()

    # Then: the output is gone, the input (default expiry, 30 days) stays
    assert purged == 1
    assert not File.objects.filter(id=output.id).exists()
    assert File.objects.filter(id=file["id"]).exists()


def test_the_purge_keeps_a_short_lived_input_file_while_its_batch_runs(
        batch_in_progress, published, django_capture_on_commit_callbacks):
    batch = batch_in_progress(4, chunk_size=2)
    File.objects.filter(id=batch.input_file_id).update(
        expires_at=timezone.now() - timedelta(seconds=1))

    with django_capture_on_commit_callbacks(execute=True):
        assert files_purge() == 0

    assert File.objects.filter(id=batch.input_file_id).exists()
