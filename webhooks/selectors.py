from __future__ import annotations

from django.db.models import QuerySet

from core.pagination import newest_first
from webhooks.models import WebhookEndpoint


def endpoint_list(*, after: str | None, owner=None) -> QuerySet[WebhookEndpoint]:
    """Newest first, as OpenAI lists them; with an owner, only that key's."""
    return newest_first(WebhookEndpoint.objects.all(), after=after, owner=owner,
                        kind="webhook endpoint")
