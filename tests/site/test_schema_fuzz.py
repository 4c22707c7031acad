"""Schema fuzzing: schemathesis generates requests for every operation in
/v1/openapi.json (valid ones, and invalid ones where the schema says what is valid),
sends them to the Django app in-process over WSGI, and checks each answer:

- not_a_server_error: no 5xx, whatever was sent;
- status_code_conformance: every status is one the schema declares for the operation;
- content_type_conformance: the answer's media type is the declared one;
- response_schema_conformance: the body matches the declared schema (the error
  envelope included).

Each operation is its own test item with its own database (pytest-django) and storage
path, seeded with files, batches of several statuses and a live worker, so detail
endpoints and lists answer real objects as well as 404s.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from batches.models import Batch, BatchStatus
from batchgen_site.wsgi import application
from core.ids import new_id
from files.models import File, FilePurpose, FileStatus
from fleet.models import Worker
from serving.model_info import served_model
from tests.conftest import chat_line, jsonl
from webhooks import sender
from webhooks.models import WebhookEndpoint
from webhooks.signing import new_secret

pytestmark = pytest.mark.django_db

# Generated requests per operation in the fuzzing phase (the examples and coverage
# phases add their own, a few dozen at most): the 15 operations take about 10 s on
# two cores, well inside a minute when the machine is loaded. The fixed seed makes a
# failure replay.
MAX_EXAMPLES = 40
CONFIG = schemathesis.Config.from_dict({
    "seed": 20261130,
    # Random Authorization headers would turn most requests into 401s; keys and
    # their refusals are tests/site/test_auth.py's subject.
    # No example database: runs depend on the seed alone and write nothing to the tree.
    "generation": {"max-examples": MAX_EXAMPLES, "with-security-parameters": False,
                   "database": "none"},
    "phases": {"stateful": {"enabled": False}},  # one request at a time, per operation
})
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]

schema = schemathesis.openapi.from_wsgi("/v1/openapi.json", application, config=CONFIG)

# Objects every test item starts with, under fixed ids the generator also uses.
INPUT_FILE = "file-fuzzinput0000000000000"
FREE_FILE = "file-fuzzfree00000000000000"
OUTPUT_FILE = "file-fuzzoutput000000000000"
VALIDATING = "batch_fuzzvalidating0000000"
FAILED = "batch_fuzzfailed00000000000"
COMPLETED = "batch_fuzzcompleted00000000"
RESPONSES = "batch_fuzzresponses00000000"  # a /v1/responses batch, running
FRESH_FILE = "file-fresh"  # stands for a new file with no batch yet
WEBHOOK_ENDPOINT = "we_fuzzendpoint00000000000"
KNOWN_IDS = {
    "file_id": [INPUT_FILE, FREE_FILE, OUTPUT_FILE],
    "batch_id": [VALIDATING, FAILED, COMPLETED, RESPONSES],
    "endpoint_id": [WEBHOOK_ENDPOINT],
}


@schema.hook
def flatmap_path_parameters(context, path_parameters):
    """Half the time, an id that exists: generated ids alone would only meet 404s."""
    for name, known in KNOWN_IDS.items():
        if isinstance(path_parameters, dict) and name in path_parameters:
            return st.one_of(st.just(path_parameters),
                             st.sampled_from(known).map(lambda v, n=name: {
                                 **path_parameters, n: v}))
    if isinstance(path_parameters, dict) and "model_id" in path_parameters:
        return st.one_of(st.just(path_parameters),
                         st.just({**path_parameters, "model_id": served_model().id}))
    return st.just(path_parameters)


@schema.hook
def flatmap_body(context, body):
    """For batch creation, often an input file that exists, so that the generated
    parameters reach the service and the created batch is rendered: a fresh file
    (FRESH_FILE, replaced just before the call), one with an active batch already,
    or an output file."""
    if context.operation.label == "POST /v1/batches" and isinstance(body, dict):
        return st.one_of(st.just(body),
                         st.sampled_from([FRESH_FILE, FRESH_FILE, INPUT_FILE, OUTPUT_FILE])
                         .map(lambda file_id: {**body, "input_file_id": file_id}))
    return st.just(body)


def response_line(custom_id: str) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses",
            "body": {"model": "m", "instructions": "Be brief.",
                     "input": [{"role": "user", "content": [{"type": "input_text",
                                                              "text": "Hello"}]}],
                     "text": {"format": {"type": "json_object"}}, "max_output_tokens": 8}}


def fresh_line(endpoint: str | None) -> dict:
    """A good line of a batch of `endpoint` (its url, a body of its shape)."""
    if endpoint == "/v1/responses":
        return response_line("a")
    if endpoint in ("/v1/score", "/score"):
        return {"custom_id": "a", "method": "POST", "url": endpoint,
                "body": {"model": "m", "queries": "q", "documents": ["x", "y"]}}
    if endpoint in ("/v1/rerank", "/rerank"):
        return {"custom_id": "a", "method": "POST", "url": endpoint,
                "body": {"model": "m", "query": "q", "documents": ["x", "y"], "top_n": 1}}
    return chat_line("a")


@pytest.fixture(autouse=True)
def keep_the_test_connection():
    """The WSGI handler closes the database connection at the end of each request, as it
    must in production; in a test that would end the test's transaction. Django's own
    test client turns this off the same way."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def _file(file_id: str, purpose: str, content: bytes, storage) -> File:
    name = f"uploads/{file_id}.jsonl"
    (storage / name).write_bytes(content)
    return File.objects.create(id=file_id, purpose=purpose, filename=f"{file_id}.jsonl",
                               bytes=len(content), checksum="sha256:" + "0" * 64,
                               status=FileStatus.UPLOADED, storage_name=name)


