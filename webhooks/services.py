"""Webhook services: endpoints, the outbox written with a batch's terminal
transition, and delivery (claim, send, record) with retries for a day.

Delivery is at least once. A delivery is claimed in a short transaction that sets
a lease (its next_attempt_at moves past the attempt's longest duration) and counts
the attempt; the POST runs outside any transaction; its outcome is recorded by a
conditional UPDATE fenced by that attempt number. A sender that dies mid-attempt
leaves the row to be claimed again when the lease ends, by any control worker. The
one window for a duplicate: the receiver answered 2xx and the sender died (or the
database failed) before the UPDATE committed; the repeat carries the same
`webhook-id`, which receivers use to drop it (Standard Webhooks)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from urllib.parse import urlsplit

import orjson
import tenacity
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from batches.models import Batch
from batches.serializers import BatchOutputSerializer
from core.celery import QueueName
from core.errors import BatchGenError, NotFound
from core.ids import new_id
from core.publishing import publish
from core.representation import represent
from core.transient import retry_transient
from webhooks import destinations, sender
from webhooks.models import (
    EVENT_OF_STATUS,
    EVENT_TYPES,
    DeliveryStatus,
    WebhookDelivery,
    WebhookEndpoint,
)
from webhooks.signing import new_secret

logger = logging.getLogger("batchgen.webhooks")

# Deliveries one task claims and sends at once, on this many threads: a task then
# lasts about one attempt's timeout however many receivers are down, so it never
# holds a control worker thread for long (validation and finalization share them).
CLAIM_SIZE = 32
SEND_THREADS = 8
# A rotated secret that is kept signs beside the new one for this long (OpenAI's).
KEEP_OLD_SECRET = timedelta(hours=24)


# --- endpoints ------------------------------------------------------------------------


def checked_url(url: str) -> str:
    """The URL, if webhooks may be sent to it (webhooks.destinations: https to
    public addresses, or what BATCHGEN_WEBHOOK_ALLOWED_HOSTS allows)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BatchGenError(f"url must be an absolute http(s) URL; got {url!r}.", param="url",
                            code="invalid_url")
    try:
        destinations.check_url(url)
    except destinations.DestinationRefused as exc:
        raise BatchGenError(f"Webhooks may not be sent to {url!r}: {exc}.", param="url",
                            code="webhook_url_not_allowed") from None
    return url


def _checked_event_types(event_types: Iterable[str] | None) -> list[str]:
    chosen = list(EVENT_TYPES) if event_types is None else list(dict.fromkeys(event_types))
    unknown = [name for name in chosen if name not in EVENT_TYPES]
    if unknown or not chosen:
        raise BatchGenError(
            f"event_types must name some of {', '.join(EVENT_TYPES)}; got {chosen!r}.",
            param="event_types", code="invalid_event_types")
    return chosen


def endpoint_create(*, url: str, name: str = "", event_types: Iterable[str] | None = None,
                    owner=None) -> WebhookEndpoint:
    """Register an endpoint; its `secret` is on the returned object, to be shown
    once. Without an owner it is server-wide (every batch's events)."""
    return WebhookEndpoint.objects.create(
        id=new_id("we_"), url=checked_url(url), name=name, owner=owner,
        event_types=_checked_event_types(event_types), secret=new_secret())


def endpoint_get(*, endpoint_id: str, owner=None) -> WebhookEndpoint:
    """An endpoint by id; with an owner, only that key's endpoints exist."""
    endpoints = WebhookEndpoint.objects.all()
    if owner is not None:
        endpoints = endpoints.filter(owner=owner)
    try:
        return endpoints.get(id=endpoint_id)
    except WebhookEndpoint.DoesNotExist:
        raise NotFound(f"No such webhook endpoint: {endpoint_id}",
                       param="webhook_endpoint_id") from None


def endpoint_update(*, endpoint_id: str, owner=None, url: str | None = None,
                    name: str | None = None, event_types: Iterable[str] | None = None,
                    enabled: bool | None = None) -> WebhookEndpoint:
    endpoint = endpoint_get(endpoint_id=endpoint_id, owner=owner)
    changes = {}
    if url is not None and url != endpoint.url:  # an unchanged URL is not looked up again
        changes["url"] = checked_url(url)
    if name is not None:
        changes["name"] = name
    if event_types is not None:
        changes["event_types"] = _checked_event_types(event_types)
    if enabled is not None:
        changes["enabled"] = enabled
        changes["disabled_reason"] = ""
    changed = {k: v for k, v in changes.items() if getattr(endpoint, k) != v}
    if changed:
        changed["updated_at"] = timezone.now()
        WebhookEndpoint.objects.filter(id=endpoint.id).update(**changed)
        endpoint.refresh_from_db()
    return endpoint


