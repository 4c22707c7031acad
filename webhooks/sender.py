"""One delivery attempt over HTTP: no database here, so attempts can run on threads
while the caller records their outcomes."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from django.utils import timezone

from webhooks.signing import signed_headers

USER_AGENT = "BatchGen-Webhooks/1"
# How much of a refusing receiver's answer is kept in the log (last_error).
ERROR_BODY_BYTES = 500


@dataclass(frozen=True)
class Attempt:
    delivery_id: str
    attempt: int  # the attempt number the claim gave it (fences a late answer)
    url: str
    body: str
    secrets: list[str]


@dataclass(frozen=True)
class Outcome:
    status_code: int | None  # None: no answer (refused, timed out, reset)
    error: str = ""

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def http_client(*, timeout: float) -> httpx.Client:
    # A redirect is not followed: a receiver answers where it was registered
    # (and following one would let a receiver point the server anywhere).
    return httpx.Client(timeout=httpx.Timeout(timeout), follow_redirects=False,
                        headers={"user-agent": USER_AGENT})


def post(client: httpx.Client, attempt: Attempt) -> Outcome:
    """POST the signed event; 2xx is delivered, anything else is for a retry."""
    headers = {"content-type": "application/json",
               **signed_headers(message_id=attempt.delivery_id, body=attempt.body,
                                secrets_=attempt.secrets, at=timezone.now())}
    try:
        with client.stream("POST", attempt.url, content=attempt.body.encode(),
                           headers=headers) as response:
            if 200 <= response.status_code < 300:
                return Outcome(response.status_code)
            head = b""
            for piece in response.iter_bytes():
                head += piece
                if len(head) >= ERROR_BODY_BYTES:
                    break
            text = head[:ERROR_BODY_BYTES].decode(errors="replace")
            return Outcome(response.status_code, f"HTTP {response.status_code}: {text}".strip())
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        return Outcome(None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
