from __future__ import annotations

from django.db.models import QuerySet

from batchgen_site.pagination import invalid_cursor
from webhooks.models import WebhookEndpoint


def endpoint_list(*, after: str | None, owner=None) -> QuerySet[WebhookEndpoint]:
    """Newest first, as OpenAI lists them; with an owner, only that key's."""
    endpoints = WebhookEndpoint.objects.order_by("-id")
    if owner is not None:
        endpoints = endpoints.filter(owner=owner)
    if after:
        if not endpoints.filter(id=after).exists():
            raise invalid_cursor(after, kind="webhook endpoint")
        endpoints = endpoints.filter(id__lt=after)
    return endpoints
