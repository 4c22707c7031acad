from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import NotFound, error_responses
from core.pagination import list_envelope_serializer
from core.representation import represent
from inference import selectors
from serving.model_info import SERVER_STARTED, ModelInfo, served_adapters, served_models


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


class ModelSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField(default="model")
    created = serializers.IntegerField()
    owned_by = serializers.CharField(default="batchgen")
    max_context_length = serializers.IntegerField()
    engine = serializers.CharField()
    endpoints = serializers.ListField(child=serializers.CharField(),
                                      help_text="the batch endpoints it serves")
    live = serializers.BooleanField(help_text="whether a live inference worker holds it, "
                                    "or multiplexing workers can load it")
    cannot_start = serializers.CharField(
        allow_null=True, help_text="why its engine cannot start on any live multiplexing "
        "worker with their settings (its batches wait, then fail with model_unavailable); "
        "null otherwise")
    workers = serializers.IntegerField(help_text="live inference workers holding it")
    resident = serializers.BooleanField(help_text="whether it is loaded (or loading) on a "
                                        "live worker now")
    resident_on = serializers.ListField(child=serializers.CharField(),
                                        help_text="the live workers it is resident on")
    # As vLLM's /v1/models shows its LoRA adapters (OpenAI's old model objects too).
    root = serializers.CharField(help_text="the model it descends from: itself, or for a "
                                           "LoRA adapter its base model")
    parent = serializers.CharField(allow_null=True, help_text="a LoRA adapter's base "
                                   "model, whose workers serve it; null for a model")


ModelListSerializer = list_envelope_serializer("ModelList", ModelSerializer)


def _models() -> list[dict]:
    """The served models, then the LoRA adapters: an adapter generates text where its
    base does, on its base's workers."""
    workers = selectors.live_workers_by_model()
    resident = selectors.resident_on()
    multiplexing = selectors.multiplexing_workers().exists()
    cannot_start = selectors.models_that_cannot_start() if multiplexing else {}

    def card(name: str, model: ModelInfo, endpoints: tuple[str, ...],
             parent: str | None) -> dict:
        return {"id": name, "object": "model", "created": SERVER_STARTED,
                "owned_by": "batchgen", "max_context_length": model.max_context_length,
                "engine": model.engine, "endpoints": list(endpoints),
                "live": workers.get(model.id, 0) > 0 or (multiplexing
                                                         and model.id not in cannot_start),
                "cannot_start": cannot_start.get(model.id),
                "workers": workers.get(model.id, 0),
                "resident": bool(resident.get(model.id)),
                "resident_on": resident.get(model.id, []),
                "root": model.id, "parent": parent}

    return [*(card(model.id, model, model.endpoints, None) for model in served_models()),
            *(card(adapter.id, adapter.base, adapter.endpoints, adapter.base.id)
              for adapter in served_adapters())]


class ModelListView(APIView):
    @extend_schema(responses={200: ModelListSerializer, **error_responses(401)},
                   operation_id="models_list")
    def get(self, request):
        models = _models()
        return Response({"object": "list", "data": models, "has_more": False,
                         "first_id": models[0]["id"], "last_id": models[-1]["id"]})


class ModelDetailView(APIView):
    @extend_schema(responses={200: ModelSerializer, **error_responses(401, 404)},
                   operation_id="models_retrieve")
    def get(self, request, model_id: str):
        models = _models()
        model = next((model for model in models if model["id"] == model_id), None)
        if model is None:
            served = ", ".join(repr(model["id"]) for model in models)
            raise NotFound(f"The model {model_id!r} does not exist; this server serves "
                           f"{served}.", param="model", code="model_not_found")
        return Response(model)


class PoolStatusView(APIView):
    @extend_schema(responses={200: PoolStatusSerializer, **error_responses(401)},
                   operation_id="pool_status")
    def get(self, request):
        return Response(represent(PoolStatusSerializer, selectors.pool_status_cached()))
