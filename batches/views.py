from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from batches import selectors, services
from batches.serializers import (
    BatchCreateInputSerializer,
    BatchListInputSerializer,
    BatchListSerializer,
    BatchOutputSerializer,
    PoolStatusSerializer,
)
from batchgen_site.pagination import list_page
from inference.model_info import served_model


class BatchListCreateView(APIView):
    @extend_schema(request=BatchCreateInputSerializer, responses=BatchOutputSerializer,
                   operation_id="batches_create")
    def post(self, request):
        params = BatchCreateInputSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        batch = services.batch_create(model=served_model().id, **params.validated_data)
        return Response(BatchOutputSerializer(batch).data)

    @extend_schema(parameters=[BatchListInputSerializer], responses=BatchListSerializer,
                   operation_id="batches_list")
    def get(self, request):
        params = BatchListInputSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        batches = selectors.batch_list(after=params.validated_data.get("after"))
        return Response(list_page(batches, limit=params.validated_data["limit"],
                                  serializer_class=BatchOutputSerializer))


class BatchDetailView(APIView):
    @extend_schema(responses=BatchOutputSerializer, operation_id="batches_retrieve")
    def get(self, request, batch_id: str):
        return Response(BatchOutputSerializer(services.batch_get(batch_id=batch_id)).data)


class BatchCancelView(APIView):
    @extend_schema(request=None, responses=BatchOutputSerializer, operation_id="batches_cancel")
    def post(self, request, batch_id: str):
        return Response(BatchOutputSerializer(services.batch_cancel(batch_id=batch_id)).data)


class PoolStatusView(APIView):
    @extend_schema(responses=PoolStatusSerializer, operation_id="pool_status")
    def get(self, request):
        return Response(PoolStatusSerializer(selectors.pool_status()).data)
