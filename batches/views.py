from __future__ import annotations

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from batches import selectors, services
from batches.serializers import (
    BatchCreateInputSerializer,
    BatchLineErrorListSerializer,
    BatchLineErrorsInputSerializer,
    BatchListInputSerializer,
    BatchListSerializer,
    BatchOutputInputSerializer,
    BatchOutputSerializer,
    PoolStatusSerializer,
)
from core.auth import request_owner
from core.errors import BatchGenError, StorageUnreachable, checked_id, error_responses
from core.pagination import list_page
from core.parsers import JSONParser
from core.representation import represent
from files import backends, storage
from files.incremental import enclosing_line, read_range, whole_lines_end
from files.segments import read_from, starts_a_line, stream_end
from files.views import IgnoreClientContentNegotiation
from serving.model_info import served_model


def _batch_id(batch_id: str) -> str:
    return checked_id(batch_id, kind="batch", param="batch_id")


class BatchListCreateView(APIView):
    parser_classes = [JSONParser]  # a batch is created from a JSON body, as with OpenAI

    @extend_schema(request=BatchCreateInputSerializer,
                   responses={200: BatchOutputSerializer,
                              **error_responses(400, 401, 413, 415, 429)},
                   operation_id="batches_create")
    def post(self, request):
        params = BatchCreateInputSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        batch = services.batch_create(model=served_model().id, owner=request_owner(request),
                                      **params.validated_data)
        return Response(represent(BatchOutputSerializer, batch))

    @extend_schema(parameters=[BatchListInputSerializer],
                   responses={200: BatchListSerializer, **error_responses(400, 401)},
                   operation_id="batches_list")
    def get(self, request):
        params = BatchListInputSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        batches = selectors.batch_list(after=params.validated_data.get("after"),
                                       owner=request_owner(request))
        return Response(list_page(batches, limit=params.validated_data["limit"],
                                  serializer_class=BatchOutputSerializer))


class BatchDetailView(APIView):
    @extend_schema(responses={200: BatchOutputSerializer, **error_responses(401, 404)},
                   operation_id="batches_retrieve")
    def get(self, request, batch_id: str):
        batch = services.batch_get(batch_id=_batch_id(batch_id), owner=request_owner(request))
        return Response(represent(BatchOutputSerializer, batch))


class BatchCancelView(APIView):
    @extend_schema(request=None,
                   responses={200: BatchOutputSerializer, **error_responses(400, 401, 404)},
                   operation_id="batches_cancel")
    def post(self, request, batch_id: str):
        services.batch_get(batch_id=_batch_id(batch_id), owner=request_owner(request))
        return Response(represent(BatchOutputSerializer, services.batch_cancel(batch_id=batch_id)))


class BatchOutputView(APIView):
    """The batch's incremental file while it runs: whole lines from a byte offset,
    so a client can follow results (`batchgen tail`) without waiting for the end."""

    content_negotiation_class = IgnoreClientContentNegotiation

    @extend_schema(parameters=[BatchOutputInputSerializer],
                   responses={(200, "application/x-ndjson"): OpenApiTypes.BINARY,
                              **error_responses(400, 401, 404)},
                   operation_id="batches_output")
    def get(self, request, batch_id: str):
        batch = services.batch_get(batch_id=_batch_id(batch_id), owner=request_owner(request))
        params = BatchOutputInputSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        offset = params.validated_data["offset"]
        store = backends.current()
        if not isinstance(store, backends.PathStorage):
            return _output_on_object_store(store, batch, offset)
        path = storage.absolute(storage.incremental_name(batch.id))
        end = whole_lines_end(path)
        if offset > end:
            raise BatchGenError(f"offset {offset} is past the {end} bytes written so far.",
                                param="offset")
        line = enclosing_line(path, offset) if offset < end else None
        if line is not None:
            # Answering from here would start with the torn tail of a line.
            raise BatchGenError(
                f"offset {offset} is inside a line; the nearest lines start at {line[0]} and "
                f"{line[1]}. Resume from the X-Next-Offset of the previous answer.",
                param="offset", code="offset_not_at_line_start")
        response = StreamingHttpResponse(read_range(path, offset, end) if end > offset else [],
                                         content_type="application/x-ndjson")
        response["X-Next-Offset"] = str(end)
        response["X-Batch-Status"] = batch.status
        return response


def _output_on_object_store(store, batch, offset: int) -> StreamingHttpResponse:
    """The counted segments as one stream (files.segments): every segment holds whole
    lines, so the ends of segments are the places a reader can resume from; after
    finalization, the composed output file."""
    counted = selectors.output_stream(batch=batch)
    # Finalization may compose the segments and delete them while this answer is read.
    composed = None if batch.output_file_id else storage.incremental_name(batch.id)
    end = stream_end(counted)
    if offset > end:
        raise BatchGenError(f"offset {offset} is past the {end} bytes written so far.",
                            param="offset")
    try:
        at_line_start = offset in (0, end) or starts_a_line(store, counted, offset,
                                                               composed=composed)
    except backends.StorageUnavailable as exc:
        raise StorageUnreachable(f"The file store is unavailable ({exc}); try again "
                                 "shortly.") from None
    if not at_line_start:
        raise BatchGenError(
            f"offset {offset} is inside a line. Resume from the X-Next-Offset of the "
            "previous answer.", param="offset", code="offset_not_at_line_start")
    response = StreamingHttpResponse(read_from(store, counted, offset, composed=composed)
                                     if end > offset else [],
                                     content_type="application/x-ndjson")
    response["X-Next-Offset"] = str(end)
    response["X-Batch-Status"] = batch.status
    return response


class BatchLineErrorsView(APIView):
    """Every bad input line of a failed batch, a page at a time: the batch object
    itself carries only the first ones, so a poll stays small."""

    @extend_schema(parameters=[BatchLineErrorsInputSerializer],
                   responses={200: BatchLineErrorListSerializer,
                              **error_responses(400, 401, 404)},
                   operation_id="batches_errors")
    def get(self, request, batch_id: str):
        batch = services.batch_get(batch_id=_batch_id(batch_id), owner=request_owner(request))
        params = BatchLineErrorsInputSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        return Response(selectors.batch_line_errors(batch=batch, **params.validated_data))


class PoolStatusView(APIView):
    @extend_schema(responses={200: PoolStatusSerializer, **error_responses(401)},
                   operation_id="pool_status")
    def get(self, request):
        return Response(represent(PoolStatusSerializer, selectors.pool_status_cached()))
