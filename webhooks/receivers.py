"""Signal receivers: thin, they call a service."""

from __future__ import annotations

from webhooks import services


def record_batch_event(sender, *, batch_id: str, status: str, **kwargs) -> None:
    services.webhook_event_record(batch_id=batch_id, status=status)