def endpoint_delete(*, endpoint_id: str, owner=None) -> None:
    """Delete an endpoint and its delivery log (nothing more is sent to it)."""
    endpoint_get(endpoint_id=endpoint_id, owner=owner).delete()


def endpoint_rotate_secret(*, endpoint_id: str, owner=None,
                           keep_old_secret: bool = False) -> WebhookEndpoint:
    """A new secret (returned once); the old one signs beside it for a day if kept,
    so receivers can switch without missing an event."""
    endpoint = endpoint_get(endpoint_id=endpoint_id, owner=owner)
    now = timezone.now()
    endpoint.previous_secret = endpoint.secret if keep_old_secret else ""
    endpoint.previous_secret_expires_at = now + KEEP_OLD_SECRET if keep_old_secret else None
    endpoint.secret = new_secret()
    endpoint.updated_at = now
    endpoint.save(update_fields=["secret", "previous_secret", "previous_secret_expires_at",
                                 "updated_at"])
    return endpoint


def _signing_secrets(endpoint: WebhookEndpoint) -> list[str]:
    keep = endpoint.previous_secret and endpoint.previous_secret_expires_at and \
        endpoint.previous_secret_expires_at > timezone.now()
    return [endpoint.secret, endpoint.previous_secret] if keep else [endpoint.secret]


def endpoint_test(*, endpoint_id: str, owner=None, event_type: str) -> sender.Outcome:
    """Send one sample event now (not recorded, never retried) and report the
    receiver's answer. Its data is a made-up batch id, `batch_test`."""
    endpoint = endpoint_get(endpoint_id=endpoint_id, owner=owner)
    _checked_event_types([event_type])
    body = _event_body(event_id=new_id("evt_"), event_type=event_type,
                       data={"id": "batch_test", "object": "batch"})
    with sender.http_client(timeout=settings.BATCHGEN_WEBHOOK_TIMEOUT_SECONDS) as client:
        return sender.post(client, sender.Attempt(
            delivery_id=new_id("msg_"), attempt=0, url=endpoint.url, body=body,
            secrets=_signing_secrets(endpoint)))


# --- the outbox -------------------------------------------------------------------------


def _event_body(*, event_id: str, event_type: str, data: dict) -> str:
    """The event as OpenAI's webhooks shape it; `data` is the whole batch object."""
    return orjson.dumps({"id": event_id, "object": "event", "type": event_type,
                         "created_at": int(timezone.now().timestamp()),
                         "data": data}).decode()


def webhook_event_record(*, batch_id: str, status: str) -> list[str]:
    """Write one delivery per subscribed endpoint for a batch that just reached a
    terminal status. Called inside the transition's transaction (the
    `batch_finished` signal): the rows commit or roll back with it, and the first
    attempt is published only after commit. Returns the deliveries' ids."""
    event_type = EVENT_OF_STATUS.get(status)
    if event_type is None:
        return []
    batch = Batch.objects.get(id=batch_id)
    endpoints = [endpoint for endpoint in WebhookEndpoint.objects.filter(
        Q(owner__isnull=True) | Q(owner_id=batch.owner_id), enabled=True)
        if event_type in endpoint.event_types]
    if not endpoints:
        return []
    now = timezone.now()
    event_id = new_id("evt_")
    body = _event_body(event_id=event_id, event_type=event_type,
                       data=represent(BatchOutputSerializer, batch))
    give_up_at = now + timedelta(seconds=settings.BATCHGEN_WEBHOOK_MAX_AGE_SECONDS)
    deliveries = WebhookDelivery.objects.bulk_create([
        WebhookDelivery(id=new_id("msg_"), endpoint=endpoint, event_id=event_id,
                        event_type=event_type, batch_id=batch_id, body=body,
                        created_at=now, next_attempt_at=now, give_up_at=give_up_at)
        for endpoint in endpoints])
    ids = [delivery.id for delivery in deliveries]
    # robust: the event is committed; a broker that is down leaves it to the sweep.
    transaction.on_commit(lambda: send_deliveries_later(ids), robust=True)
    logger.info("webhook event %s %s batch_id=%s deliveries=%d", event_id, event_type,
                batch_id, len(ids))
    return ids


