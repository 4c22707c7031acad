from __future__ import annotations

from django.conf import settings
from rest_framework import serializers

from batches.models import ERRORS_SHOWN, Batch, BatchStatus, Endpoint
from batches.usage import batch_usage
from batches.validation import MAX_LISTED_ERRORS
from batches.windows import InvalidWindow, window_check
from core.pagination import list_envelope_serializer
from files.serializers import ExpiresAfterSerializer, UnixTimestampField
from fleet import selectors as fleet_selectors
from serving.endpoints import NOT_BATCHED
from serving.model_info import served_models
from serving.params import SAMPLING_BOUNDS

# metadata["priority"]: a batch's weight in fair sharing (batches.dispatch).
MAX_PRIORITY = 100
# The batch's integer columns are 32-bit (PostgreSQL `integer`): a larger value is a
# 400 here rather than a database error.
MAX_INT = 2**31 - 1


class MetadataValueField(serializers.CharField):
    """A metadata value: a string, as OpenAI requires (DRF's CharField would store the
    number 5 as "5"), of at most BATCHGEN_MAX_METADATA_VALUE_CHARS characters. Its
    errors name the key: `param` is `metadata.<key>`."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError(
                f"metadata values must be strings; got {_json_type(data)}.",
                code="invalid_type")
        limit = settings.BATCHGEN_MAX_METADATA_VALUE_CHARS
        if len(data) > limit:
            raise serializers.ValidationError(
                f"metadata values are at most {limit} characters "
                f"(BATCHGEN_MAX_METADATA_VALUE_CHARS); got one of {len(data)}.",
                code="metadata_too_large")
        return super().to_internal_value(data)


def _json_type(value) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {dict: "an object", list: "an array"}.get(type(value), type(value).__name__)


def bounded_field(name: str) -> serializers.Field:
    """A batch-level parameter, held to the same bound as in a request body
    (serving.params.SAMPLING_BOUNDS), and to the 32-bit column it is stored in."""
    bound = SAMPLING_BOUNDS[name]
    if bound.integer:
        return serializers.IntegerField(min_value=bound.low, max_value=min(bound.high, MAX_INT),
                                        required=False, allow_null=True)
    validators = [_above(name, bound.low)] if bound.low_open else []
    return serializers.FloatField(min_value=bound.low, max_value=bound.high,
                                  validators=validators, required=False, allow_null=True)


def _above(name: str, low: float):
    def check(value: float) -> None:
        if value <= low:
            raise serializers.ValidationError(f"{name} must be greater than {low}.",
                                              code="min_value")
    return check


class BatchCreateInputSerializer(serializers.Serializer):
    input_file_id = serializers.CharField(max_length=64)
    endpoint = serializers.ChoiceField(choices=Endpoint.values, default=Endpoint.CHAT.value)
    completion_window = serializers.CharField(
        default="24h", max_length=8,
        help_text="`24h`, or (an extension) another window such as `1h` or `72h` within "
                  "the server's bounds (BATCHGEN_MIN/MAX_COMPLETION_WINDOW_SECONDS).")
    metadata = serializers.DictField(
        child=MetadataValueField(allow_blank=True), required=False, allow_null=True,
    )
    max_decoding_length = bounded_field("max_decoding_length")
    max_context_length = bounded_field("max_context_length")
    temperature = bounded_field("temperature")
    top_p = bounded_field("top_p")
    top_k = bounded_field("top_k")
    output_expires_after = ExpiresAfterSerializer(
        required=False, allow_null=True,
        help_text="When the output and error files expire: `seconds` after they are "
                  "created (anchor `created_at`), within the server's bounds.")

    def validate_completion_window(self, value):
        try:
            window_check(value)
        except InvalidWindow as exc:
            raise serializers.ValidationError(str(exc), code="invalid_completion_window") from None
        return value

    def validate_metadata(self, value):
        """The limits are settings (read per request), so they are checked here rather
        than fixed into the fields when the class is defined."""
        if value is None:
            return value
        max_keys = settings.BATCHGEN_MAX_METADATA_KEYS
        max_key = settings.BATCHGEN_MAX_METADATA_KEY_CHARS
        if len(value) > max_keys:
            raise serializers.ValidationError(
                f"metadata holds at most {max_keys} keys (BATCHGEN_MAX_METADATA_KEYS); "
                f"got {len(value)}.", code="metadata_too_large")
        for key in value:
            if len(key) > max_key:
                raise serializers.ValidationError(
                    f"metadata keys are at most {max_key} characters "
                    f"(BATCHGEN_MAX_METADATA_KEY_CHARS); got one of {len(key)}.",
                    code="metadata_too_large")
            if "\x00" in key:
                # Values are checked by MetadataValueField; PostgreSQL's jsonb refuses NUL.
                raise serializers.ValidationError("metadata keys may not contain NUL.")
        return value

    def validate(self, attrs):
        attrs["output_expires_after_seconds"] = attrs.pop("output_expires_after", None)
        priority = (attrs.get("metadata") or {}).get("priority")
        if priority is not None:
            if not priority.isdigit() or not 1 <= int(priority) <= MAX_PRIORITY:
                raise serializers.ValidationError({"metadata": [
                    f"metadata.priority must be an integer from 1 to {MAX_PRIORITY}."]})
            attrs["priority"] = int(priority)
        return attrs

    def to_internal_value(self, data):
        # An endpoint OpenAI's Batch API takes but BatchGen does not gets its own
        # code and reason, not "not a valid choice".
        endpoint = data.get("endpoint") if isinstance(data, dict) else None
        if isinstance(endpoint, str) and endpoint in NOT_BATCHED:
            raise serializers.ValidationError({"endpoint": [serializers.ErrorDetail(
                NOT_BATCHED[endpoint], code="unsupported_endpoint")]})
        return super().to_internal_value(data)

    def validate_endpoint(self, value):
        """Refused here, not line by line: a chat batch on an embedding model (or the
        reverse) would fail every one of its lines."""
        models = served_models()
        if not any(value in model.endpoints for model in models):
            served = "; ".join(f"{model.id!r} serves {', '.join(model.endpoints)}"
                               for model in models)
            raise serializers.ValidationError(
                f"No served model serves {value}: {served}.", code="unsupported_endpoint")
        return value

    def validate_max_context_length(self, value):
        limit = max(fleet_selectors.model_contexts().values())
        if value is not None and limit and value > limit:
            raise serializers.ValidationError(
                f"max_context_length {value} exceeds the model's context of {limit} tokens.")
        return value


class BatchListInputSerializer(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=100, default=20)
    after = serializers.CharField(required=False, max_length=64)


class BatchOutputInputSerializer(serializers.Serializer):
    offset = serializers.IntegerField(min_value=0, default=0)


class RequestCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    completed = serializers.IntegerField()
    failed = serializers.IntegerField()


class InputTokensDetailsSerializer(serializers.Serializer):
    cached_tokens = serializers.IntegerField(
        help_text="Prompt tokens served from the prefix cache.")


class OutputTokensDetailsSerializer(serializers.Serializer):
    reasoning_tokens = serializers.IntegerField()


class BatchUsageSerializer(serializers.Serializer):
    input_tokens = serializers.IntegerField()
    input_tokens_details = InputTokensDetailsSerializer()
    output_tokens = serializers.IntegerField()
    output_tokens_details = OutputTokensDetailsSerializer()
    total_tokens = serializers.IntegerField()


class BatchErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    line = serializers.IntegerField(allow_null=True, required=False)
    param = serializers.CharField(allow_null=True, required=False)


class BatchErrorsSerializer(serializers.Serializer):
    object = serializers.CharField(default="list")
    data = BatchErrorSerializer(many=True, help_text=(
        f"The first {ERRORS_SHOWN} bad input lines; GET /v1/batches/{{batch_id}}/errors "
        "lists every one kept."))
    total = serializers.IntegerField(help_text="How many input lines failed validation.")
    has_more = serializers.BooleanField(help_text="Whether more failed than `data` shows.")


class BatchLineErrorsInputSerializer(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=MAX_LISTED_ERRORS, default=1000)
    after = serializers.IntegerField(
        min_value=0, max_value=MAX_INT, required=False,
        help_text="A line number: the page starts after it (the `line` of the last error "
                  "of the page before).")


class BatchLineErrorListSerializer(serializers.Serializer):
    object = serializers.CharField(default="list")
    data = BatchErrorSerializer(many=True, help_text="Bad input lines, by line number.")
    has_more = serializers.BooleanField()
    total = serializers.IntegerField(help_text=(
        f"How many input lines failed validation; the first {MAX_LISTED_ERRORS} are kept."))


class BatchOutputSerializer(serializers.ModelSerializer):
    object = serializers.SerializerMethodField()
    input_file_id = serializers.CharField()
    output_file_id = serializers.CharField(allow_null=True)
    error_file_id = serializers.CharField(allow_null=True)
    created_at = UnixTimestampField()
    in_progress_at = UnixTimestampField(allow_null=True)
    started_at = UnixTimestampField(source="in_progress_at", allow_null=True)
    expires_at = UnixTimestampField(allow_null=True)
    finalizing_at = UnixTimestampField(allow_null=True)
    completed_at = UnixTimestampField(allow_null=True)
    failed_at = UnixTimestampField(allow_null=True)
    expired_at = serializers.SerializerMethodField()
    cancelling_at = UnixTimestampField(allow_null=True)
    cancelled_at = UnixTimestampField(allow_null=True)
    request_counts = serializers.SerializerMethodField()
    error = BatchErrorSerializer(allow_null=True)
    errors = serializers.SerializerMethodField()
    usage = serializers.SerializerMethodField()
    estimated_completion_at = serializers.SerializerMethodField()
    at_risk = serializers.SerializerMethodField()

    class Meta:
        model = Batch
        fields = [
            "id", "object", "endpoint", "model", "input_file_id", "output_file_id",
            "error_file_id", "completion_window", "status", "created_at", "in_progress_at",
            "started_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
            "expired_at", "cancelling_at", "cancelled_at", "request_counts", "usage", "error",
            "errors", "metadata", "max_decoding_length", "max_context_length", "temperature",
            "top_p", "top_k", "estimated_completion_at", "at_risk",
        ]

    def get_object(self, obj) -> str:
        return "batch"

    def get_expired_at(self, obj) -> int | None:
        # This server fails expired batches (status `failed`, code batch_failed).
        return None

    def get_estimated_completion_at(self, obj) -> int | None:
        """Extension: when the batch should finish (Unix seconds), from the ETA model
        of the scheduler (batches/eta.py), refreshed every few seconds; null while
        unknown (validating, no throughput measured yet) and once it has ended."""
        if obj.status not in (BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING):
            return None
        when = obj.estimated_completion_at
        return None if when is None else int(when.timestamp())

    def get_at_risk(self, obj) -> bool:
        """Extension: true while the batch cannot finish inside its completion window
        even with every worker of its model."""
        return bool(obj.at_risk) and obj.status == BatchStatus.IN_PROGRESS

    def get_request_counts(self, obj) -> RequestCountsSerializer:
        return {"total": obj.total, "completed": obj.completed, "failed": obj.failed}

    def get_usage(self, obj) -> BatchUsageSerializer(help_text=(
            "Tokens used so far (updated with the workers' progress flushes); exactly the "
            "sum over the output lines' usage once the batch is finalized.")):
        return batch_usage(obj).as_api()

    def get_errors(self, obj) -> BatchErrorsSerializer(allow_null=True):
        if not obj.errors:
            return None
        total = max(obj.line_errors_total, len(obj.errors))
        return {"object": "list", "data": obj.errors, "total": total,
                "has_more": total > len(obj.errors)}


BatchListSerializer = list_envelope_serializer("BatchList", BatchOutputSerializer)


# --- /v1/pool/status ------------------------------------------------------------------------


class ModelPoolStatusSerializer(serializers.Serializer):
    model = serializers.CharField()
    workers = serializers.IntegerField(help_text="live inference workers holding it")
    requests_waiting = serializers.IntegerField(
        help_text="requests of its chunks admitted and not yet claimed by a worker")
    scheduling_pool_active = serializers.IntegerField()
    scheduling_pool_free = serializers.IntegerField()
    scheduling_pool_capacity = serializers.IntegerField()
    scheduling_pool_tokens_active = serializers.IntegerField()
    scheduling_pool_token_budget = serializers.IntegerField(allow_null=True)
    resident_on = serializers.ListField(
        child=serializers.CharField(), help_text="the live workers it is resident on (with "
        "multiplexing, those the residency scheduler gave it, loaded or loading)")
    waiting_seconds = serializers.FloatField(
        allow_null=True, help_text="multiplexing: how long its open requests have waited "
        "for a worker while it is resident nowhere; null while resident or without work")


class MultiplexingSerializer(serializers.Serializer):
    workers = serializers.IntegerField(help_text="live workers that multiplex")
    swaps = serializers.IntegerField(help_text="swaps decided from one model to another")
    swaps_done = serializers.IntegerField(help_text="of them, those the worker finished")
    loads = serializers.IntegerField(help_text="first models loaded by a worker")
    swap_seconds = serializers.FloatField(help_text="seconds spent stopping and starting "
                                          "engines, over every swap and load")
    swap_hand_back_seconds = serializers.FloatField(
        help_text="seconds spent handing chunks back before the engines stopped")


class AdaptiveConcurrencySerializer(serializers.Serializer):
    worker = serializers.CharField()
    model = serializers.CharField()
    limit = serializers.IntegerField(help_text="batch requests it may have at the server now")
    mode = serializers.CharField(help_text="start, alone (no other traffic at the server), "
                                 "shared (other traffic seen lately) or blind (no server "
                                 "figures: its own latencies)")
    source = serializers.CharField(help_text="metrics (the server's /metrics) or latency")
    floor = serializers.IntegerField()
    ceiling = serializers.IntegerField()
    target = serializers.FloatField()
    in_flight = serializers.IntegerField(help_text="batch requests at the server now")
    waiting_at_gate = serializers.IntegerField(help_text="requests held back by the limit")
    shed_total = serializers.IntegerField(help_text="requests stopped by cuts and sent again")
    baseline_latency = serializers.FloatField(
        allow_null=True, help_text="the server's unloaded inter-token latency (s)")
    hold_seconds = serializers.FloatField(
        required=False, help_text="how long the shared rule outlasts other traffic's last "
        "request: twice its longest recent pause, 30-120 s")
    signals = serializers.DictField(help_text="what the last look read: in_flight, "
                                    "server_running, server_waiting, others, "
                                    "inter_token_latency, time_to_first_token (s)")


class PoolStatusSerializer(serializers.Serializer):
    """The top-level figures are the totals over every model; `models` splits them."""

    intake_pool_size = serializers.IntegerField()
    intake_pool_capacity = serializers.IntegerField()
    scheduling_pool_active = serializers.IntegerField()
    scheduling_pool_free = serializers.IntegerField()
    scheduling_pool_capacity = serializers.IntegerField()
    active_batches = serializers.IntegerField()
    pool_mode = serializers.BooleanField()
    scheduling_pool_tokens_active = serializers.IntegerField()
    scheduling_pool_token_budget = serializers.IntegerField(allow_null=True)
    storage_error = serializers.CharField(
        allow_null=True, help_text="Why workers cannot write results now (the storage "
        "volume full), or null. Their batches wait and resume once there is room.")
    models = ModelPoolStatusSerializer(many=True)
    adaptive_concurrency = AdaptiveConcurrencySerializer(
        many=True, help_text="openai-http workers' adaptive concurrency (the batch "
        "requests they keep at the shared server, and the signals it follows); empty "
        "when no worker has it on")
    multiplexing = MultiplexingSerializer(
        allow_null=True, help_text="model multiplexing's figures; null while no worker "
        "multiplexes")
