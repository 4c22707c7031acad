"""Typed objects the client's resources return (`client.batches.retrieve(...)` is a
`Batch`), one per component of the server's OpenAPI schema (`__component__`).

Attributes give the typed view (`batch.request_counts.completed`); item access gives
the JSON as the server sent it (`batch["request_counts"]["completed"]`). See
`batchgen._models` for the rules, tests/client/test_types_schema.py for the check
that keeps these fields equal to the server's serializers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batchgen._models import BaseObject

__all__ = [
    "AdaptiveConcurrency",
    "Batch",
    "BatchError",
    "BatchErrors",
    "BatchUsage",
    "FileDeleted",
    "FileObject",
    "InputTokensDetails",
    "Model",
    "ModelPoolStatus",
    "Multiplexing",
    "OutputTokensDetails",
    "PoolStatus",
    "RequestCounts",
    "WebhookEndpoint",
    "WebhookEndpointDeleted",
    "WebhookEndpointTestResult",
    "WebhookEndpointWithSecret",
]

_typed = dataclass(kw_only=True, eq=False, repr=False)


# -- files ------------------------------------------------------------------------------


@_typed
class FileObject(BaseObject):
    __component__ = "FileOutput"
    id: str
    object: str
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: str
    checksum: str
    status: str | None = None


@_typed
class FileDeleted(BaseObject):
    __component__ = "FileDeleted"
    id: str
    deleted: bool
    object: str | None = None


# -- batches ----------------------------------------------------------------------------


@_typed
class RequestCounts(BaseObject):
    __component__ = "RequestCounts"
    total: int
    completed: int
    failed: int


@_typed
class InputTokensDetails(BaseObject):
    __component__ = "InputTokensDetails"
    cached_tokens: int


@_typed
class OutputTokensDetails(BaseObject):
    __component__ = "OutputTokensDetails"
    reasoning_tokens: int


@_typed
class BatchUsage(BaseObject):
    __component__ = "BatchUsage"
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


@_typed
class BatchError(BaseObject):
    """Why a batch failed (`batch.error`), or one bad input line (`line`, `param`)."""

    __component__ = "BatchError"
    code: str
    message: str
    line: int | None = None
    param: str | None = None


@_typed
class BatchErrors(BaseObject):
    """A batch's first bad input lines (`batch.errors`); `total` counts them all."""

    __component__ = "BatchErrors"
    data: list[BatchError]
    total: int
    has_more: bool
    object: str | None = None


@_typed
class Batch(BaseObject):
    __component__ = "BatchOutput"
    id: str
    object: str
    endpoint: str
    model: str
    input_file_id: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    started_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    usage: BatchUsage
    error: BatchError | None
    errors: BatchErrors | None
    # Extensions: the server's ETA (Unix seconds, null while unknown) and whether the
    # completion window is at risk even with all of the model's capacity.
    estimated_completion_at: int | None
    at_risk: bool
    status: str | None = None
    completion_window: str | None = None
    metadata: dict[str, str] | None = None
    max_decoding_length: int | None = None
    max_context_length: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


# -- models and capacity ----------------------------------------------------------------


@_typed
class Model(BaseObject):
    __component__ = "Model"
    id: str
    created: int
    max_context_length: int
    engine: str
    endpoints: list[str]
    live: bool
    workers: int
    resident: bool
    resident_on: list[str]
    root: str
    parent: str | None
    cannot_start: str | None
    object: str | None = None
    owned_by: str | None = None


@_typed
class ModelPoolStatus(BaseObject):
    __component__ = "ModelPoolStatus"
    model: str
    workers: int
    requests_waiting: int
    scheduling_pool_active: int
    scheduling_pool_free: int
    scheduling_pool_capacity: int
    scheduling_pool_tokens_active: int
    scheduling_pool_token_budget: int | None
    resident_on: list[str]
    waiting_seconds: float | None


@_typed
class Multiplexing(BaseObject):
    __component__ = "Multiplexing"
    workers: int
    swaps: int
    swaps_done: int
    loads: int
    swap_seconds: float
    swap_hand_back_seconds: float


@_typed
class AdaptiveConcurrency(BaseObject):
    """An openai-http worker's adaptive concurrency at a shared server: its limit on
    batch requests in flight and the server signals it read last."""
    __component__ = "AdaptiveConcurrency"
    worker: str
    model: str
    limit: int
    mode: str
    source: str
    floor: int
    ceiling: int
    target: float
    in_flight: int
    waiting_at_gate: int
    shed_total: int
    baseline_latency: float | None
    hold_seconds: float | None = None
    signals: dict[str, Any]


@_typed
class PoolStatus(BaseObject):
    __component__ = "PoolStatus"
    intake_pool_size: int
    intake_pool_capacity: int
    scheduling_pool_active: int
    scheduling_pool_free: int
    scheduling_pool_capacity: int
    active_batches: int
    pool_mode: bool
    scheduling_pool_tokens_active: int
    scheduling_pool_token_budget: int | None
    storage_error: str | None
    models: list[ModelPoolStatus]
    adaptive_concurrency: list[AdaptiveConcurrency]
    multiplexing: Multiplexing | None


# -- webhook endpoints ------------------------------------------------------------------


@_typed
class WebhookEndpoint(BaseObject):
    __component__ = "EndpointOutput"
    id: str
    object: str
    url: str
    created_at: int
    updated_at: int
    signing_secret_hint: str
    name: str | None = None
    event_types: list[str] | None = None
    enabled: bool | None = None
    disabled_reason: str | None = None


@_typed
class WebhookEndpointWithSecret(WebhookEndpoint):
    """What creating an endpoint or rotating its secret answers: the only time the
    `signing_secret` is shown."""

    __component__ = "EndpointWithSecretOutput"
    signing_secret: str


@_typed
class WebhookEndpointDeleted(BaseObject):
    __component__ = "EndpointDeleted"
    id: str
    deleted: bool
    object: str | None = None


@_typed
class WebhookEndpointTestResult(BaseObject):
    __component__ = "EndpointTestResult"
    webhook_endpoint_id: str
    event_type: str
    status_code: int
    success: bool
    object: str | None = None