def send_deliveries_later(delivery_ids: list[str]) -> None:
    publish("webhooks.send_deliveries", (delivery_ids,), queue=QueueName.CONTROL.value)


@retry_transient
def deliveries_resend(*, delivery_ids: Iterable[str]) -> int:
    """Send deliveries again (the admin's resend): due now, with a fresh day of
    retries, whatever their status. Returns how many."""
    ids = list(delivery_ids)
    now = timezone.now()
    with transaction.atomic():
        count = WebhookDelivery.objects.filter(id__in=ids).update(
            status=DeliveryStatus.PENDING, next_attempt_at=now, delivered_at=None,
            give_up_at=now + timedelta(seconds=settings.BATCHGEN_WEBHOOK_MAX_AGE_SECONDS))
        transaction.on_commit(lambda: send_deliveries_later(ids), robust=True)
    return count


# --- delivery ---------------------------------------------------------------------------


def retry_delay(attempt: int) -> float:
    """Seconds before the next try after `attempt` failed ones: exponential from
    BATCHGEN_WEBHOOK_RETRY_FIRST_SECONDS, capped at ..._RETRY_MAX_SECONDS, plus up to
    one first delay of jitter (so a receiver back from an outage is not hit by all
    its retries in the same second)."""
    first = settings.BATCHGEN_WEBHOOK_RETRY_FIRST_SECONDS
    wait = tenacity.wait_exponential_jitter(
        multiplier=first, max=settings.BATCHGEN_WEBHOOK_RETRY_MAX_SECONDS, jitter=first)
    state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})
    state.attempt_number = max(attempt, 1)
    return wait(state)


def _lease() -> timedelta:
    # An attempt's phases (connect, write, read) each have the timeout; past three
    # of them and a margin, its sender is taken for dead and the row is due again.
    return timedelta(seconds=3 * settings.BATCHGEN_WEBHOOK_TIMEOUT_SECONDS + 30)


@retry_transient
def deliveries_claim(*, delivery_ids: Iterable[str] | None = None,
                     limit: int = CLAIM_SIZE) -> list[sender.Attempt]:
    """Take due deliveries for one attempt each. SKIP LOCKED: control workers that
    sweep at once each get different rows, and never wait on each other. Locks only
    delivery rows (docs/architecture.md, "Locks": after Batch and WebhookEndpoint)."""
    now = timezone.now()
    due = WebhookDelivery.objects.filter(
        status=DeliveryStatus.PENDING, next_attempt_at__lte=now, endpoint__enabled=True)
    if delivery_ids is not None:
        due = due.filter(id__in=list(delivery_ids))
    if not due.exists():
        # A plain read first: an idle sweep then takes no write lock (on SQLite a
        # write transaction holds the whole database, against the workers' flushes).
        return []
    with transaction.atomic():
        ids = list(due.select_for_update(skip_locked=True, of=("self",))
                   .order_by("next_attempt_at", "id").values_list("id", flat=True)[:limit])
        if not ids:
            return []
        WebhookDelivery.objects.filter(id__in=ids).update(
            attempts=F("attempts") + 1, next_attempt_at=now + _lease(), last_attempt_at=now)
        claimed = WebhookDelivery.objects.filter(id__in=ids).select_related("endpoint")
        return [sender.Attempt(delivery_id=d.id, attempt=d.attempts, url=d.endpoint.url,
                               body=d.body, secrets=_signing_secrets(d.endpoint))
                for d in claimed]


