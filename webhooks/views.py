"""`/v1/webhook_endpoints` as OpenAI has it, so the openai SDK's `client.webhooks`
works: create (the secret shown once), list, retrieve, update, delete, rotate_secret,
test; and `/v1/webhook_event_types`. A key sees and manages only its own endpoints;
server-wide ones are made by an operator (admin, `manage.py webhooks`)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from core.auth import request_owner
from core.errors import BatchGenError, checked_id, error_responses
from core.pagination import list_page
from core.parsers import JSONParser
from core.representation import represent
from webhooks import selectors, services
from webhooks.models import EVENT_TYPES
from webhooks.serializers import (
    EndpointCreateInputSerializer,
    EndpointDeletedSerializer,
    EndpointListInputSerializer,
    EndpointListSerializer,
    EndpointOutputSerializer,
    EndpointTestInputSerializer,
    EndpointTestResultSerializer,
    EndpointUpdateInputSerializer,
    EndpointWithSecretOutputSerializer,
    EventTypeListSerializer,
    RotateSecretInputSerializer,
)


def _endpoint_id(value: str) -> str:
    return checked_id(value, kind="webhook endpoint", param="webhook_endpoint_id")


class EndpointListCreateView(APIView):
    parser_classes = [JSONParser]

    @extend_schema(request=EndpointCreateInputSerializer,
                   responses={200: EndpointWithSecretOutputSerializer,
                              **error_responses(400, 401)},
                   operation_id="webhook_endpoints_create")
    def post(self, request):
        params = EndpointCreateInputSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        endpoint = services.endpoint_create(owner=request_owner(request),
                                            **params.validated_data)
        return Response(represent(EndpointWithSecretOutputSerializer, endpoint))

    @extend_schema(parameters=[EndpointListInputSerializer],
                   responses={200: EndpointListSerializer, **error_responses(400, 401)},
                   operation_id="webhook_endpoints_list")
    def get(self, request):
        params = EndpointListInputSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        endpoints = selectors.endpoint_list(after=params.validated_data.get("after"),
                                            owner=request_owner(request))
        return Response(list_page(endpoints, limit=params.validated_data["limit"],
                                  serializer_class=EndpointOutputSerializer))


class EndpointDetailView(APIView):
    parser_classes = [JSONParser]

    @extend_schema(responses={200: EndpointOutputSerializer, **error_responses(401, 404)},
                   operation_id="webhook_endpoints_retrieve")
    def get(self, request, endpoint_id: str):
        endpoint = services.endpoint_get(endpoint_id=_endpoint_id(endpoint_id),
                                         owner=request_owner(request))
        return Response(represent(EndpointOutputSerializer, endpoint))

    @extend_schema(request=EndpointUpdateInputSerializer,
                   responses={200: EndpointOutputSerializer, **error_responses(400, 401, 404)},
                   operation_id="webhook_endpoints_update")
    def post(self, request, endpoint_id: str):
        params = EndpointUpdateInputSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        endpoint = services.endpoint_update(endpoint_id=_endpoint_id(endpoint_id),
                                            owner=request_owner(request),
                                            **params.validated_data)
        return Response(represent(EndpointOutputSerializer, endpoint))

    @extend_schema(responses={200: EndpointDeletedSerializer, **error_responses(401, 404)},
                   operation_id="webhook_endpoints_delete")
    def delete(self, request, endpoint_id: str):
        services.endpoint_delete(endpoint_id=_endpoint_id(endpoint_id),
                                 owner=request_owner(request))
        return Response({"id": endpoint_id, "object": "webhook_endpoint.deleted",
                         "deleted": True})


class EndpointRotateSecretView(APIView):
    parser_classes = [JSONParser]

    @extend_schema(request=RotateSecretInputSerializer,
                   responses={200: EndpointWithSecretOutputSerializer,
                              **error_responses(400, 401, 404)},
                   operation_id="webhook_endpoints_rotate_secret")
    def post(self, request, endpoint_id: str):
        params = RotateSecretInputSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        endpoint = services.endpoint_rotate_secret(
            endpoint_id=_endpoint_id(endpoint_id), owner=request_owner(request),
            keep_old_secret=params.validated_data["keep_old_secret_active_for_24_hours"])
        return Response(represent(EndpointWithSecretOutputSerializer, endpoint))


class EndpointTestView(APIView):
    parser_classes = [JSONParser]

    @extend_schema(request=EndpointTestInputSerializer,
                   responses={200: EndpointTestResultSerializer,
                              **error_responses(400, 401, 404)},
                   operation_id="webhook_endpoints_test")
    def post(self, request, endpoint_id: str):
        params = EndpointTestInputSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        event_type = params.validated_data["event_type"]
        outcome = services.endpoint_test(endpoint_id=_endpoint_id(endpoint_id),
                                         owner=request_owner(request), event_type=event_type)
        if outcome.not_allowed:
            raise BatchGenError(f"The webhook endpoint's URL is not allowed: {outcome.error}",
                                param="webhook_endpoint_id", code="webhook_url_not_allowed")
        if outcome.status_code is None:
            raise BatchGenError(f"The webhook receiver did not answer: {outcome.error}",
                                param="webhook_endpoint_id", code="webhook_unreachable")
        return Response({"object": "webhook_endpoint.test", "webhook_endpoint_id": endpoint_id,
                         "event_type": event_type, "status_code": outcome.status_code,
                         "success": True})


class EventTypeListView(APIView):
    @extend_schema(responses={200: EventTypeListSerializer, **error_responses(401)},
                   operation_id="webhook_event_types_list")
    def get(self, request):
        return Response({"object": "list", "data": list(EVENT_TYPES)})
