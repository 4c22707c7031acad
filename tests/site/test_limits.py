"""Every size limit is a setting, and going over one is refused with a message that
names the limit and the setting that raises it; at the limit is accepted.

| Limit                         | Setting (environment)              | Over it              |
|-------------------------------|------------------------------------|----------------------|
| upload size                   | BATCHGEN_MAX_UPLOAD_BYTES          | 413 file_too_large   |
| line size                     | BATCHGEN_MAX_LINE_BYTES            | line_too_long        |
| requests per batch            | BATCHGEN_MAX_REQUESTS_PER_BATCH    | too_many_requests    |
| metadata keys                 | BATCHGEN_MAX_METADATA_KEYS         | 400 metadata         |
| metadata key length           | BATCHGEN_MAX_METADATA_KEY_CHARS    | 400 metadata         |
| metadata value length         | BATCHGEN_MAX_METADATA_VALUE_CHARS  | 400 metadata.<key>   |
| request body (JSON, fields)   | BATCHGEN_MAX_REQUEST_BODY_BYTES    | 413 request_too_large|
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from batches import services
from batches.models import Batch, Chunk
from files.models import File
from tests.conftest import chat_line, jsonl
from tests.files.helpers import MULTIPART, multipart
from tests.files.test_api import assert_envelope

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def create(api, **body):
    return api.post("/v1/batches", body, format="json")


def validated(api, upload, content: bytes) -> dict:
    """Upload `content`, create a batch on it, validate it; the batch as the API shows it."""
    batch = create(api, input_file_id=upload(content)["id"]).json()
    services.batch_validate(batch_id=batch["id"])
    return api.get(f"/v1/batches/{batch['id']}").json()


def names_limit(message: str, limit: int, setting: str) -> bool:
    return str(limit) in message and setting in message


# --- upload size -----------------------------------------------------------------------------


def test_upload_over_the_limit_is_413_naming_the_limit_and_its_setting(api, settings, storage):
    settings.BATCHGEN_MAX_UPLOAD_BYTES = 100
    body = multipart(fields={"purpose": "batch"}, files=[("file", "in.jsonl", b"x" * 101)])

    response = api.generic("POST", "/v1/files", body, content_type=MULTIPART)

    error = assert_envelope(response, 413, param="file", code="file_too_large")
    assert names_limit(error["message"], 100, "BATCHGEN_MAX_UPLOAD_BYTES")
    assert File.objects.count() == 0
    assert list((storage / "uploads").iterdir()) == []


def test_upload_at_the_limit_is_stored(upload, settings):
    settings.BATCHGEN_MAX_UPLOAD_BYTES = 100

    assert upload(b"x" * 100)["bytes"] == 100


# --- line size -------------------------------------------------------------------------------


def line_of(size: int, custom_id: str) -> bytes:
    """A valid chat line of exactly `size` bytes (the newline not counted)."""
    line = json.dumps(chat_line(custom_id, "")).encode()
    return json.dumps(chat_line(custom_id, "x" * (size - len(line)))).encode()


def test_line_over_the_limit_fails_the_batch_naming_the_limit_and_its_setting(
        api, upload, settings, published):
    settings.BATCHGEN_MAX_LINE_BYTES = 300
    content = jsonl([line_of(300, "at-limit"), line_of(301, "over"), chat_line("after")])

    batch = validated(api, upload, content)

    assert batch["status"] == "failed"
    [error] = batch["errors"]["data"]
    assert (error["code"], error["line"]) == ("line_too_long", 2)
    assert names_limit(error["message"], 300, "BATCHGEN_MAX_LINE_BYTES")


def test_lines_at_the_limit_validate(api, upload, settings, published):
    settings.BATCHGEN_MAX_LINE_BYTES = 300

    batch = validated(api, upload, jsonl([line_of(300, "a"), line_of(300, "b")]))

    assert batch["status"] == "in_progress", batch["errors"]
    assert batch["request_counts"]["total"] == 2


# --- requests per batch ----------------------------------------------------------------------


def test_more_requests_than_allowed_fails_the_batch_and_queues_nothing(
        api, upload, settings, published):
    settings.BATCHGEN_MAX_REQUESTS_PER_BATCH = 3

    batch = validated(api, upload, jsonl([chat_line(f"r{i}") for i in range(5)]))

    assert batch["status"] == "failed"
    [error] = batch["errors"]["data"]
    assert (error["code"], error["line"]) == ("too_many_requests", 4)
    assert names_limit(error["message"], 3, "BATCHGEN_MAX_REQUESTS_PER_BATCH")
    assert Chunk.objects.count() == 0


def test_exactly_the_allowed_number_of_requests_validates(api, upload, settings, published):
    settings.BATCHGEN_MAX_REQUESTS_PER_BATCH = 3

    batch = validated(api, upload, jsonl([chat_line(f"r{i}") for i in range(3)]))

    assert batch["status"] == "in_progress"
    assert batch["request_counts"]["total"] == 3


# --- metadata --------------------------------------------------------------------------------


@pytest.fixture
def input_file_id(upload) -> str:
    return upload(jsonl([chat_line("a")]))["id"]


@pytest.mark.parametrize("setting, limit, over, at, param", [
    ("BATCHGEN_MAX_METADATA_KEYS", 2, {"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "2"},
     "metadata"),
    ("BATCHGEN_MAX_METADATA_KEY_CHARS", 4, {"abcde": "v"}, {"abcd": "v"}, "metadata"),
    ("BATCHGEN_MAX_METADATA_VALUE_CHARS", 5, {"k": "v" * 6}, {"k": "v" * 5}, "metadata.k"),
], ids=["keys", "key-chars", "value-chars"])
def test_metadata_over_each_limit_is_400_naming_it_and_at_the_limit_is_kept(
        api, input_file_id, settings, published, setting, limit, over, at, param):
    setattr(settings, setting, limit)

    refused = create(api, input_file_id=input_file_id, metadata=over)
    accepted = create(api, input_file_id=input_file_id, metadata=at)

    error = assert_envelope(refused, 400, param=param, code="metadata_too_large")
    assert names_limit(error["message"], limit, setting)
    assert accepted.status_code == 200, accepted.content
    assert accepted.json()["metadata"] == at
    assert Batch.objects.count() == 1


# --- request body ----------------------------------------------------------------------------


def test_json_body_over_the_limit_is_413_naming_the_limit_and_its_setting(api, settings,
                                                                          published):
    # BATCHGEN_MAX_REQUEST_BODY_BYTES sets Django's DATA_UPLOAD_MAX_MEMORY_SIZE at start-up.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = json.dumps({"input_file_id": "file-x", "metadata": {"k": "v" * 1000}})

    response = api.post("/v1/batches", data=body, content_type="application/json")

    error = assert_envelope(response, 413, param=None, code="request_too_large")
    assert names_limit(error["message"], 1000, "BATCHGEN_MAX_REQUEST_BODY_BYTES")
    assert Batch.objects.count() == 0


def test_json_body_at_the_limit_is_read(api, input_file_id, settings, published):
    body = json.dumps({"input_file_id": input_file_id, "metadata": {"k": ""}})
    body = body.replace('"k": ""', '"k": "' + "v" * (200 - len(body)) + '"')
    assert len(body) == 200
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 200
    settings.BATCHGEN_MAX_METADATA_VALUE_CHARS = 200

    response = api.post("/v1/batches", data=body, content_type="application/json")

    assert response.status_code == 200, response.content


def test_oversized_form_field_of_an_upload_is_413_too(api, settings, storage):
    # The file part streams to disk under its own limit; other fields are read into
    # memory and fall under the request-body limit.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = multipart(fields={"purpose": "batch" + " " * 2000},
                     files=[("file", "in.jsonl", jsonl([chat_line("a")]))])

    response = api.generic("POST", "/v1/files", body, content_type=MULTIPART)

    error = assert_envelope(response, 413, code="request_too_large")
    assert "BATCHGEN_MAX_REQUEST_BODY_BYTES" in error["message"]
    assert File.objects.count() == 0
    assert list((storage / "uploads").iterdir()) == []


# --- every limit comes from the environment ----------------------------------------------------


def test_every_limit_is_read_from_the_environment(tmp_path):
    env = {**os.environ, "BATCHGEN_STORAGE_PATH": str(tmp_path),
           "DJANGO_SETTINGS_MODULE": "batchgen_site.settings",
           "BATCHGEN_MAX_UPLOAD_BYTES": "11", "BATCHGEN_MAX_LINE_BYTES": "12",
           "BATCHGEN_MAX_REQUESTS_PER_BATCH": "13", "BATCHGEN_MAX_METADATA_KEYS": "14",
           "BATCHGEN_MAX_METADATA_KEY_CHARS": "15", "BATCHGEN_MAX_METADATA_VALUE_CHARS": "16",
           "BATCHGEN_MAX_REQUEST_BODY_BYTES": "17", "BATCHGEN_MIN_FILE_EXPIRY_SECONDS": "18",
           "BATCHGEN_MAX_FILE_EXPIRY_SECONDS": "19"}
    names = ["BATCHGEN_MAX_UPLOAD_BYTES", "BATCHGEN_MAX_LINE_BYTES",
             "BATCHGEN_MAX_REQUESTS_PER_BATCH", "BATCHGEN_MAX_METADATA_KEYS",
             "BATCHGEN_MAX_METADATA_KEY_CHARS", "BATCHGEN_MAX_METADATA_VALUE_CHARS",
             "BATCHGEN_MAX_REQUEST_BODY_BYTES", "DATA_UPLOAD_MAX_MEMORY_SIZE",
             "BATCHGEN_MIN_FILE_EXPIRY_SECONDS", "BATCHGEN_MAX_FILE_EXPIRY_SECONDS"]
    script = ("import json; from django.conf import settings; "
              f"print(json.dumps([getattr(settings, n) for n in {names!r}]))")

    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60, check=True)

    assert json.loads(result.stdout.strip().splitlines()[-1]) == [11, 12, 13, 14, 15, 16, 17, 17,
                                                                18, 19]
