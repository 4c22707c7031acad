"""Webhook tasks: thin wrappers on the control queue, published by name
(webhooks.services.send_deliveries_later, the beat schedule in core/celery.py)."""

from __future__ import annotations

from celery import shared_task

from webhooks import services

# A task claims at most services.CLAIM_SIZE deliveries and sends them on
# SEND_THREADS threads: a few attempt timeouts at most; the limit stops a runaway.
# Not acks_late: a lost task loses nothing, the rows are the outbox and the sweep
# sends whatever is due.


@shared_task(name="webhooks.send_deliveries", time_limit=600)
def send_deliveries(delivery_ids: list[str]) -> dict[str, int]:
    return services.deliveries_send(delivery_ids=delivery_ids)


@shared_task(name="webhooks.sweep_deliveries", time_limit=600)
def sweep_deliveries() -> dict[str, int]:
    return services.deliveries_sweep()
