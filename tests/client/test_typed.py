"""The typed layer (client.files / .batches / .models / .pool / .webhook_endpoints)
against a scripted HTTP server: typed objects that also read as the server's JSON,
cursor pages that walk every page, openai-python's error names."""

import io
import json
import subprocess
import sys

import pytest

import batchgen
from batchgen import (
    APIStatusError,
    BadRequestError,
    BatchFailedError,
    CursorPage,
    InternalServerError,
    NotFoundError,
    ServerError,
    UnprocessableEntityError,
    WaitTimeoutError,
)
from batchgen.types import (
    Batch,
    BatchError,
    BatchUsage,
    FileDeleted,
    FileObject,
    Model,
    PoolStatus,
    RequestCounts,
    WebhookEndpoint,
    WebhookEndpointWithSecret,
)

from .stub import Reply, error, make_batch, make_file, result_line

USAGE = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4},
         "output_tokens": 6, "output_tokens_details": {"reasoning_tokens": 0},
         "total_tokens": 16}


# -- objects: attributes, item access, forward compatibility ----------------------------


def test_retrieve_returns_a_typed_batch_with_nested_objects(stub, client):
    stub.on("GET", "/v1/batches/batch_1", Reply(json=make_batch(
        completed=2, failed=1, usage=USAGE,
        error={"code": "batch_failed", "message": "boom", "line": None, "param": None})))

    batch = client.batches.retrieve("batch_1")

    assert isinstance(batch, Batch)
    assert batch.id == "batch_1" and batch.status == "in_progress"
    assert isinstance(batch.request_counts, RequestCounts)
    assert (batch.request_counts.total, batch.request_counts.completed,
            batch.request_counts.failed) == (3, 2, 1)
    assert isinstance(batch.usage, BatchUsage)
    assert batch.usage.input_tokens_details.cached_tokens == 4
    assert isinstance(batch.error, BatchError) and batch.error.code == "batch_failed"
    assert batch.errors is None and batch.output_file_id is None


def test_a_typed_object_reads_as_the_json_the_server_sent(stub, client):
    sent = make_batch(usage=USAGE)
    stub.on("GET", "/v1/batches/batch_1", Reply(json=sent))

    batch = client.batches.retrieve("batch_1")

    # The guide's spelling keeps working on the typed object.
    assert batch["status"] == "in_progress"
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    assert batch.get("output_file_id") is None and batch.get("nope", 7) == 7
    assert "status" in batch and "nope" not in batch
    assert dict(batch) == sent and batch.to_dict() == sent and batch == sent
    assert json.loads(json.dumps(batch.to_dict())) == sent
    # to_dict is a copy: changing it leaves the object alone.
    batch.to_dict()["request_counts"]["total"] = 99
    assert batch["request_counts"]["total"] == 3


def test_unknown_fields_are_kept_and_missing_ones_are_none(stub, client):
    sent = {"id": "batch_1", "status": "completed", "priority_lane": "gold"}
    stub.on("GET", "/v1/batches/batch_1", Reply(json=sent))

    batch = client.batches.retrieve("batch_1")

    assert batch.status == "completed"
    assert batch["priority_lane"] == "gold" and batch.to_dict() == sent
    assert batch.request_counts is None and batch.usage is None and batch.model is None


def test_the_guide_methods_still_return_plain_dicts(stub, client):
    stub.on("GET", "/v1/batches/batch_1", Reply(json=make_batch()))

    assert type(client.get_batch("batch_1")) is dict


# -- files ------------------------------------------------------------------------------


