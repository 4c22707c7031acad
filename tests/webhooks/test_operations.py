"""What operators use: the admin (secret shown once, the delivery log's resend),
`manage.py webhooks`, and the Python client's endpoint methods."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from batchgen import BadRequestError, BatchGenHttpClient, NotFoundError
from batchgen.webhooks import verify
from webhooks import services
from webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db

ADD = "/admin/webhooks/webhookendpoint/add/"
DELIVERIES = "/admin/webhooks/webhookdelivery/"


def test_admin_add_shows_the_secret_once(admin_client):
    response = admin_client.post(ADD, {"name": "ops", "url": "https://ops.example.com/h",
                                       "event_types": ["batch.failed"], "enabled": "on"},
                                 follow=True)
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.owner is None and endpoint.event_types == ["batch.failed"]
    assert endpoint.secret in response.content.decode()
    page = admin_client.get(f"/admin/webhooks/webhookendpoint/{endpoint.id}/change/")
    assert endpoint.secret not in page.content.decode()
    assert endpoint.secret_hint in page.content.decode()


def test_admin_resend_action_sends_a_failed_delivery_again(admin_client, create_batch,
                                                           published, receiver):
    from batches import services as batch_services

    services.endpoint_create(url=receiver.url)
    batch_services.batch_cancel(batch_id=create_batch().id)
    WebhookDelivery.objects.update(status=DeliveryStatus.FAILED)
    delivery = WebhookDelivery.objects.get()

    page = admin_client.get(DELIVERIES).content.decode()
    assert delivery.id in page and "failed" in page
    admin_client.post(DELIVERIES, {"action": "resend", "_selected_action": [delivery.id]})

    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.PENDING
    assert ("webhooks.send_deliveries", ([delivery.id],)) in published or \
        services.deliveries_send() == {DeliveryStatus.DELIVERED: 1}


def test_the_webhooks_command_adds_lists_tests_and_removes(receiver):
    out, err = io.StringIO(), io.StringIO()
    call_command("webhooks", "add", receiver.url, "--name", "ops",
                 "--events", "batch.completed,batch.failed", stdout=out, stderr=err)
    secret = out.getvalue().strip()
    endpoint = WebhookEndpoint.objects.get()
    assert secret == endpoint.secret and "server-wide" in err.getvalue()

    out = io.StringIO()
    call_command("webhooks", "list", stdout=out)
    assert endpoint.id in out.getvalue() and secret not in out.getvalue()

    out = io.StringIO()
    call_command("webhooks", "test", endpoint.id, "--event", "batch.failed", stdout=out)
    assert "HTTP 200" in out.getvalue()
    [sample] = receiver.received
    assert verify(sample.body, sample.headers, secret)["type"] == "batch.failed"

    with pytest.raises(CommandError, match="event_types"):
        call_command("webhooks", "add", receiver.url, "--events", "batch.expired")
    with pytest.raises(CommandError, match="no API key"):
        call_command("webhooks", "add", receiver.url, "--key", "bg-nope")
    call_command("webhooks", "remove", endpoint.id, stdout=io.StringIO())
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_client_manages_endpoints(live_server, receiver):
    with BatchGenHttpClient(live_server.url) as client:
        created = client.create_webhook_endpoint(receiver.url, name="mine",
                                                 event_types=["batch.completed"])
        assert created["signing_secret"].startswith("whsec_")
        assert client.list_webhook_endpoints()["data"][0]["id"] == created["id"]
        updated = client.update_webhook_endpoint(created["id"], enabled=False)
        assert updated["enabled"] is False
        assert client.test_webhook_endpoint(created["id"])["status_code"] == 200
        rotated = client.rotate_webhook_secret(created["id"])
        assert rotated["signing_secret"] != created["signing_secret"]
        assert client.get_webhook_endpoint(created["id"])["name"] == "mine"
        with pytest.raises(BadRequestError):
            client.create_webhook_endpoint("not a url")
        assert client.delete_webhook_endpoint(created["id"])["deleted"] is True
        with pytest.raises(NotFoundError):
            client.get_webhook_endpoint(created["id"])
