"""The OpenAI error envelope on every kind of error, and the API's own description."""

from __future__ import annotations

import json

import pytest

from tests.conftest import error_of
from tests.files.helpers import MULTIPART, multipart

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/nothing-here", "/v1/unknown", "/v1/files/x/y/z",
                                  "/v1/batches/", "/v2/batches"])
def test_unknown_path_is_404_in_the_envelope(api, path):
    error = error_of(api.get(path), 404)

    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("method, path", [
    ("put", "/v1/files"),
    ("patch", "/v1/batches"),
    ("delete", "/v1/batches"),
    ("get", "/v1/batches/batch_x/cancel"),
    ("post", "/v1/models"),
    ("post", "/v1/pool/status"),
    ("post", "/health"),
])
def test_method_not_allowed_is_405_in_the_envelope(api, method, path):
    error = error_of(getattr(api, method)(path), 405)

    assert error["type"] == "invalid_request_error"


def test_validation_error_names_the_field_in_param(api):
    error = error_of(api.post("/v1/batches", {}, format="json"), 400)

    assert error["param"] == "input_file_id"
    assert error["type"] == "invalid_request_error"
    assert "input_file_id" in error["message"]


def test_malformed_json_is_400_in_the_envelope(api):
    error_of(api.post("/v1/batches", data="{", content_type="application/json"), 400)


def test_query_parameter_error_is_400_in_the_envelope(api):
    error = error_of(api.get("/v1/files", {"limit": "zero"}), 400)

    assert error["param"] == "limit"


@pytest.mark.parametrize("path", ["/v1/batches", "/v1/files", "/v1/models"])
def test_a_format_query_parameter_is_ignored_not_a_404(api, path):
    # DRF's renderer override (`?format=`) answered 404 to any unknown value (found by
    # schema fuzzing); the API is JSON only, so the parameter means nothing.
    response = api.get(path, {"format": "xml"})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("application/json")


def test_oversized_upload_is_413_in_the_envelope(api, settings):
    settings.BATCHGEN_MAX_UPLOAD_BYTES = 10
    body = multipart(fields={"purpose": "batch"}, files=[("file", "f.jsonl", b"x" * 100)])

    error = error_of(api.generic("POST", "/v1/files", body, content_type=MULTIPART), 413)

    assert error["code"] == "file_too_large"


def test_oversized_json_body_is_413_in_the_envelope(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = json.dumps({"input_file_id": "file-x", "metadata": {"k": "v" * 5000}})

    error_of(api.post("/v1/batches", data=body, content_type="application/json"), 413)


def test_unsupported_media_type_is_415_in_the_envelope(api):
    error_of(api.post("/v1/batches", data="input_file_id=x", content_type="text/plain"), 415)


def test_unexpected_server_error_is_500_in_the_envelope_without_details(api, monkeypatch):
    from batches import selectors

    def explode(**kwargs):
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(selectors, "batch_list", explode)

    error = error_of(api.get("/v1/batches"), 500)

    assert error["type"] == "server_error"
    assert "secret" not in error["message"]


# --- OpenAPI and docs -----------------------------------------------------------------------


def test_openapi_json_is_valid_json_describing_every_endpoint(api):
    response = api.get("/v1/openapi.json")

    assert response.status_code == 200
    assert "json" in response["Content-Type"]
    schema = json.loads(response.content)
    assert schema["openapi"].startswith("3.")
    assert {"/v1/files", "/v1/files/{file_id}", "/v1/files/{file_id}/content",
            "/v1/batches", "/v1/batches/{batch_id}", "/v1/batches/{batch_id}/cancel",
            "/v1/models", "/v1/models/{model_id}", "/v1/pool/status",
            "/health"} <= set(schema["paths"])
    assert "post" in schema["paths"]["/v1/batches"]
    assert "delete" in schema["paths"]["/v1/files/{file_id}"]


def test_openapi_describes_the_line_errors_endpoint_and_the_errors_total(api):
    schema = json.loads(api.get("/v1/openapi.json").content)
    components = schema["components"]["schemas"]

    operation = schema["paths"]["/v1/batches/{batch_id}/errors"]["get"]

    assert {p["name"] for p in operation["parameters"]} >= {"batch_id", "limit", "after"}
    page = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert set(components[page.rsplit("/", 1)[-1]]["properties"]) == {
        "object", "data", "has_more", "total"}
    assert {"400", "404"} <= set(operation["responses"])
    assert {"total", "has_more"} <= set(components["BatchErrors"]["properties"])


def test_openapi_types_timestamps_as_integers(api):
    schema = json.loads(api.get("/v1/openapi.json").content)
    components = schema["components"]["schemas"]

    assert components["FileOutput"]["properties"]["created_at"]["type"] == "integer"
    assert components["BatchOutput"]["properties"]["created_at"]["type"] == "integer"
    assert components["BatchOutput"]["properties"]["in_progress_at"]["type"] == "integer"


def test_docs_serve_an_html_page_pointing_at_the_schema(api):
    response = api.get("/docs")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    content = response.content.decode()
    assert "<html" in content.lower()
    assert "/v1/openapi.json" in content