@pytest.fixture(autouse=True)
def seeded(storage, published):
    content = jsonl([chat_line("a"), chat_line("b")])
    input_file = _file(INPUT_FILE, FilePurpose.BATCH, content, storage)
    _file(FREE_FILE, FilePurpose.BATCH, content, storage)
    output = _file(OUTPUT_FILE, FilePurpose.BATCH_OUTPUT, b'{"custom_id": "a"}\n', storage)
    now = timezone.now()
    common = {"endpoint": "/v1/chat/completions", "model": served_model().id,
              "input_file": input_file, "expires_at": now + timedelta(hours=24)}
    Batch.objects.create(id=VALIDATING, status=BatchStatus.VALIDATING,
                         metadata={"team": "fuzz"}, temperature=0.5, top_k=40, **common)
    Batch.objects.create(
        id=FAILED, status=BatchStatus.FAILED, failed_at=now,
        error={"code": "invalid_input", "message": "1 input line(s) failed validation."},
        errors=[{"code": "invalid_json", "message": "Line is not valid JSON.", "line": 2,
                 "param": None}], **common)
    Batch.objects.create(id=COMPLETED, status=BatchStatus.COMPLETED, output_file=output,
                         in_progress_at=now, finalizing_at=now, completed_at=now, total=1,
                         completed=1, **common)
    (storage / "incremental" / f"{COMPLETED}.jsonl").write_bytes(b'{"custom_id": "a"}\n')
    responses_file = _file("file-fuzzresponses000000000", FilePurpose.BATCH,
                           jsonl([response_line("a")]), storage)
    Batch.objects.create(id=RESPONSES, status=BatchStatus.IN_PROGRESS, in_progress_at=now,
                         total=1, **{**common, "endpoint": "/v1/responses",
                                     "input_file": responses_file})
    WebhookEndpoint.objects.create(id=WEBHOOK_ENDPOINT, url="http://127.0.0.1:9/hook",
                                   secret=new_secret())
    Worker.objects.create(name="fuzz-worker", hostname="h", pid=1, engine="simulated",
                          model=served_model().id, slots_capacity=4, ready=True,
                          heartbeat_at=timezone.now() + timedelta(days=1))


@pytest.fixture(autouse=True)
def no_webhook_traffic(monkeypatch):
    """The fuzzer may point an endpoint at any URL and then test it: answer for the
    receiver here, so no generated request leaves the machine."""
    monkeypatch.setattr(sender, "post", lambda client, attempt: sender.Outcome(204))


@schema.parametrize()
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
          deadline=None)
def test_every_answer_is_declared_and_none_is_a_server_error(case, storage):
    if isinstance(case.body, dict) and case.body.get("input_file_id") == FRESH_FILE:
        # A line of the batch's endpoint: a /v1/responses batch gets a Response body,
        # a score or rerank batch a body of theirs.
        fresh = fresh_line(case.body.get("endpoint"))
        case.body["input_file_id"] = _file(new_id("file-"), FilePurpose.BATCH,
                                           jsonl([fresh]), storage).id
    case.call_and_validate(checks=CHECKS)

