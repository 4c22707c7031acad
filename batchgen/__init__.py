"""BatchGen client: a Python client and `batchgen` command for a BatchGen server.

    from batchgen import BatchGenHttpClient
    from batchgen import webhooks   # webhooks.verify(body, headers, secret)
    from batchgen.types import Batch, FileObject   # what client.batches/.files return
"""

from batchgen import types, webhooks
from batchgen._version import __version__
from batchgen.batchgen_client import BatchGenHttpClient
from batchgen.errors import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    BatchFailedError,
    BatchGenError,
    ConflictError,
    InternalServerError,
    NoOutputError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    QuotaExceededError,
    RateLimitError,
    ServerError,
    ServiceUnavailableError,
    UnprocessableEntityError,
    WaitTimeoutError,
)
from batchgen.pagination import BatchErrorPage, CursorPage

__all__ = [
    "__version__",
    "BatchGenHttpClient",
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "BatchFailedError",
    "BatchErrorPage",
    "BatchGenError",
    "ConflictError",
    "CursorPage",
    "InternalServerError",
    "NoOutputError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "QuotaExceededError",
    "RateLimitError",
    "ServerError",
    "ServiceUnavailableError",
    "UnprocessableEntityError",
    "WaitTimeoutError",
    "types",
    "webhooks",
]
