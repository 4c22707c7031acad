"""`/v1/models`: the served models and their LoRA adapters, each with the live
workers that hold it (the fleet's records)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import NotFound, error_responses
from core.pagination import list_envelope_serializer
from fleet import selectors
from serving.model_info import SERVER_STARTED, ModelInfo, served_adapters, served_models


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
    contexts = selectors.model_contexts()
    resident = selectors.resident_on()
    multiplexing = selectors.multiplexing_workers().exists()
    cannot_start = selectors.models_that_cannot_start() if multiplexing else {}

    def card(name: str, model: ModelInfo, endpoints: tuple[str, ...],
             parent: str | None) -> dict:
        return {"id": name, "object": "model", "created": SERVER_STARTED,
                "owned_by": "batchgen",
                "max_context_length": contexts[model.id],
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
