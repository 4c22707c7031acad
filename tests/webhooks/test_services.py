"""The outbox (deliveries written with the batch's terminal transition), delivery to
a real local receiver, retries with backoff, give-up and the claim's fencing."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from batches import services as batch_services
from batches.models import Batch, BatchStatus
from batchgen.webhooks import verify
from core.auth import apikey_create
from webhooks import services
from webhooks.models import DeliveryStatus, WebhookDelivery

pytestmark = pytest.mark.django_db

SEND = "webhooks.send_deliveries"


def deliveries(**filters) -> list[WebhookDelivery]:
    return list(WebhookDelivery.objects.filter(**filters).order_by("id"))


def test_a_terminal_transition_writes_one_delivery_per_subscribed_endpoint(
        create_batch, published, django_capture_on_commit_callbacks):
    # Given: a server-wide endpoint for every event, one for completions only
    everything = services.endpoint_create(url="http://127.0.0.1:9/a")
    services.endpoint_create(url="http://127.0.0.1:9/b", event_types=["batch.completed"])
    batch = create_batch()

    # When: the batch is cancelled while it validates
    with django_capture_on_commit_callbacks(execute=True):
        batch_services.batch_cancel(batch_id=batch.id)

    # Then: one delivery, to the endpoint that wants cancellations, with the batch
    # object as the API renders it; the first attempt is published after commit
    [delivery] = deliveries()
    assert delivery.endpoint_id == everything.id
    assert (delivery.event_type, delivery.batch_id, delivery.status) == (
        "batch.cancelled", batch.id, DeliveryStatus.PENDING)
    event = json.loads(delivery.body)
    assert event["id"].startswith("evt_") and event["id"] == delivery.event_id
    assert event["object"] == "event" and event["type"] == "batch.cancelled"
    assert event["data"]["id"] == batch.id and event["data"]["status"] == "cancelled"
    assert event["data"]["object"] == "batch"
    assert (SEND, ([delivery.id],)) in published


def test_no_delivery_exists_when_the_transition_rolls_back(create_batch, published):
    services.endpoint_create(url="http://127.0.0.1:9/a")
    batch = create_batch()

    with pytest.raises(RuntimeError), transaction.atomic():
        assert batch_services.batch_transition(batch_id=batch.id, to=BatchStatus.CANCELLED)
        assert len(deliveries()) == 1  # written inside the transition's transaction
        raise RuntimeError("the caller's transaction fails after the transition")

    assert Batch.objects.get(id=batch.id).status == BatchStatus.VALIDATING
    assert deliveries() == []
    assert not [name for name, _ in published if name == SEND]


def test_a_keys_endpoint_hears_only_that_keys_batches(create_batch, published):
    batch = create_batch()  # before any key exists (the API is open until then)
    mine, _ = apikey_create(name="mine")
    theirs, _ = apikey_create(name="theirs")
    my_endpoint = services.endpoint_create(url="http://127.0.0.1:9/mine", owner=mine)
    server_wide = services.endpoint_create(url="http://127.0.0.1:9/all")
    Batch.objects.filter(id=batch.id).update(owner=theirs)

    batch_services.batch_cancel(batch_id=batch.id)

    assert [d.endpoint_id for d in deliveries()] == [server_wide.id]
    assert my_endpoint.deliveries.count() == 0


def test_a_delivery_answered_2xx_is_sent_once_and_verifies(create_batch, published, receiver):
    endpoint = services.endpoint_create(url=receiver.url)
    batch = create_batch()
    batch_services.batch_cancel(batch_id=batch.id)

    assert services.deliveries_send() == {DeliveryStatus.DELIVERED: 1}
    assert services.deliveries_sweep() == {}  # nothing is due any more

    [got] = receiver.received
    event = verify(got.body, got.headers, endpoint.secret)
    assert event["data"]["id"] == batch.id
    [delivery] = deliveries()
    assert got.webhook_id == delivery.id
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == (
        DeliveryStatus.DELIVERED, 1, 200)
    assert delivery.delivered_at is not None


def test_failed_attempts_are_retried_until_the_receiver_takes_the_event(
        create_batch, published, receiver, quick_retries):
    services.endpoint_create(url=receiver.url)
    receiver.answers = [503, 500]
    batch = create_batch()
    batch_services.batch_cancel(batch_id=batch.id)

    assert services.deliveries_send() == {DeliveryStatus.PENDING: 1}
    [delivery] = deliveries()
    assert (delivery.attempts, delivery.last_status_code) == (1, 503)
    assert "HTTP 503" in delivery.last_error
    assert services.deliveries_send() == {DeliveryStatus.PENDING: 1}
    assert services.deliveries_send() == {DeliveryStatus.DELIVERED: 1}

    assert [r.answered for r in receiver.received] == [503, 500, 200]
    assert len({r.webhook_id for r in receiver.received}) == 1  # one id for every attempt
    [delivery] = deliveries()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.DELIVERED, 3)


def test_a_receiver_that_is_down_gets_the_event_once_it_is_back(
        create_batch, published, receiver, quick_retries):
    services.endpoint_create(url=receiver.url)
    receiver.stop()
    batch = create_batch()
    batch_services.batch_cancel(batch_id=batch.id)

    assert services.deliveries_send() == {DeliveryStatus.PENDING: 1}
    [delivery] = deliveries()
    assert delivery.last_status_code is None and "ConnectError" in delivery.last_error

    receiver.start()
    assert services.deliveries_sweep() == {DeliveryStatus.DELIVERED: 1}
    assert len(receiver.delivered()) == 1


def test_retries_back_off_exponentially_with_jitter_up_to_the_cap(settings):
    settings.BATCHGEN_WEBHOOK_RETRY_FIRST_SECONDS = 5.0
    settings.BATCHGEN_WEBHOOK_RETRY_MAX_SECONDS = 3600.0
    for attempt, base in [(1, 5), (2, 10), (3, 20), (6, 160), (10, 2560)]:
        delays = {services.retry_delay(attempt) for _ in range(20)}
        assert all(base <= d <= base + 5 for d in delays), (attempt, delays)
        assert len(delays) > 1  # jittered
    assert services.retry_delay(30) == 3600.0
    # About 30 attempts in the day: 11 doubling ones, then one an hour.
    total, attempts = 0.0, 0
    while total < 86400:
        attempts += 1
        total += services.retry_delay(attempts)
    assert 25 <= attempts <= 35


def test_a_delivery_is_given_up_after_its_max_age(create_batch, published, receiver, settings):
    settings.BATCHGEN_WEBHOOK_RETRY_FIRST_SECONDS = 60.0
    settings.BATCHGEN_WEBHOOK_MAX_AGE_SECONDS = 30.0  # the next retry would be too late
    services.endpoint_create(url=receiver.url)
    receiver.answers = [503]
    batch = create_batch()
    batch_services.batch_cancel(batch_id=batch.id)

    assert services.deliveries_send() == {DeliveryStatus.FAILED: 1}
    [delivery] = deliveries()
    assert delivery.status == DeliveryStatus.FAILED
    assert "gave up after 1 attempts" in delivery.last_error


def test_410_gone_disables_the_endpoint_and_fails_its_deliveries(
        create_batch, published, receiver):
    endpoint = services.endpoint_create(url=receiver.url)
    receiver.answers = [410]
    for _ in range(2):
        batch_services.batch_cancel(batch_id=create_batch().id)

    assert services.deliveries_send(limit=1) == {DeliveryStatus.FAILED: 1}

    endpoint.refresh_from_db()
    assert not endpoint.enabled and "410" in endpoint.disabled_reason
    assert {d.status for d in deliveries()} == {DeliveryStatus.FAILED}
    assert len(receiver.received) == 1
    batch_services.batch_cancel(batch_id=create_batch().id)
    assert len(deliveries()) == 2  # a disabled endpoint gets no new events


def test_a_late_answer_after_the_lease_ended_is_not_recorded(create_batch, published, receiver):
    # Given: an attempt claimed by a sender that then stalled past its lease
    services.endpoint_create(url=receiver.url)
    batch_services.batch_cancel(batch_id=create_batch().id)
    [stalled] = services.deliveries_claim()
    assert services.deliveries_claim() == []  # leased: no one else takes it
    [delivery] = deliveries()
    assert delivery.next_attempt_at > timezone.now() + timedelta(seconds=30)

    # When: its lease ends, another sender delivers it, and the stalled one's
    # answer comes last
    WebhookDelivery.objects.update(next_attempt_at=timezone.now())
    assert services.deliveries_send() == {DeliveryStatus.DELIVERED: 1}
    from webhooks.sender import Outcome
    assert services.delivery_record(attempt=stalled, outcome=Outcome(503, "late")) is None

    # Then: the delivery stays delivered, its second attempt's
    [delivery] = deliveries()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.DELIVERED, 2)


def test_resend_sends_a_delivered_event_again(create_batch, published, receiver,
                                              django_capture_on_commit_callbacks):
    services.endpoint_create(url=receiver.url)
    batch_services.batch_cancel(batch_id=create_batch().id)
    services.deliveries_send()
    [delivery] = deliveries()

    with django_capture_on_commit_callbacks(execute=True):
        assert services.deliveries_resend(delivery_ids=[delivery.id]) == 1
    assert (SEND, ([delivery.id],)) in published
    assert services.deliveries_send(delivery_ids=[delivery.id]) == {
        DeliveryStatus.DELIVERED: 1}
    assert [r.webhook_id for r in receiver.delivered()] == [delivery.id, delivery.id]


def test_the_sweep_fails_what_waits_for_a_disabled_endpoint_past_its_last_chance(
        create_batch, published, receiver):
    endpoint = services.endpoint_create(url=receiver.url)
    batch_services.batch_cancel(batch_id=create_batch().id)
    services.endpoint_update(endpoint_id=endpoint.id, enabled=False)  # by an operator

    assert services.deliveries_sweep() == {}  # not sent: its endpoint is disabled
    WebhookDelivery.objects.update(give_up_at=timezone.now() - timedelta(hours=1))
    assert services.deliveries_sweep() == {DeliveryStatus.FAILED: 1}

    assert receiver.received == []
    assert "gave up" in deliveries()[0].last_error
