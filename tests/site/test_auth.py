"""API keys and tenancy: open while no key exists, then every /v1/ call needs a key
and each key sees only its own files and batches."""

from __future__ import annotations

from io import BytesIO, StringIO

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from core.auth import apikey_create, hash_key
from core.models import ApiKey
from tests.conftest import chat_line, jsonl

pytestmark = pytest.mark.django_db


def client_with(raw_key: str | None) -> APIClient:
    client = APIClient()
    if raw_key:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def upload_with(client: APIClient, name: str = "in.jsonl") -> dict:
    handle = BytesIO(jsonl([chat_line("a")]))
    handle.name = name
    response = client.post("/v1/files", {"file": handle, "purpose": "batch"},
                           format="multipart")
    assert response.status_code == 200, response.content
    return response.json()


def test_open_server_needs_no_key_and_ignores_a_placeholder(published):
    assert client_with(None).get("/v1/files").status_code == 200
    assert client_with("sk-anything").get("/v1/batches").status_code == 200


def test_once_a_key_exists_every_v1_endpoint_requires_one(published):
    apikey_create(name="alice")
    for path in ("/v1/files", "/v1/batches", "/v1/models", "/v1/pool/status",
                 "/v1/files/file-x", "/v1/batches/batch_x"):
        response = client_with(None).get(path)
        assert response.status_code == 401, path
        assert response.json()["error"]["type"] == "authentication_error"
        assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_wrong_or_revoked_key_is_refused(published):
    _, raw = apikey_create(name="alice")
    assert client_with("bg-wrong").get("/v1/files").status_code == 401
    assert client_with(raw).get("/v1/files").status_code == 200
    ApiKey.objects.update(revoked_at="2026-01-01T00:00:00Z")
    assert client_with(raw).get("/v1/files").status_code == 401


def test_a_key_made_by_another_process_closes_the_server_within_a_second(
        published, monkeypatch):
    from core import auth

    clock = [1000.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: clock[0])
    assert client_with(None).get("/v1/files").status_code == 200

    # When: a key appears in the database behind this process's back (createapikey)
    ApiKey.objects.create(name="ops", prefix="bg-0123456", hashed_key=hash_key("bg-x"))

    # Then: the answer seen a moment ago holds until the recheck interval passes
    clock[0] += auth.KEYS_RECHECK_SECONDS / 2
    assert client_with(None).get("/v1/files").status_code == 200
    clock[0] += auth.KEYS_RECHECK_SECONDS / 2
    assert client_with(None).get("/v1/files").status_code == 401


def test_once_a_key_was_seen_a_poll_asks_nothing_more_about_keys(
        published, django_assert_num_queries):
    _, raw = apikey_create(name="alice")
    client = client_with(raw)
    client.get("/v1/pool/status")  # the key's last use is recorded (once a minute)

    # An authenticated poll of a cached pool status: one query, the key's lookup
    with django_assert_num_queries(1):
        assert client.get("/v1/pool/status").status_code == 200
    # ...and an anonymous one none: refused without asking whether keys exist
    with django_assert_num_queries(0):
        assert client_with(None).get("/v1/pool/status").status_code == 401


def test_health_and_the_schema_stay_public(published):
    apikey_create(name="alice")
    assert client_with(None).get("/health").status_code in (200, 503)
    assert client_with(None).get("/v1/openapi.json").status_code == 200


def test_require_auth_without_any_key(settings, published):
    settings.BATCHGEN_REQUIRE_AUTH = True
    assert client_with(None).get("/v1/files").status_code == 401


def test_each_key_sees_only_its_own_files_and_batches(published):
    _, alice_raw = apikey_create(name="alice")
    _, bob_raw = apikey_create(name="bob")
    alice, bob = client_with(alice_raw), client_with(bob_raw)
    alice_file = upload_with(alice)
    batch = alice.post("/v1/batches", {"input_file_id": alice_file["id"]}, format="json").json()

    assert [f["id"] for f in alice.get("/v1/files").json()["data"]] == [alice_file["id"]]
    assert bob.get("/v1/files").json()["data"] == []
    assert bob.get("/v1/batches").json()["data"] == []
    for method, path in [("get", f"/v1/files/{alice_file['id']}"),
                         ("get", f"/v1/files/{alice_file['id']}/content"),
                         ("delete", f"/v1/files/{alice_file['id']}"),
                         ("get", f"/v1/batches/{batch['id']}"),
                         ("post", f"/v1/batches/{batch['id']}/cancel"),
                         ("get", f"/v1/batches/{batch['id']}/output")]:
        assert getattr(bob, method)(path).status_code == 404, path
    # Nor can bob run a batch on alice's file.
    refused = bob.post("/v1/batches", {"input_file_id": alice_file["id"]}, format="json")
    assert refused.status_code == 400
    assert alice.get(f"/v1/batches/{batch['id']}").json()["status"] == "validating"


def test_createapikey_prints_the_key_once_and_stores_only_its_hash():
    out = StringIO()
    call_command("createapikey", "ci", stdout=out, stderr=StringIO())
    raw = out.getvalue().strip()
    key = ApiKey.objects.get(name="ci")
    assert raw.startswith("bg-") and len(raw) > 40
    assert key.hashed_key == hash_key(raw) and raw not in key.hashed_key
    listing = StringIO()
    call_command("createapikey", "--list", stdout=listing)
    assert key.prefix in listing.getvalue() and raw not in listing.getvalue()
    call_command("createapikey", "--revoke", key.prefix, stdout=StringIO())
    key.refresh_from_db()
    assert key.revoked_at is not None
