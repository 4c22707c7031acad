"""Signatures as Standard Webhooks defines them and OpenAI's SDK checks them."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import openai
import pytest

from batchgen import webhooks as client_webhooks
from webhooks.signing import new_secret, signed_headers

BODY = json.dumps({"id": "evt_1", "object": "event", "type": "batch.completed",
                   "created_at": 1, "data": {"id": "batch_1"}})


def test_signature_matches_the_specifications_test_vector():
    # The example of the Standard Webhooks specification (and svix's libraries).
    headers = signed_headers(message_id="msg_p5jXN8AQM9LWM0D4loKWxJek",
                             body='{"test": 2432232314}',
                             secrets_=["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
                             at=datetime.fromtimestamp(1614265330, tz=UTC))
    assert headers == {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }


def test_the_openai_sdk_verifies_and_unwraps_our_events():
    secret = new_secret()
    headers = signed_headers(message_id="msg_1", body=BODY, secrets_=[secret],
                             at=datetime.now(UTC))
    client = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:1/v1")
    client.webhooks.verify_signature(BODY, headers, secret=secret)
    event = client.webhooks.unwrap(BODY, headers, secret=secret)
    assert event.type == "batch.completed" and event.data.id == "batch_1"
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.verify_signature(BODY, headers, secret=new_secret())


def test_a_rotated_secret_kept_for_a_day_signs_beside_the_new_one():
    old, new = new_secret(), new_secret()
    headers = signed_headers(message_id="msg_2", body=BODY, secrets_=[new, old],
                             at=datetime.now(UTC))
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        assert client_webhooks.verify(BODY.encode(), headers, secret)["id"] == "evt_1"
        openai.OpenAI(api_key="x").webhooks.verify_signature(BODY, headers, secret=secret)


def test_client_verify_returns_the_event_and_refuses_tampering_and_old_messages():
    secret = new_secret()
    headers = signed_headers(message_id="msg_3", body=BODY, secrets_=[secret],
                             at=datetime.now(UTC))
    assert client_webhooks.verify(BODY, headers, secret)["data"] == {"id": "batch_1"}
    refused = [
        (BODY.replace("batch_1", "batch_2"), headers, secret),  # body changed
        (BODY, headers, new_secret()),  # another secret
        (BODY, {**headers, "webhook-id": "msg_other"}, secret),  # id changed
        (BODY, {**headers, "webhook-signature": "v1,not base64!"}, secret),  # malformed
        (BODY, {k: v for k, v in headers.items() if k != "webhook-signature"}, secret),
    ]
    stale = signed_headers(message_id="msg_3", body=BODY, secrets_=[secret],
                           at=datetime.fromtimestamp(time.time() - 301, tz=UTC))
    refused.append((BODY, stale, secret))
    for payload, hdrs, key in refused:
        with pytest.raises(client_webhooks.InvalidWebhookSignatureError):
            client_webhooks.verify(payload, hdrs, key)
