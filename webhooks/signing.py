"""Standard Webhooks signatures, as OpenAI's webhooks carry them.

`webhook-signature: v1,<base64 HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}">`,
keyed with the base64-decoded part of the endpoint's `whsec_...` secret. The HMAC is
the `standardwebhooks` package's (the specification's reference library); this module
only makes secrets and assembles the headers."""

from __future__ import annotations

import base64
import secrets
from datetime import datetime

from standardwebhooks.webhooks import Webhook

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # the key of an HMAC-SHA256: its block is larger, its output 32 bytes


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def signed_headers(*, message_id: str, body: str, secrets_: list[str],
                   at: datetime) -> dict[str, str]:
    """The three Standard Webhooks headers; one signature per secret (two while a
    rotated secret is still honoured), space-separated as the specification allows."""
    timestamp = at.replace(microsecond=0)
    signature = " ".join(Webhook(secret).sign(message_id, timestamp, body)
                         for secret in secrets_)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": signature,
    }
