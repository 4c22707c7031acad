"""One delivery attempt over HTTP: no database here, so attempts can run on threads
while the caller records their outcomes.

Every connection goes through webhooks.destinations' policy, on the address it is
made to: the network backend below resolves the host once, checks every address,
and connects to exactly a checked one. TLS still names the host (httpcore starts it
with the URL's host as server_hostname: SNI and certificate verification for the
name, not the address), and the Host header is the URL's."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import httpcore
import httpx
from django.utils import timezone

from webhooks import destinations
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
    # The destination policy refused the address: nothing was sent, and a retry
    # would be refused the same way.
    not_allowed: bool = False

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class CheckedBackend(httpcore.SyncBackend):
    """httpcore's socket backend, connecting only to addresses the destination
    policy allows for this scheme (one backend per scheme: plain http is allowed to
    fewer places)."""

    def __init__(self, *, scheme: str, allowed: destinations.AllowList) -> None:
        self.scheme = scheme
        self.allowed = allowed

    def connect_tcp(self, host, port, timeout=None, local_address=None,
                    socket_options=None):
        # Resolved once here, and the socket connects to that very address: a second
        # lookup (socket.create_connection's own) could answer differently.
        addresses = destinations.resolve(host, port)
        destinations.check_addresses(addresses, host=host, scheme=self.scheme,
                                     allowed=self.allowed)
        failure: Exception | None = None
        for address in addresses:  # as create_connection would: the next on failure
            try:
                return super().connect_tcp(str(address), port, timeout, local_address,
                                           socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        raise failure


def ssl_context() -> ssl.SSLContext:
    """The receivers' certificates are verified as httpx does by default."""
    return httpx.create_ssl_context()


class CheckedTransport(httpx.HTTPTransport):
    def __init__(self, *, scheme: str, allowed: destinations.AllowList) -> None:
        context = ssl_context()
        super().__init__(verify=context, trust_env=False)
        # httpx's transport takes no network backend of its own; its pool is the
        # httpcore ConnectionPool it would build, with the checking backend.
        self._pool = httpcore.ConnectionPool(  # httpx's default limits
            ssl_context=context, max_connections=100, max_keepalive_connections=20,
            keepalive_expiry=5.0, network_backend=CheckedBackend(scheme=scheme, allowed=allowed))


def http_client(*, timeout: float) -> httpx.Client:
    # A redirect is not followed: a receiver answers where it was registered
    # (and following one would let a receiver point the server anywhere).
    # trust_env=False: no proxy from the environment (it would be the address
    # connected to, unchecked) and no .netrc credentials sent to receivers.
    # Both schemes have a checking transport: no request leaves unchecked.
    allowed = destinations.allowed_destinations()
    return httpx.Client(
        timeout=httpx.Timeout(timeout), follow_redirects=False, trust_env=False,
        headers={"user-agent": USER_AGENT},
        transport=CheckedTransport(scheme="https", allowed=allowed),
        mounts={"http://": CheckedTransport(scheme="http", allowed=allowed)})


def post(client: httpx.Client, attempt: Attempt) -> Outcome:
    """POST the signed event; 2xx is delivered, anything else is for a retry (a name
    that does not resolve now included), but a destination the policy refuses
    (nothing sent)."""
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
    except destinations.LookupFailed as exc:
        return Outcome(None, f"LookupFailed: {exc}")  # tried again, as a refused connection
    except destinations.DestinationRefused as exc:
        return Outcome(None, f"not allowed: {exc}", not_allowed=True)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        return Outcome(None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