@retry_transient
def delivery_record(*, attempt: sender.Attempt, outcome: sender.Outcome) -> str | None:
    """Record one attempt's outcome, if the delivery is still that attempt's (a
    resend or a later claim wins over a late answer). Returns the new status."""
    now = timezone.now()
    mine = WebhookDelivery.objects.filter(id=attempt.delivery_id, attempts=attempt.attempt,
                                          status=DeliveryStatus.PENDING)
    if outcome.delivered:
        updated = mine.update(status=DeliveryStatus.DELIVERED, delivered_at=now,
                              last_status_code=outcome.status_code, last_error="")
        return DeliveryStatus.DELIVERED if updated else None
    if outcome.not_allowed:
        # Nothing was sent, and a retry would be refused the same way: failed at
        # once, the reason in the log (resend it once the URL or the allow-list
        # changes).
        moved = mine.update(status=DeliveryStatus.FAILED, last_status_code=None,
                            last_error=f"{outcome.error} (not retried)"[:2000])
        if moved:
            logger.warning("webhook delivery %s attempt %d: %s -> failed", attempt.delivery_id,
                           attempt.attempt, outcome.error)
        return DeliveryStatus.FAILED if moved else None
    next_at = now + timedelta(seconds=retry_delay(attempt.attempt))
    gone = outcome.status_code == 410
    if gone:
        status, error = DeliveryStatus.FAILED, f"{outcome.error} (endpoint disabled)"
    else:
        status, error = DeliveryStatus.PENDING, outcome.error
    updated = mine.filter(give_up_at__gte=next_at) if not gone else mine
    moved = updated.update(status=status, next_attempt_at=next_at,
                           last_status_code=outcome.status_code, last_error=error[:2000])
    if not moved:
        # Past its last chance (or no longer this attempt's): give up if it is ours.
        moved = mine.update(status=DeliveryStatus.FAILED, last_status_code=outcome.status_code,
                            last_error=f"{error[:2000]} (gave up after {attempt.attempt} "
                                       "attempts)")
        status = DeliveryStatus.FAILED
    if moved and gone:
        _endpoint_gone(delivery_id=attempt.delivery_id)
    if moved:
        logger.warning("webhook delivery %s attempt %d: %s -> %s", attempt.delivery_id,
                       attempt.attempt, outcome.error or outcome.status_code, status)
    return status if moved else None


def _endpoint_gone(*, delivery_id: str) -> None:
    """410 Gone: the receiver says it will never take events again. Disable its
    endpoint and fail what waits for it (an operator may enable it again)."""
    endpoint_id = WebhookDelivery.objects.filter(id=delivery_id).values_list(
        "endpoint_id", flat=True).first()
    with transaction.atomic():  # lock order: the endpoint, then its deliveries
        WebhookEndpoint.objects.filter(id=endpoint_id).update(
            enabled=False, disabled_reason="The receiver answered 410 Gone.",
            updated_at=timezone.now())
        WebhookDelivery.objects.filter(endpoint_id=endpoint_id,
                                       status=DeliveryStatus.PENDING).update(
            status=DeliveryStatus.FAILED, last_error="endpoint disabled: 410 Gone")
    logger.warning("webhook endpoint %s disabled: its receiver answered 410 Gone", endpoint_id)


def deliveries_give_up() -> int:
    """Fail pending deliveries past their last chance that no attempt will reach (an
    endpoint disabled meanwhile)."""
    stale = WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING,
                                           give_up_at__lt=timezone.now() - _lease())
    if not stale.exists():  # a read: an idle sweep writes nothing
        return 0
    return stale.update(status=DeliveryStatus.FAILED,
                        last_error="gave up: no attempt before its last chance")


def deliveries_send(*, delivery_ids: Iterable[str] | None = None,
                    limit: int = CLAIM_SIZE) -> dict[str, int]:
    """Claim due deliveries (those named, or any) and send them concurrently;
    returns how many ended in each status."""
    attempts = deliveries_claim(delivery_ids=delivery_ids, limit=limit)
    counts: dict[str, int] = {}
    if not attempts:
        return counts
    with sender.http_client(timeout=settings.BATCHGEN_WEBHOOK_TIMEOUT_SECONDS) as client, \
            ThreadPoolExecutor(max_workers=min(SEND_THREADS, len(attempts)),
                               thread_name_prefix="webhook") as pool:
        outcomes = pool.map(lambda attempt: sender.post(client, attempt), attempts)
        for attempt, outcome in zip(attempts, outcomes, strict=True):
            status = delivery_record(attempt=attempt, outcome=outcome) or "superseded"
            counts[status] = counts.get(status, 0) + 1
    return counts


def deliveries_sweep(*, rounds: int = 10) -> dict[str, int]:
    """The periodic look for due retries (and for first attempts whose publish was
    lost): a few rounds of claims, so a backlog drains without one task holding a
    control thread for long."""
    totals: dict[str, int] = {}
    gave_up = deliveries_give_up()
    if gave_up:
        totals[DeliveryStatus.FAILED] = gave_up
    for _ in range(rounds):
        counts = deliveries_send()
        for status, count in counts.items():
            totals[status] = totals.get(status, 0) + count
        if sum(counts.values()) < CLAIM_SIZE:
            break
    return totals
