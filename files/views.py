from __future__ import annotations

from django.conf import settings
from django.http import FileResponse, HttpResponseRedirect
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from core.auth import request_owner
from core.errors import checked_id, error_responses
from core.pagination import list_page
from core.representation import represent
from files import selectors, services
from files.serializers import (
    FileDeletedSerializer,
    FileListInputSerializer,
    FileListSerializer,
    FileOutputSerializer,
    FileUploadInputSerializer,
)
from files.upload import StreamingUploadHandler, too_large_error

# What a multipart body may hold besides the file: part headers, the purpose field
# and boundaries are a few hundred bytes.
MULTIPART_ENVELOPE_BYTES = 64 * 1024


class FileListCreateView(APIView):
    parser_classes = [MultiPartParser]

    @extend_schema(request=FileUploadInputSerializer,
                   responses={200: FileOutputSerializer,
                              **error_responses(400, 401, 413, 415, 507)},
                   operation_id="files_upload")
    def post(self, request):
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > settings.BATCHGEN_MAX_UPLOAD_BYTES + MULTIPART_ENVELOPE_BYTES:
            raise too_large_error()
        try:
            params = FileUploadInputSerializer(data=request.data)
            params.is_valid(raise_exception=True)
            upload = params.validated_data["file"]
            file = services.file_upload(
                upload=upload, purpose=params.validated_data["purpose"],
                owner=request_owner(request),
                expires_after_seconds=params.validated_data.get("expires_after"))
            for handler in _streaming_handlers(request):
                handler.claim(upload.path)
        finally:
            for handler in _streaming_handlers(request):
                handler.discard()
        return Response(represent(FileOutputSerializer, file))

    @extend_schema(parameters=[FileListInputSerializer],
                   responses={200: FileListSerializer, **error_responses(400, 401)},
                   operation_id="files_list")
    def get(self, request):
        params = FileListInputSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        query = params.validated_data
        files = selectors.file_list(purpose=query.get("purpose"), order=query["order"],
                                    after=query.get("after"), owner=request_owner(request))
        return Response(list_page(files, limit=query["limit"],
                                  serializer_class=FileOutputSerializer))


def _streaming_handlers(request):
    return [h for h in request._request.upload_handlers if isinstance(h, StreamingUploadHandler)]


def _file_id(file_id: str) -> str:
    return checked_id(file_id, kind="file", param="file_id")


class FileDetailView(APIView):
    @extend_schema(responses={200: FileOutputSerializer, **error_responses(401, 404)},
                   operation_id="files_retrieve")
    def get(self, request, file_id: str):
        file = selectors.file_get(file_id=_file_id(file_id), owner=request_owner(request))
        return Response(represent(FileOutputSerializer, file))

    @extend_schema(responses={200: FileDeletedSerializer, **error_responses(400, 401, 404)},
                   operation_id="files_delete")
    def delete(self, request, file_id: str):
        file = selectors.file_get(file_id=_file_id(file_id), owner=request_owner(request))
        services.file_delete(file=file)
        return Response({"id": file_id, "object": "file", "deleted": True})


class IgnoreClientContentNegotiation(BaseContentNegotiation):
    """Raw bytes whatever the client accepts: the openai SDK asks for
    `application/binary`, curl for `*/*`; an error still renders as JSON."""

    def select_parser(self, request, parsers):
        return parsers[0]

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class FileContentView(APIView):
    content_negotiation_class = IgnoreClientContentNegotiation

    @extend_schema(responses={(200, "application/jsonl"): OpenApiResponse(
        response=OpenApiTypes.BINARY, description="The file's bytes"),
        302: OpenApiResponse(description="On a bucket with BATCHGEN_S3_PRESIGNED_DOWNLOADS: "
                             "Location is a presigned URL of the bytes"),
        **error_responses(401, 404)}, operation_id="files_content")
    def get(self, request, file_id: str):
        file = selectors.file_get(file_id=_file_id(file_id), owner=request_owner(request))
        url = services.file_download_url(file=file)
        if url is not None:  # the store serves the bytes (BATCHGEN_S3_PRESIGNED_DOWNLOADS)
            return HttpResponseRedirect(url)
        handle = services.file_open(file=file)
        # FileResponse streams in blocks: memory stays flat for any size.
        response = FileResponse(handle, as_attachment=True, filename=file.filename,
                                content_type="application/jsonl")
        if not response.has_header("Content-Length"):  # an object store's body
            response["Content-Length"] = str(file.bytes)
        return response
