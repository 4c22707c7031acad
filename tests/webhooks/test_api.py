"""/v1/webhook_endpoints, shaped as OpenAI's (the openai SDK's client.webhooks)."""

from __future__ import annotations

import pytest

from batchgen.webhooks import verify
from core.auth import apikey_create
from tests.conftest import error_of

pytestmark = pytest.mark.django_db


def test_create_shows_the_secret_once_and_list_retrieve_never(api):
    response = api.post("/v1/webhook_endpoints", {"url": "https://example.com/hook",
                                                  "name": "ops"}, format="json")
    assert response.status_code == 200, response.content
    created = response.json()
    assert created["object"] == "webhook_endpoint" and created["id"].startswith("we_")
    assert created["signing_secret"].startswith("whsec_")
    assert created["signing_secret_hint"] == f"whsec_…{created['signing_secret'][-4:]}"
    assert created["event_types"] == ["batch.completed", "batch.failed", "batch.cancelled"]

    listed = api.get("/v1/webhook_endpoints").json()
    retrieved = api.get(f"/v1/webhook_endpoints/{created['id']}").json()
    assert [e["id"] for e in listed["data"]] == [created["id"]]
    for shown in (listed["data"][0], retrieved):
        assert "signing_secret" not in shown
        assert shown["url"] == "https://example.com/hook"


def test_update_and_delete(api):
    endpoint = api.post("/v1/webhook_endpoints", {"url": "https://example.com/a"},
                        format="json").json()
    updated = api.post(f"/v1/webhook_endpoints/{endpoint['id']}",
                       {"event_types": ["batch.failed"], "url": "https://example.com/b"},
                       format="json").json()
    assert (updated["event_types"], updated["url"]) == (["batch.failed"], "https://example.com/b")

    deleted = api.delete(f"/v1/webhook_endpoints/{endpoint['id']}").json()
    assert deleted == {"id": endpoint["id"], "object": "webhook_endpoint.deleted",
                       "deleted": True}
    error_of(api.get(f"/v1/webhook_endpoints/{endpoint['id']}"), 404)


@pytest.mark.parametrize("body,param", [
    ({"url": "ftp://example.com/x"}, "url"),
    ({"url": "not a url"}, "url"),
    ({}, "url"),
    ({"url": "https://example.com", "event_types": ["batch.expired"]}, "event_types"),
    ({"url": "https://example.com", "event_types": []}, "event_types"),
    ({"url": "https://example.com", "event_types": "batch.failed"}, "event_types"),
])
def test_bad_input_is_a_400_naming_the_field(api, body, param):
    error = error_of(api.post("/v1/webhook_endpoints", body, format="json"), 400)
    assert error["param"] == param


def test_a_key_sees_only_its_own_endpoints(api):
    _, mine = apikey_create(name="mine")
    _, theirs = apikey_create(name="theirs")
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {theirs}")
    other = api.post("/v1/webhook_endpoints", {"url": "https://example.com/t"},
                     format="json").json()

    api.credentials(HTTP_AUTHORIZATION=f"Bearer {mine}")
    assert api.get("/v1/webhook_endpoints").json()["data"] == []
    error_of(api.get(f"/v1/webhook_endpoints/{other['id']}"), 404)
    error_of(api.delete(f"/v1/webhook_endpoints/{other['id']}"), 404)
    api.credentials()
    error_of(api.get("/v1/webhook_endpoints"), 401)


def test_test_sends_a_signed_sample_and_rotate_changes_the_secret(api, receiver):
    endpoint = api.post("/v1/webhook_endpoints", {"url": receiver.url}, format="json").json()

    result = api.post(f"/v1/webhook_endpoints/{endpoint['id']}/test",
                      {"event_type": "batch.failed"}, format="json").json()
    assert result == {"object": "webhook_endpoint.test", "webhook_endpoint_id": endpoint["id"],
                      "event_type": "batch.failed", "status_code": 200, "success": True}
    [sample] = receiver.received
    assert verify(sample.body, sample.headers, endpoint["signing_secret"])["type"] == \
        "batch.failed"

    rotated = api.post(f"/v1/webhook_endpoints/{endpoint['id']}/rotate_secret",
                       {"keep_old_secret_active_for_24_hours": True}, format="json").json()
    assert rotated["signing_secret"] != endpoint["signing_secret"]
    api.post(f"/v1/webhook_endpoints/{endpoint['id']}/test", {"event_type": "batch.completed"},
             format="json")
    for secret in (endpoint["signing_secret"], rotated["signing_secret"]):
        verify(receiver.received[-1].body, receiver.received[-1].headers, secret)

    receiver.stop()
    error = error_of(api.post(f"/v1/webhook_endpoints/{endpoint['id']}/test",
                              {"event_type": "batch.completed"}, format="json"), 400)
    assert error["code"] == "webhook_unreachable"


def test_event_types_lists_the_batch_events(api):
    assert api.get("/v1/webhook_event_types").json() == {
        "object": "list", "data": ["batch.completed", "batch.failed", "batch.cancelled"]}