def test_files_create_from_a_path_sends_expires_after_as_the_sdk_does(stub, client, tmp_path):
    path = tmp_path / "input.jsonl"
    path.write_bytes(b'{"custom_id": "a"}\n')
    stub.on("POST", "/v1/files", Reply(json=make_file(size=19)))

    file_obj = client.files.create(path, purpose="batch",
                                   expires_after={"anchor": "created_at", "seconds": 86400})

    assert isinstance(file_obj, FileObject)
    assert (file_obj.id, file_obj.bytes, file_obj["id"]) == ("file-in", 19, "file-in")
    form = stub.requests[0].multipart()
    assert form["file"] == ("input.jsonl", b'{"custom_id": "a"}\n')
    assert form["expires_after[anchor]"] == (None, b"created_at")
    assert form["expires_after[seconds]"] == (None, b"86400")


def test_files_create_from_an_open_file_sends_it_whole_again_on_a_retry(stub, client):
    fh = io.BytesIO(b'{"custom_id": "a"}\n{"custom_id": "b"}\n')
    fh.name = "/somewhere/mine.jsonl"
    stub.on("POST", "/v1/files", error(429, "busy", headers={"Retry-After": "1"}),
            Reply(json=make_file()))

    client.files.create(fh)

    sent = [r.multipart()["file"] for r in stub.requests_to("POST", "/v1/files")]
    assert sent == [("mine.jsonl", fh.getvalue())] * 2


def test_files_create_refuses_an_anchor_the_server_does_not_have(client, tmp_path):
    with pytest.raises(ValueError, match="created_at"):
        client.files.create(tmp_path / "x.jsonl", expires_after={"anchor": "now", "seconds": 1})


def test_files_retrieve_delete_and_content(stub, client, tmp_path):
    stub.on("GET", "/v1/files/file-in", Reply(json=make_file()))
    stub.on("DELETE", "/v1/files/file-in",
            Reply(json={"id": "file-in", "object": "file", "deleted": True}))
    stub.on("GET", "/v1/files/file-out/content", Reply(body=result_line("a")))

    assert client.files.retrieve("file-in").filename == "input.jsonl"
    deleted = client.files.delete("file-in")
    assert isinstance(deleted, FileDeleted) and deleted.deleted is True
    content = client.files.content("file-out")
    assert content.content == result_line("a")
    assert json.loads(content.text)["custom_id"] == "a"
    content.write_to_file(tmp_path / "out.jsonl")
    assert (tmp_path / "out.jsonl").read_bytes() == result_line("a")
    assert client.files.download("file-out", tmp_path / "dl.jsonl").read_bytes() == \
        result_line("a")


# -- cursor pages -------------------------------------------------------------------------


def _page(ids, *, has_more):
    return {"object": "list", "data": [make_batch(i) for i in ids], "has_more": has_more,
            "first_id": ids[0] if ids else None, "last_id": ids[-1] if ids else None}


def test_iterating_a_list_walks_every_page_by_its_last_id(stub, client):
    stub.on("GET", "/v1/batches", Reply(json=_page(["b5", "b4"], has_more=True)),
            Reply(json=_page(["b3", "b2"], has_more=True)),
            Reply(json=_page(["b1"], has_more=False)))

    page = client.batches.list(limit=2)

    assert isinstance(page, CursorPage)
    assert [b.id for b in page.data] == ["b5", "b4"] and page.has_more
    assert len(stub.requests) == 1  # the next pages are fetched only when reached
    batches = list(page)
    assert [b.id for b in batches] == ["b5", "b4", "b3", "b2", "b1"]
    assert all(isinstance(b, Batch) for b in batches)
    assert [r.query for r in stub.requests] == [
        {"limit": ["2"]},
        {"limit": ["2"], "after": ["b4"]},
        {"limit": ["2"], "after": ["b2"]},
    ]
    # The page also reads as its JSON.
    assert page["has_more"] is True and dict(page)["last_id"] == "b4"


