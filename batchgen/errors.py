"""Typed errors raised by the BatchGen client.

    BatchGenError
    ├── APIConnectionError          the server could not be reached
    │   └── APITimeoutError         ... or did not answer in time
    ├── APIError                    the server answered 4xx/5xx (OpenAI error envelope);
    │   │                           also named APIStatusError, as in openai-python
    │   ├── BadRequestError         400
    │   ├── AuthenticationError     401
    │   ├── PermissionDeniedError   403
    │   ├── NotFoundError           404
    │   ├── ConflictError           409
    │   ├── PayloadTooLargeError    413
    │   ├── UnprocessableEntityError  422
    │   ├── RateLimitError          429, after the retries (also a RuntimeError)
    │   │   └── QuotaExceededError  429 quota_exceeded: the API key is over its quota
    │   └── ServerError             5xx (also named InternalServerError)
    │       └── ServiceUnavailableError  503, after the retries when it had Retry-After
    ├── BatchFailedError            a batch ended failed/cancelled/expired (RuntimeError)
    ├── WaitTimeoutError            a wait passed its timeout (TimeoutError)
    └── NoOutputError               a batch has no output file to read
"""

from __future__ import annotations

import json
from typing import Any

import httpx


class BatchGenError(Exception):
    """Base class of every error the client raises."""


class APIConnectionError(BatchGenError):
    """The request never got an HTTP answer (refused, reset, DNS, TLS...)."""


class APITimeoutError(APIConnectionError):
    """The request timed out (see `timeout_s`)."""


class APIError(BatchGenError):
    """The server answered with an HTTP error status.

    `body` is the parsed JSON body (normally `{"error": {message, type, param, code}}`)
    or None when the body was not JSON; `message`, `type`, `param` and `code` are
    lifted from the envelope when it is there.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        body: Any = None,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: httpx.Headers | None = None,
        method: str | None = None,
        url: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.body = body
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers if headers is not None else httpx.Headers()
        self.method = method
        self.url = url

    def __str__(self) -> str:
        code = f" [{self.code}]" if self.code else ""
        return f"HTTP {self.status_code}{code}: {self.message}"


class BadRequestError(APIError):
    pass


class AuthenticationError(APIError):
    pass


class PermissionDeniedError(APIError):
    pass


class NotFoundError(APIError):
    pass


class ConflictError(APIError):
    pass


class PayloadTooLargeError(APIError):
    pass


class UnprocessableEntityError(APIError):
    pass


class RateLimitError(APIError, RuntimeError):
    """HTTP 429. Raised only once the retries are spent; `retry_after` is the last
    server hint in seconds (None when the header was absent or unreadable)."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any):
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class QuotaExceededError(RateLimitError):
    """HTTP 429 `quota_exceeded`: the API key is over one of its quotas (requests in
    the intake pool, or tokens for the UTC day). Raised at once when `retry_after` is
    longer than the client waits (a daily quota frees at midnight UTC), else once the
    retries are spent."""


class ServerError(APIError):
    pass


class ServiceUnavailableError(ServerError):
    """HTTP 503 (`server_busy`, `database_busy`). Retried like a 429 when the server
    sent `Retry-After`; `retry_after` is the last hint in seconds (None: none sent)."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any):
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


# openai-python's names for the same classes, so code written for its errors reads
# the same here (`except batchgen.APIStatusError as exc: exc.status_code, exc.code`).
APIStatusError = APIError
InternalServerError = ServerError


class BatchFailedError(BatchGenError, RuntimeError):
    """A batch reached `failed`, `cancelled` or `expired` instead of `completed`.

    `batch` is the final batch object; partial results may still be downloadable
    from `batch["output_file_id"]`.
    """

    def __init__(self, batch: dict):
        self.batch = batch
        self.status = batch.get("status")
        super().__init__(describe_batch_failure(batch))


class WaitTimeoutError(BatchGenError, TimeoutError):
    """A wait ran past its timeout; the batch keeps running on the server.
    `batch` is the last object seen."""

    def __init__(self, message: str, *, batch: dict | None = None):
        super().__init__(message)
        self.batch = batch


class NoOutputError(BatchGenError):
    """The batch has no output file (yet): it has not finished, or produced nothing."""


_STATUS_ERRORS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}
QUOTA_EXCEEDED = "quota_exceeded"

# Enough of a non-JSON body (an HTML error page, a proxy message) to recognise it.
_TEXT_SNIPPET = 300


def error_from_response(response: httpx.Response, *, retry_after: float | None = None) -> APIError:
    """The typed error for an HTTP error response whose body has been read."""
    status = response.status_code
    body: Any = None
    message = type_ = param = code = None
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        text = response.text.strip()
        message = text[:_TEXT_SNIPPET] if text else None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        envelope = body["error"]
        message = _as_text(envelope.get("message"))
        type_ = _as_text(envelope.get("type"))
        param = _as_text(envelope.get("param"))
        code = _as_text(envelope.get("code"))
    elif body is not None:
        message = json.dumps(body)[:_TEXT_SNIPPET]
    if not message:
        message = response.reason_phrase or "error"

    cls = _STATUS_ERRORS.get(status) or (ServerError if status >= 500 else APIError)
    kwargs: dict[str, Any] = dict(
        status_code=status, body=body, type=type_, param=param, code=code,
        headers=response.headers, method=response.request.method, url=str(response.request.url),
    )
    if cls is RateLimitError and code == QUOTA_EXCEEDED:
        cls = QuotaExceededError
    if issubclass(cls, (RateLimitError, ServiceUnavailableError)):
        kwargs["retry_after"] = retry_after
    return cls(message, **kwargs)


def describe_batch_failure(batch: dict) -> str:
    """One line saying how a batch ended and why."""
    text = f"batch {batch.get('id')} ended {batch.get('status')}"
    error = batch.get("error")
    if isinstance(error, dict) and (error.get("code") or error.get("message")):
        text += ": " + ": ".join(str(v) for v in (error.get("code"), error.get("message")) if v)
    errors = (batch.get("errors") or {}).get("data") or []
    if errors:
        first = errors[0]
        line = f"line {first.get('line')} " if first.get("line") is not None else ""
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        text += f"; {line}{first.get('code')}: {first.get('message')}{more}"
    return text


def _as_text(value: Any) -> str | None:
    return None if value is None else str(value)
