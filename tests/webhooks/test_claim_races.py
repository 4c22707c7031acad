"""Several control workers sending at once: SKIP LOCKED claims give each a different
set of deliveries, none waits on another, and nothing is sent twice."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import transaction
from django.utils import timezone

from tests.concurrency import require_concurrent_database, run_together
from webhooks import services
from webhooks.models import DeliveryStatus, WebhookDelivery

pytestmark = pytest.mark.django_db(transaction=True)


def make_deliveries(endpoint, count: int) -> list[str]:
    now = timezone.now()
    rows = WebhookDelivery.objects.bulk_create([
        WebhookDelivery(id=f"msg_{i:04d}", endpoint=endpoint, event_id=f"evt_{i:04d}",
                        event_type="batch.completed", batch_id=f"batch_{i}", body="{}",
                        next_attempt_at=now, give_up_at=now + timezone.timedelta(days=1))
        for i in range(count)])
    return [row.id for row in rows]


def test_concurrent_senders_deliver_each_event_exactly_once(receiver):
    require_concurrent_database()
    endpoint = services.endpoint_create(url=receiver.url)
    ids = make_deliveries(endpoint, 3 * services.CLAIM_SIZE)

    # Three senders sweep at once, as three control workers' beats would.
    outcomes = run_together(3, lambda i: services.deliveries_sweep())

    assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
    assert sum(o.get(DeliveryStatus.DELIVERED, 0) for o in outcomes) == len(ids)
    assert Counter(r.webhook_id for r in receiver.delivered()) == Counter(ids)
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {
        DeliveryStatus.DELIVERED}


@pytest.mark.postgresql
def test_a_claim_skips_rows_another_sender_holds_without_waiting():
    endpoint = services.endpoint_create(url="http://127.0.0.1:9/hook")
    ids = make_deliveries(endpoint, 10)
    holding, done = threading.Event(), threading.Event()

    def first():  # claims 4 and holds their row locks until the second one is done
        with transaction.atomic():
            claimed = services.deliveries_claim(limit=4)
            holding.set()
            assert done.wait(30)
        return claimed

    def second():
        assert holding.wait(30)
        started = timezone.now()
        # The first claim's rows are still locked (and not yet past their old due
        # time, as the first transaction has not committed): skipped, not waited on.
        claimed = services.deliveries_claim(limit=10)
        done.set()
        return claimed, (timezone.now() - started).total_seconds()

    held, (taken, waited) = run_together(2, lambda i: (first, second)[i]())

    held_ids = {a.delivery_id for a in held}
    taken_ids = {a.delivery_id for a in taken}
    assert len(held_ids) == 4 and len(taken_ids) == 6
    assert held_ids | taken_ids == set(ids) and not held_ids & taken_ids
    assert waited < 2
