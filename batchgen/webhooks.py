"""Verifying BatchGen's webhooks in a receiver.

BatchGen signs each webhook as OpenAI does (Standard Webhooks): the headers
`webhook-id`, `webhook-timestamp` and `webhook-signature`, an HMAC-SHA256 keyed with
the endpoint's `whsec_...` secret. Verify the raw body, before parsing it:

    from batchgen import webhooks

    event = webhooks.verify(request.body, request.headers, secret="whsec_...")
    if event["type"] == "batch.completed":
        fetch(event["data"]["output_file_id"])

Delivery is at least once: a retry carries the same `webhook-id`, so a receiver that
must act once keeps the ids it has handled.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from batchgen.errors import BatchGenError

# How far a webhook's timestamp may be from now (a replayed old message is refused).
TOLERANCE_SECONDS = 300  # the Standard Webhooks library's fixed window; OpenAI's default


class InvalidWebhookSignatureError(BatchGenError):
    """The webhook is not from a server holding the secret, or it is too old or new."""


def verify(payload: bytes | str, headers: Mapping[str, str], secret: str) -> dict[str, Any]:
    """The event (`{"id", "object": "event", "type", "created_at", "data"}`) if the
    signature of `payload` is one of `secret`'s and its timestamp is within five
    minutes of now; raises InvalidWebhookSignatureError otherwise."""
    try:
        Webhook(secret).verify(payload, dict(headers.items()), json_parse=False)
    except WebhookVerificationError as exc:
        raise InvalidWebhookSignatureError(str(exc)) from None
    except (ValueError, binascii.Error) as exc:  # a malformed header or secret
        raise InvalidWebhookSignatureError(f"malformed webhook signature or secret: {exc}") \
            from None
    return json.loads(payload)
