"""`client.webhook_endpoints`: OpenAI's /v1/webhook_endpoints (`batchgen.webhooks`
verifies what they receive)."""

from __future__ import annotations

from batchgen.pagination import CursorPage
from batchgen.resources._base import Resource
from batchgen.types import (
    WebhookEndpoint,
    WebhookEndpointDeleted,
    WebhookEndpointTestResult,
    WebhookEndpointWithSecret,
)


class WebhookEndpoints(Resource):
    def create(self, *, url: str, event_types: list[str] | None = None,
               name: str | None = None) -> WebhookEndpointWithSecret:
        """Register a receiver; the answer's `signing_secret` is shown only now."""
        return WebhookEndpointWithSecret.construct(
            self._client.create_webhook_endpoint(url, event_types=event_types, name=name))

    def retrieve(self, endpoint_id: str) -> WebhookEndpoint:
        return WebhookEndpoint.construct(self._client.get_webhook_endpoint(endpoint_id))

    def update(self, endpoint_id: str, *, url: str | None = None,
               event_types: list[str] | None = None, name: str | None = None,
               enabled: bool | None = None) -> WebhookEndpoint:
        return WebhookEndpoint.construct(self._client.update_webhook_endpoint(
            endpoint_id, url=url, event_types=event_types, name=name, enabled=enabled))

    def list(self, *, limit: int | None = None,
             after: str | None = None) -> CursorPage[WebhookEndpoint]:
        def fetch(cursor: str | None) -> CursorPage[WebhookEndpoint]:
            page = self._client.list_webhook_endpoints(limit=limit, after=cursor)
            return CursorPage.build(page, WebhookEndpoint, fetch)

        return fetch(after)

    def delete(self, endpoint_id: str) -> WebhookEndpointDeleted:
        return WebhookEndpointDeleted.construct(self._client.delete_webhook_endpoint(endpoint_id))

    def rotate_secret(self, endpoint_id: str, *, keep_old_secret_active_for_24_hours: bool = False
                      ) -> WebhookEndpointWithSecret:
        return WebhookEndpointWithSecret.construct(self._client.rotate_webhook_secret(
            endpoint_id, keep_old_for_24_hours=keep_old_secret_active_for_24_hours))

    def test(self, endpoint_id: str, *, event_type: str = "batch.completed"
             ) -> WebhookEndpointTestResult:
        """Have the server send a sample event now."""
        return WebhookEndpointTestResult.construct(
            self._client.test_webhook_endpoint(endpoint_id, event_type))
