from __future__ import annotations

from django.db import models
from django.utils import timezone

# The events a webhook endpoint may subscribe to: OpenAI's batch events whose
# status BatchGen has (a batch past its window becomes `failed`, so there is no
# `batch.expired`; docs/architecture.md, "Decisions").
EVENT_OF_STATUS = {
    "completed": "batch.completed",
    "failed": "batch.failed",
    "cancelled": "batch.cancelled",
}
EVENT_TYPES = tuple(EVENT_OF_STATUS.values())


def all_event_types() -> list[str]:
    return list(EVENT_TYPES)


class WebhookEndpoint(models.Model):
    """A URL that is sent signed events. With an owner (an API key) it hears only
    that key's batches; without one it is server-wide and hears every batch."""

    id = models.CharField(primary_key=True, max_length=64)  # "we_..."
    name = models.CharField(max_length=200, blank=True, default="")
    url = models.URLField(max_length=2000)
    # "whsec_" + base64 of 32 random bytes (Standard Webhooks). Kept in clear: it
    # signs every delivery. The API and the admin show it once, at create/rotate.
    secret = models.CharField(max_length=100)
    # After a rotation that keeps the old secret for a day, deliveries carry a
    # signature with each (the Standard Webhooks header holds several).
    previous_secret = models.CharField(max_length=100, blank=True, default="")
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    owner = models.ForeignKey("core.ApiKey", on_delete=models.CASCADE, null=True,
                              blank=True, related_name="+",
                              help_text="Empty: server-wide, sent every batch's events.")
    event_types = models.JSONField(default=all_event_types)
    enabled = models.BooleanField(default=True)
    # Why it was disabled by the server (a receiver that answered 410 Gone).
    disabled_reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]
        verbose_name = "webhook endpoint"

    def __str__(self) -> str:
        return f"{self.name or self.id} → {self.url}"

    @property
    def secret_hint(self) -> str:
        return f"whsec_…{self.secret[-4:]}" if self.secret else ""


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # due at next_attempt_at (also while an attempt is under way)
    DELIVERED = "delivered"  # the receiver answered 2xx: never sent again by itself
    FAILED = "failed"  # given up (too old, or the endpoint went away)


class WebhookDelivery(models.Model):
    """One event for one endpoint: the outbox row, written in the transaction that
    ended the batch, and the delivery log. Its id is the `webhook-id` every attempt
    carries, so a receiver can drop a duplicate."""

    id = models.CharField(primary_key=True, max_length=64)  # "msg_..."
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE,
                                 related_name="deliveries")
    event_id = models.CharField(max_length=64, db_index=True)  # "evt_...", the body's id
    event_type = models.CharField(max_length=64)
    batch_id = models.CharField(max_length=64, db_index=True)
    # The exact bytes sent (and signed), frozen when the event happened.
    body = models.TextField()
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices,
                              default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # When it is due; while an attempt runs, the end of that attempt's lease (a
    # sender that dies leaves it to be picked up again then).
    next_attempt_at = models.DateTimeField(default=timezone.now)
    give_up_at = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "webhook deliveries"
        indexes = [
            # The sweep's query: the due ones among the few pending.
            models.Index(fields=["next_attempt_at"], name="webhook_delivery_due",
                         condition=models.Q(status="pending")),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.batch_id} → {self.endpoint_id}"