def test_get_next_page_and_the_last_page(stub, client):
    stub.on("GET", "/v1/files", Reply(json={
        "object": "list", "data": [make_file("file-2")], "has_more": True,
        "first_id": "file-2", "last_id": "file-2"}), Reply(json={
        "object": "list", "data": [make_file("file-1")], "has_more": False,
        "first_id": "file-1", "last_id": "file-1"}))

    first = client.files.list(purpose="batch", limit=1)
    second = first.get_next_page()

    assert [f.id for f in second.data] == ["file-1"]
    assert stub.requests[1].query == {"purpose": ["batch"], "limit": ["1"], "after": ["file-2"]}
    assert not second.has_next_page()
    with pytest.raises(RuntimeError, match="no next page"):
        second.get_next_page()


def test_batch_errors_page_by_line_number(stub, client):
    def errors_page(lines, has_more):
        return {"object": "list", "has_more": has_more, "total": 3, "data": [
            {"code": "invalid_json", "message": "bad", "line": n, "param": None} for n in lines]}

    stub.on("GET", "/v1/batches/batch_1/errors", Reply(json=errors_page([2, 5], True)),
            Reply(json=errors_page([9], False)))

    page = client.batches.errors("batch_1", limit=2)

    assert page.total == 3
    assert [(e.line, e.code) for e in page] == [(2, "invalid_json"), (5, "invalid_json"),
                                               (9, "invalid_json")]
    assert stub.requests[1].query == {"limit": ["2"], "after": ["5"]}


# -- batches ----------------------------------------------------------------------------


def test_batches_create_sends_the_options_the_sdk_names(stub, client):
    stub.on("POST", "/v1/batches", Reply(json=make_batch(status="validating")))

    batch = client.batches.create(input_file_id="file-in", endpoint="/v1/responses",
                                  max_decoding_length=64, metadata={"run": "3"},
                                  output_expires_after={"anchor": "created_at",
                                                        "seconds": 604800})

    assert batch.status == "validating"
    assert stub.requests[0].json() == {
        "input_file_id": "file-in", "endpoint": "/v1/responses", "completion_window": "24h",
        "metadata": {"run": "3"}, "max_decoding_length": 64,
        "output_expires_after": {"anchor": "created_at", "seconds": 604800}}


def test_batches_cancel_wait_and_results(stub, client):
    done = make_batch(status="completed", completed=3, output_file_id="file-out")
    stub.on("POST", "/v1/batches/batch_1/cancel", Reply(json=make_batch(status="cancelling")))
    stub.on("GET", "/v1/batches/batch_1", Reply(json=make_batch()), Reply(json=done))
    stub.on("GET", "/v1/files/file-out/content", Reply(body=result_line("a") + result_line("b")))

    assert client.batches.cancel("batch_1").status == "cancelling"
    batch = client.batches.wait("batch_1", poll_interval=1)
    assert isinstance(batch, Batch) and batch.output_file_id == "file-out"
    # A typed batch is accepted wherever the guide's dict was.
    assert [r["custom_id"] for r in client.batches.results(batch)] == ["a", "b"]
    assert [r["custom_id"] for r in client.iter_results(batch)] == ["a", "b"]


def test_batches_wait_raises_with_a_typed_batch(stub, client):
    failed = make_batch(status="failed", output_file_id="file-partial",
                        error={"code": "batch_failed", "message": "boom"})
    stub.on("GET", "/v1/batches/batch_1", Reply(json=failed))
    stub.on("GET", "/v1/batches/batch_2", Reply(json=make_batch("batch_2")))

    with pytest.raises(BatchFailedError) as caught:
        client.batches.wait("batch_1")
    assert isinstance(caught.value.batch, Batch)
    assert caught.value.batch.error.code == "batch_failed"
    assert caught.value.batch["output_file_id"] == "file-partial"
    assert "batch_failed: boom" in str(caught.value)

    with pytest.raises(WaitTimeoutError) as caught:
        client.batches.wait("batch_2", poll_interval=1, timeout=3)
    assert isinstance(caught.value.batch, Batch) and caught.value.batch.status == "in_progress"


# -- models, pool, webhook endpoints ----------------------------------------------------


