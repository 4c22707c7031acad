"""HTTP client for a BatchGen server (OpenAI-compatible Batch API).

Needs only httpx, tenacity and tqdm:

    from batchgen.batchgen_client import BatchGenHttpClient

    with BatchGenHttpClient("http://localhost:10900") as client:
        batch = client.submit_batch("input.jsonl", "output.jsonl", max_decoding_length=4096)

Every call retries HTTP 429 and HTTP 503 with Retry-After (see `batchgen._retry`;
a 429 `quota_exceeded` that lasts longer than a minute is raised at once as
QuotaExceededError); other failures raise the typed errors of `batchgen.errors`,
re-exported here. The dict methods live per resource in `batchgen._methods`.
"""

from __future__ import annotations

from functools import cached_property

from batchgen._base_client import DEFAULT_BASE_URL, BaseClient
from batchgen._methods import (  # noqa: F401 (the constants: this module's, as before)
    DEFAULT_ENDPOINT,
    FAILED_STATUSES,
    TERMINAL_STATUSES,
    FileMethods,
    PathLike,
    ResultMethods,
    WebhookMethods,
)
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
from batchgen.resources import Batches, Files, Models, Pool, WebhookEndpoints

__all__ = [
    "BatchGenHttpClient",
    "DEFAULT_BASE_URL",
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "BatchFailedError",
    "BatchGenError",
    "ConflictError",
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
]

# What a batch's `endpoint` may be; which of them the server runs depends on its model
# (a chat model: chat completions, completions and responses; an embedding model:
# /v1/embeddings).
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")


class BatchGenHttpClient(FileMethods, ResultMethods, WebhookMethods, BaseClient):
    """A BatchGen server at `base_url` (default `$BATCHGEN_BASE_URL`, else
    http://localhost:10900; a trailing `/v1` is accepted too).

    `timeout_s` bounds every request phase; None means no limit except 10 s to
    connect. `api_key` (default `$BATCHGEN_API_KEY`) is sent as a bearer token.
    """

    # -- typed resources (batchgen.resources): typed objects, cursor pages ---------------

    @cached_property
    def files(self) -> Files:
        return Files(self)

    @cached_property
    def batches(self) -> Batches:
        return Batches(self)

    @cached_property
    def models(self) -> Models:
        return Models(self)

    @cached_property
    def pool(self) -> Pool:
        return Pool(self)

    @cached_property
    def webhook_endpoints(self) -> WebhookEndpoints:
        return WebhookEndpoints(self)

    # -- the user's guide's dict methods: files, batches, results and webhook endpoints
    # are batchgen._methods'; the server's are here.

    # -- server ------------------------------------------------------------------------

    def health_check(self) -> bool:
        """True if the server answers /health with 200; False otherwise, never raises."""
        try:
            return self._send(lambda: self._http.get("/health")).status_code == 200
        except BatchGenError:
            return False

    def pool_status(self) -> dict:
        return self._json("GET", "/v1/pool/status")

    def list_models(self) -> dict:
        return self._json("GET", "/v1/models")

    def get_model(self, model_id: str) -> dict:
        return self._json("GET", f"/v1/models/{model_id}")
