"""BatchGen client: a Python client and `batchgen` command for a BatchGen server.

    from batchgen import BatchGenHttpClient
    from batchgen import webhooks   # webhooks.verify(body, headers, secret)
"""

from batchgen import webhooks
from batchgen._version import __version__
from batchgen.batchgen_client import BatchGenHttpClient
from batchgen.errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    BatchFailedError,
    BatchGenError,
    ConflictError,
    NoOutputError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    QuotaExceededError,
    RateLimitError,
    ServerError,
    ServiceUnavailableError,
    WaitTimeoutError,
)

__all__ = [
    "__version__",
    "BatchGenHttpClient",
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "BatchFailedError",
    "BatchGenError",
    "ConflictError",
    "NoOutputError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "QuotaExceededError",
    "RateLimitError",
    "ServerError",
    "ServiceUnavailableError",
    "WaitTimeoutError",
    "webhooks",
]