def test_models_and_pool_status(stub, client):
    model = {"id": "m", "object": "model", "created": 1, "owned_by": "batchgen",
             "max_context_length": 2048, "engine": "vllm", "endpoints": ["/v1/chat/completions"],
             "live": True, "workers": 1, "root": "m", "parent": None}
    stub.on("GET", "/v1/models", Reply(json={"object": "list", "data": [model],
                                             "has_more": False, "first_id": "m",
                                             "last_id": "m"}))
    stub.on("GET", "/v1/models/m", Reply(json=model))
    stub.on("GET", "/v1/pool/status", Reply(json={
        "intake_pool_size": 5, "intake_pool_capacity": 100, "active_batches": 1,
        "models": [{"model": "m", "workers": 1, "requests_waiting": 5,
                    "scheduling_pool_token_budget": None}]}))

    assert [m.id for m in client.models.list()] == ["m"]
    retrieved = client.models.retrieve("m")
    assert isinstance(retrieved, Model) and retrieved.endpoints == ["/v1/chat/completions"]
    pool = client.pool.status()
    assert isinstance(pool, PoolStatus)
    assert pool.intake_pool_size == 5 and pool.models[0].requests_waiting == 5


def test_webhook_endpoints(stub, client):
    endpoint = {"id": "we_1", "object": "webhook_endpoint", "url": "https://x.test/hook",
                "name": "", "event_types": ["batch.completed"], "created_at": 1,
                "updated_at": 1, "signing_secret_hint": "whsec_ab...", "enabled": True,
                "disabled_reason": ""}
    stub.on("POST", "/v1/webhook_endpoints",
            Reply(json={**endpoint, "signing_secret": "whsec_secret"}))
    stub.on("GET", "/v1/webhook_endpoints", Reply(json={
        "object": "list", "data": [endpoint], "has_more": False, "first_id": "we_1",
        "last_id": "we_1"}))
    stub.on("POST", "/v1/webhook_endpoints/we_1/test", Reply(json={
        "object": "webhook_endpoint.test_result", "webhook_endpoint_id": "we_1",
        "event_type": "batch.completed", "status_code": 204, "success": True}))

    created = client.webhook_endpoints.create(url="https://x.test/hook")
    assert isinstance(created, WebhookEndpointWithSecret)
    assert isinstance(created, WebhookEndpoint) and created.signing_secret == "whsec_secret"
    assert [e.url for e in client.webhook_endpoints.list()] == ["https://x.test/hook"]
    assert client.webhook_endpoints.test("we_1").status_code == 204


# -- errors -------------------------------------------------------------------------------


def test_openai_error_names_are_the_same_classes():
    assert APIStatusError is batchgen.APIError
    assert InternalServerError is ServerError
    assert issubclass(NotFoundError, APIStatusError)


@pytest.mark.parametrize("status, cls", [(404, NotFoundError), (422, UnprocessableEntityError),
                                         (400, BadRequestError), (500, InternalServerError)])
def test_typed_resources_raise_typed_errors_with_the_envelope(stub, client, status, cls):
    stub.on("GET", "/v1/batches/batch_x",
            error(status, "nope", param="batch_id", code="not_found"))

    with pytest.raises(cls) as caught:
        client.batches.retrieve("batch_x")

    assert isinstance(caught.value, APIStatusError)
    assert (caught.value.status_code, caught.value.code, caught.value.param,
            caught.value.message) == (status, "not_found", "batch_id", "nope")


def test_the_client_imports_without_the_server_packages():
    """The client may be installed alone: nothing of it imports Django, DRF or pydantic."""
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in {'django', 'rest_framework', 'drf_spectacular',"
        " 'pydantic', 'vllm'}:\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import batchgen, batchgen.cli, batchgen.types, batchgen.resources\n"
        "print(batchgen.BatchGenHttpClient('http://127.0.0.1:9').batches.list)\n"
    )
    done = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
