"""The Files API: /v1/files, /v1/files/{id}, /v1/files/{id}/content."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
from io import BytesIO

import pytest
from django.http import UnreadablePostError

from core.errors import BatchGenError
from files.models import File, FilePurpose
from files.services import file_register_output
from files.upload import StreamingUploadHandler
from tests.conftest import chat_line, jsonl
from tests.files.helpers import MULTIPART, DroppingInput, multipart

pytestmark = pytest.mark.django_db

CONTENT = jsonl([chat_line("a"), chat_line("b"), chat_line("c")])


def assert_envelope(response, status: int, *, param: str | None = ..., code: str | None = ...):
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    if param is not ...:
        assert error["param"] == param
    if code is not ...:
        assert error["code"] == code
    return error


def leftovers(storage) -> list[str]:
    """Everything under uploads/, partial files included."""
    return sorted(p.name for p in (storage / "uploads").iterdir())


def post_raw(api, body: bytes, **extra):
    return api.generic("POST", "/v1/files", body, content_type=MULTIPART, **extra)


# --- upload ---------------------------------------------------------------------------


def test_upload_returns_file_with_size_checksum_and_stores_bytes_under_its_id(upload, storage):
    file = upload(CONTENT, filename="requests.jsonl")

    assert file["id"].startswith("file-")
    assert file["object"] == "file"
    assert file["bytes"] == len(CONTENT)
    assert file["checksum"] == "sha256:" + hashlib.sha256(CONTENT).hexdigest()
    assert file["purpose"] == "batch"
    assert file["status"] == "uploaded"
    assert file["filename"] == "requests.jsonl"
    assert isinstance(file["created_at"], int)
    assert file["expires_at"] is None or file["expires_at"] > file["created_at"]
    assert (storage / "uploads" / f"{file['id']}.jsonl").read_bytes() == CONTENT
    assert leftovers(storage) == [f"{file['id']}.jsonl"]  # no partial left behind


def test_upload_streams_a_file_larger_than_one_read_block(upload, storage):
    # Several 1 MiB handler chunks: size and hash must cover all of them.
    content = jsonl(chat_line(f"id-{i}", "x" * 1000) for i in range(3000))
    assert len(content) > 3 * 1024 * 1024

    file = upload(content)

    assert file["bytes"] == len(content)
    assert file["checksum"] == "sha256:" + hashlib.sha256(content).hexdigest()
    assert (storage / "uploads" / f"{file['id']}.jsonl").read_bytes() == content


def test_upload_creates_the_row_only_after_the_bytes_are_in_place(api, storage, monkeypatch):
    seen: list[bytes] = []
    real_create = File.objects.create

    def create(**fields):
        seen.append((storage / fields["storage_name"]).read_bytes())
        return real_create(**fields)

    monkeypatch.setattr(File.objects, "create", create)
    response = post_raw(api, multipart(fields={"purpose": "batch"},
                                       files=[("file", "in.jsonl", CONTENT)]))

    assert response.status_code == 200, response.content
    assert seen == [CONTENT]


def test_upload_leaves_no_bytes_when_the_row_cannot_be_written(api, storage, monkeypatch):
    def create(**fields):
        raise RuntimeError("database gone")

    monkeypatch.setattr(File.objects, "create", create)
    response = post_raw(api, multipart(fields={"purpose": "batch"},
                                       files=[("file", "in.jsonl", CONTENT)]))

    assert_envelope(response, 500)
    assert leftovers(storage) == []


# --- upload: bad input ----------------------------------------------------------------


def test_upload_without_file_part_is_400(api, storage):
    response = post_raw(api, multipart(fields={"purpose": "batch"}))

    assert_envelope(response, 400, param="file")
    assert File.objects.count() == 0


def test_upload_without_purpose_is_400_and_keeps_no_bytes(api, storage):
    response = post_raw(api, multipart(files=[("file", "in.jsonl", CONTENT)]))

    assert_envelope(response, 400, param="purpose")
    assert File.objects.count() == 0
    assert leftovers(storage) == []


@pytest.mark.parametrize("purpose", ["fine-tune", "batch_output", "batch_error", ""])
def test_upload_with_a_purpose_other_than_batch_is_400(api, storage, purpose):
    response = post_raw(api, multipart(fields={"purpose": purpose},
                                       files=[("file", "in.jsonl", CONTENT)]))

    assert_envelope(response, 400, param="purpose")
    assert File.objects.count() == 0
    assert leftovers(storage) == []


def test_upload_of_an_empty_file_is_400(api, storage):
    response = post_raw(api, multipart(fields={"purpose": "batch"},
                                       files=[("file", "empty.jsonl", b"")]))

    assert_envelope(response, 400, param="file", code="empty_file")
    assert File.objects.count() == 0
    assert leftovers(storage) == []


@pytest.mark.parametrize("pack, kind, unpack", [
    (gzip.compress, "gzip", "gunzip"), (bz2.compress, "bzip2", "bunzip2"),
    (lzma.compress, "xz", "unxz"),
], ids=["gzip", "bzip2", "xz"])
def test_compressed_upload_is_400_saying_what_it_is_and_to_decompress_it(
        api, storage, pack, kind, unpack):
    response = post_raw(api, multipart(fields={"purpose": "batch"},
                                       files=[("file", "in.jsonl.gz", pack(CONTENT))]))

    error = assert_envelope(response, 400, param="file", code="compressed_file")
    assert f"{kind}-compressed" in error["message"]
    assert f"Decompress it first (for example with `{unpack}`)" in error["message"]
    assert File.objects.count() == 0
    assert leftovers(storage) == []


def test_compressed_upload_is_refused_at_its_first_bytes_before_the_rest_is_read(storage):
    """The check runs as the bytes stream in, even when the magic number arrives split
    over two pieces, so a 10 GB archive is not written to disk first."""
    handler = StreamingUploadHandler()
    handler.new_file("file", "in.jsonl.zip", "application/zip", None)
    handler.receive_data_chunk(b"P", 0)

    with pytest.raises(BatchGenError) as refused:
        handler.receive_data_chunk(b"K\x03\x04" + b"\x00" * 1024, 1)

    assert refused.value.code == "compressed_file"
    assert handler.file.tell() == 1  # the rest was never written
    handler.discard()
    assert leftovers(storage) == []


def test_upload_of_text_that_merely_starts_like_a_magic_number_is_stored(upload):
    # "PK" and "BZh" open plenty of text; only the full magic number refuses a file.
    for content in (b"PK is not a zip\n", b"BZh, not bzip2\n"):
        assert upload(content)["bytes"] == len(content)


def test_upload_declaring_more_than_the_limit_is_413_before_reading(api, storage, settings):
    settings.BATCHGEN_MAX_UPLOAD_BYTES = 1000
    body = multipart(fields={"purpose": "batch"},
                     files=[("file", "big.jsonl", b"x" * 200_000)])

    response = post_raw(api, body)

    assert_envelope(response, 413, param="file", code="file_too_large")
    assert File.objects.count() == 0
    assert leftovers(storage) == []  # refused on the header: no partial was even opened


def test_upload_growing_past_the_limit_while_streaming_is_413(api, storage, settings):
    # The declared length is within the multipart allowance, so only the streaming
    # count can notice the file itself is over the limit.
    settings.BATCHGEN_MAX_UPLOAD_BYTES = 1000
    body = multipart(fields={"purpose": "batch"},
                     files=[("file", "big.jsonl", b"x" * 5000)])

    response = post_raw(api, body)

    assert_envelope(response, 413, param="file", code="file_too_large")
    assert File.objects.count() == 0
    assert leftovers(storage) == []


def test_upload_lying_about_its_length_is_still_caught_by_the_streaming_count(
        api, storage, settings):
    # A client that claims a small body but sends a large one: the pre-check passes,
    # and the handler counts the bytes that actually arrive.
    settings.BATCHGEN_MAX_UPLOAD_BYTES = 1000
    content = b"x" * 50_000
    body = multipart(fields={"purpose": "batch"}, files=[("file", "big.jsonl", content)])

    response = post_raw(api, body, CONTENT_LENGTH=str(len(body) - 10),
                        **{"wsgi.input": BytesIO(body)})

    assert_envelope(response, 413, param="file", code="file_too_large")
    assert File.objects.count() == 0
    assert leftovers(storage) == []


def test_upload_exactly_at_the_limit_is_accepted(upload, settings):
    settings.BATCHGEN_MAX_UPLOAD_BYTES = len(CONTENT)

    assert upload(CONTENT)["bytes"] == len(CONTENT)


@pytest.mark.parametrize("sent, shown", [
    ("../../outside.jsonl", "outside.jsonl"),
    ("..\\..\\windows.jsonl", "windows.jsonl"),
    ("/etc/passwd", "passwd"),
    ("dir/sub/in.jsonl", "in.jsonl"),
])
def test_upload_with_a_path_filename_is_stored_under_its_id_and_shown_sanitised(
        api, storage, sent, shown):
    response = post_raw(api, multipart(fields={"purpose": "batch"},
                                       files=[("file", sent, CONTENT)]))

    assert response.status_code == 200, response.content
    file = response.json()
    assert file["filename"] == shown
    assert "/" not in file["filename"] and "\\" not in file["filename"]
    assert leftovers(storage) == [f"{file['id']}.jsonl"]
    assert not (storage.parent / "outside.jsonl").exists()
    assert not (storage / "outside.jsonl").exists()


def test_upload_named_dot_dot_is_refused_not_stored_anywhere(api, storage):
    response = post_raw(api, multipart(fields={"purpose": "batch"},
                                       files=[("file", "..", CONTENT)]))

    assert_envelope(response, 400, param="file")
    assert File.objects.count() == 0
    assert leftovers(storage) == []


@pytest.mark.parametrize("error", [
    OSError("connection reset by peer"),
    UnreadablePostError("client went away"),
], ids=["oserror", "unreadable-post"])
def test_client_disconnecting_mid_upload_leaves_no_row_and_no_bytes(api, storage, error):
    content = jsonl(chat_line(f"id-{i}", "x" * 1000) for i in range(3000))  # > 3 MiB
    body = multipart(fields={"purpose": "batch"}, files=[("file", "in.jsonl", content)])
    stream = DroppingInput(body, fail_after=len(body) // 2, error=error)

    response = post_raw(api, body, **{"wsgi.input": stream})

    assert stream.raised  # the server did read into the failure
    # The client is gone and will not see it, but the answer must still be a client
    # error in the envelope, not a server error.
    assert_envelope(response, 400)
    assert File.objects.count() == 0
    assert leftovers(storage) == []


def test_body_ending_before_the_file_part_closes_stores_nothing(api, storage):
    # What a proxy passes on when the client vanishes: an honest length, a short body.
    body = multipart(fields={"purpose": "batch"}, files=[("file", "in.jsonl", CONTENT * 50)])
    truncated = body[: len(body) // 2]

    response = post_raw(api, truncated)

    assert_envelope(response, 400)
    assert File.objects.count() == 0
    assert leftovers(storage) == []


def test_upload_with_a_non_multipart_body_is_4xx_in_the_envelope(api):
    response = api.post("/v1/files", data=json.dumps({"purpose": "batch"}),
                        content_type="application/json")

    assert_envelope(response, 415)


# --- list -----------------------------------------------------------------------------


@pytest.fixture
def three_uploads(upload) -> list[str]:
    return [upload(CONTENT, filename=f"in-{i}.jsonl")["id"] for i in range(3)]


def test_list_is_newest_first_by_default(api, three_uploads):
    body = api.get("/v1/files").json()

    assert body["object"] == "list"
    assert [f["id"] for f in body["data"]] == three_uploads[::-1]
    assert body["has_more"] is False
    assert body["first_id"] == three_uploads[2]
    assert body["last_id"] == three_uploads[0]


def test_list_order_asc_is_oldest_first(api, three_uploads):
    body = api.get("/v1/files", {"order": "asc"}).json()

    assert [f["id"] for f in body["data"]] == three_uploads


def test_list_pages_with_limit_and_after_in_both_orders(api, three_uploads):
    first = api.get("/v1/files", {"limit": 2}).json()
    assert [f["id"] for f in first["data"]] == three_uploads[:0:-1]
    assert first["has_more"] is True
    assert first["last_id"] == three_uploads[1]

    second = api.get("/v1/files", {"limit": 2, "after": first["last_id"]}).json()
    assert [f["id"] for f in second["data"]] == [three_uploads[0]]
    assert second["has_more"] is False

    ascending = api.get("/v1/files", {"limit": 2, "order": "asc",
                                      "after": three_uploads[0]}).json()
    assert [f["id"] for f in ascending["data"]] == three_uploads[1:]
    assert ascending["has_more"] is False


@pytest.mark.parametrize("order", ["desc", "asc"])
def test_list_after_a_file_deleted_since_goes_on_from_where_it_was(api, three_uploads, order):
    # Listing and deleting page by page: the cursor's file is gone by the next page.
    first = api.get("/v1/files", {"limit": 1, "order": order}).json()
    assert api.delete(f"/v1/files/{first['last_id']}").status_code == 200

    rest = api.get("/v1/files", {"after": first["last_id"], "order": order}).json()

    expected = three_uploads[1::-1] if order == "desc" else three_uploads[1:]
    assert [f["id"] for f in rest["data"]] == expected


@pytest.mark.parametrize("after", [
    "file-unknown",  # sorts after every id: the first page, before the fix
    "file-ffffffffffffff0000000000",  # shaped like an id, issued in the far future
    "batch_066188dde2cbcc4ad1538b7c",  # a batch's id
])
def test_list_after_an_id_of_no_file_is_400_not_the_first_page(api, three_uploads, after):
    error = assert_envelope(api.get("/v1/files", {"after": after}), 400, param="after",
                            code="invalid_cursor")

    assert after in error["message"]


def test_list_filters_by_purpose(api, upload):
    uploaded = upload(CONTENT)["id"]
    output = file_register_output(batch_id="batch_0000000000000000000000").id

    def ids(purpose):
        return [f["id"] for f in api.get("/v1/files", {"purpose": purpose}).json()["data"]]

    assert ids("batch") == [uploaded]
    assert ids("batch_output") == [output]
    assert ids("batch_error") == []


def test_empty_list_has_null_cursor_ids(api):
    body = api.get("/v1/files").json()

    assert body == {"object": "list", "data": [], "has_more": False,
                    "first_id": None, "last_id": None}


@pytest.mark.parametrize("query, param", [
    ({"limit": 0}, "limit"),
    ({"limit": 10_001}, "limit"),
    ({"limit": "many"}, "limit"),
    ({"order": "sideways"}, "order"),
    ({"purpose": "fine-tune"}, "purpose"),
])
def test_list_rejects_bad_query_parameters(api, query, param):
    assert_envelope(api.get("/v1/files", query), 400, param=param)


# --- retrieve, content, delete ---------------------------------------------------------


def test_retrieve_returns_the_same_file_object_as_the_upload(api, upload):
    file = upload(CONTENT)

    response = api.get(f"/v1/files/{file['id']}")

    assert response.status_code == 200
    assert response.json() == file


def test_content_is_streamed_as_an_attachment_with_the_exact_bytes(api, upload):
    content = CONTENT + b'{"custom_id": "\xc3\xa9"}\n'
    file = upload(content, filename="mine.jsonl")

    response = api.get(f"/v1/files/{file['id']}/content")

    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Disposition"].startswith("attachment")
    assert 'filename="mine.jsonl"' in response["Content-Disposition"]
    assert b"".join(response.streaming_content) == content


def test_content_of_a_file_whose_bytes_are_gone_is_404(api, upload, storage):
    file = upload(CONTENT)
    (storage / "uploads" / f"{file['id']}.jsonl").unlink()

    assert_envelope(api.get(f"/v1/files/{file['id']}/content"), 404)


def test_delete_removes_row_and_bytes(api, upload, storage, django_capture_on_commit_callbacks):
    file = upload(CONTENT)

    with django_capture_on_commit_callbacks(execute=True):
        response = api.delete(f"/v1/files/{file['id']}")

    assert response.status_code == 200
    assert response.json() == {"id": file["id"], "object": "file", "deleted": True}
    assert not File.objects.filter(id=file["id"]).exists()
    assert leftovers(storage) == []
    assert_envelope(api.get(f"/v1/files/{file['id']}"), 404)


def test_delete_is_refused_while_an_active_batch_uses_the_file(
        api, upload, storage, published, django_capture_on_commit_callbacks):
    file = upload(CONTENT)
    created = api.post("/v1/batches", {"input_file_id": file["id"]}, format="json")
    assert created.status_code == 200, created.content

    with django_capture_on_commit_callbacks(execute=True):
        response = api.delete(f"/v1/files/{file['id']}")

    assert_envelope(response, 400, code="file_in_use")
    assert File.objects.filter(id=file["id"]).exists()
    assert (storage / "uploads" / f"{file['id']}.jsonl").read_bytes() == CONTENT


def test_delete_is_allowed_once_the_batch_using_the_file_is_cancelled(
        api, upload, storage, published, django_capture_on_commit_callbacks):
    file = upload(CONTENT)
    batch = api.post("/v1/batches", {"input_file_id": file["id"]}, format="json").json()
    assert api.post(f"/v1/batches/{batch['id']}/cancel").json()["status"] == "cancelled"

    with django_capture_on_commit_callbacks(execute=True):
        response = api.delete(f"/v1/files/{file['id']}")

    assert response.status_code == 200, response.content
    assert leftovers(storage) == []


@pytest.mark.parametrize("method, suffix", [
    ("get", ""), ("delete", ""), ("get", "/content"),
])
def test_unknown_file_id_is_404_on_every_file_endpoint(api, method, suffix):
    response = getattr(api, method)(f"/v1/files/file-doesnotexist{suffix}")

    assert_envelope(response, 404, param="file_id", code="not_found")


def test_output_file_is_listed_with_its_purpose_and_processed_status(api, storage):
    (storage / "incremental" / "batch_x.jsonl").write_bytes(b'{"custom_id":"a"}\n')
    output = file_register_output(batch_id="batch_x")

    body = api.get(f"/v1/files/{output.id}").json()

    assert body["purpose"] == FilePurpose.BATCH_OUTPUT
    assert body["status"] == "processed"
    assert body["bytes"] == len(b'{"custom_id":"a"}\n')
    assert body["filename"] == "batch_x_output.jsonl"
