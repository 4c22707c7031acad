"""The OpenAI error envelope, for every 4xx and 5xx the API answers.

`{"error": {"message": str, "type": str, "param": str|null, "code": str|null}}`
"""

from __future__ import annotations

import errno
import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import Http404, JsonResponse, UnreadablePostError
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

logger = logging.getLogger(__name__)


class BatchGenError(Exception):
    """A domain error a service raises; the API turns it into the envelope."""

    status_code = status.HTTP_400_BAD_REQUEST
    error_type = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class NotFound(BatchGenError):
    status_code = status.HTTP_404_NOT_FOUND
    code = "not_found"


class Conflict(BatchGenError):
    status_code = status.HTTP_400_BAD_REQUEST


class PayloadTooLarge(BatchGenError):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    code = "file_too_large"


class CapacityFull(BatchGenError):
    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    error_type = "rate_limit_error"
    code = "intake_pool_full"

    def __init__(self, message: str, *, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class QuotaExceeded(CapacityFull):
    """The API key's own quota (batches.quotas), not the server's pool: Retry-After says
    when it frees (the next UTC day for a daily token quota)."""

    code = "quota_exceeded"


SQLITE_FULL = 13  # sqlite3.SQLITE_FULL


class StorageFull(BatchGenError):
    status_code = status.HTTP_507_INSUFFICIENT_STORAGE
    error_type = "server_error"
    code = "storage_full"


class StorageUnreachable(BatchGenError):
    """The object store holding a file's bytes does not answer: retry later."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    error_type = "server_error"
    code = "storage_unavailable"


def is_storage_full(error: BaseException) -> bool:
    """Whether an OSError means the volume (or the user's quota) has no room, or the
    database says its own volume has none: SQLite's SQLITE_FULL (its file lives on the
    storage path by default), PostgreSQL's disk_full (53100)."""
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    cause = error.__cause__
    return (getattr(cause, "sqlite_errorcode", None) == SQLITE_FULL
            or (getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)) == "53100")


def checked_id(value: str, *, kind: str, param: str) -> str:
    """An object id from a URL path, fit to be looked up. No id holds NUL, and
    PostgreSQL refuses a query that does (instead of finding nothing), so such an id
    is answered 404 here, before it reaches the database."""
    if "\x00" in value:
        raise NotFound(f"No such {kind}: {value!r}", param=param)
    return value


def envelope(message: str, *, error_type: str, param: str | None = None,
             code: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    406: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def _first_error(detail, prefix: str | None = None) -> tuple[str, str | None, str | None]:
    """The first message of a DRF ValidationError detail, with its field path."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            param = key if key != "non_field_errors" else None
            if prefix and param:
                param = f"{prefix}.{param}"
            message, sub_param, code = _first_error(value, param or prefix)
            return message, sub_param or param, code
    if isinstance(detail, list) and detail:
        return _first_error(detail[0], prefix)
    code = getattr(detail, "code", None)
    return str(detail), prefix, code


def openai_exception_handler(exc, context) -> Response:
    """DRF's exception handler: every error a view raises, in the OpenAI error
    envelope with its status, never a bare 500 page."""
    from core.transient import DatabaseBusy, is_transient

    if isinstance(exc, DatabaseBusy) or is_transient(exc):
        return _database_busy(exc, context)
    if is_storage_full(exc):
        logger.error("storage full in %s: %s", context.get("view"), exc)
        exc = StorageFull("The server's storage volume is full, so the request could not "
                          "be stored; nothing was kept. Retry once space is freed.")
    if isinstance(exc, BatchGenError):
        response = Response(
            envelope(exc.message, error_type=exc.error_type, param=exc.param, code=exc.code),
            status=exc.status_code,
        )
        if isinstance(exc, CapacityFull):
            response["Retry-After"] = str(exc.retry_after)
        return response
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(envelope(
            f"The request body is larger than the server's limit of {limit} bytes "
            "(BATCHGEN_MAX_REQUEST_BODY_BYTES); files go through POST /v1/files.",
            error_type="invalid_request_error", code="request_too_large"), status=413)
    exc = _as_drf_exception(exc)
    response = exception_handler(exc, context)
    if response is None:
        logger.exception("unhandled error in %s", context.get("view"))
        return Response(
            envelope("The server had an error while processing your request.",
                     error_type="server_error", code="internal_error"),
            status=500,
        )
    response.data = _drf_envelope(exc, response.status_code)
    return response


def _database_busy(exc, context) -> Response:
    """Retried already (core.transient); the client may safely try again."""
    from core.outage import DATABASE, dependency_down, outage_began

    if dependency_down(exc) == DATABASE:
        outage_began(DATABASE, exc)  # an outage: said once, not at every request
    else:
        logger.warning("database busy in %s: %s", context.get("view"), exc)
    response = Response(envelope(
        "The server's database is busy; nothing was changed. Retry shortly.",
        error_type="server_error", code="database_busy"), status=503)
    response["Retry-After"] = "1"
    return response


def _as_drf_exception(exc):
    """Django's own refusals of a request, which DRF does not know (they would be a
    500), as the DRF exceptions that say the same."""
    if isinstance(exc, SuspiciousOperation):
        # Too many form fields or files, a malformed multipart part.
        return exceptions.ParseError(str(exc))
    if isinstance(exc, Http404):
        return exceptions.NotFound()
    if isinstance(exc, UnreadablePostError):
        # The client stopped sending mid-body (disconnect, timeout): its fault, not ours.
        return exceptions.ParseError(f"The request body could not be read completely: {exc}")
    return exc


def _drf_envelope(exc, status: int) -> dict:
    """A DRF exception's detail in the envelope: a validation error's first message,
    prefixed with its field path."""
    if isinstance(exc, exceptions.ValidationError):
        message, param, code = _first_error(exc.detail)
        if param and not message.startswith(param):
            message = f"{param}: {message}"
        code = None if code in (None, "invalid") else code
    else:
        message, param, code = str(getattr(exc, "detail", exc)), None, None
        code = getattr(getattr(exc, "detail", None), "code", None)
    return envelope(message, error_type=_TYPES.get(status, "server_error"),
                    param=param, code=code)


class ErrorDetailSerializer(serializers.Serializer):
    message = serializers.CharField()
    type = serializers.CharField()
    param = serializers.CharField(allow_null=True)
    code = serializers.CharField(allow_null=True)


class ErrorEnvelopeSerializer(serializers.Serializer):
    """The OpenAI error envelope: the body of every 4xx and 5xx answer."""

    error = ErrorDetailSerializer()


_ERROR_DESCRIPTIONS = {
    400: "Invalid request: the parameter at fault is named in `error.param`.",
    401: "Missing or wrong API key (`Authorization: Bearer <key>`).",
    404: "No such object (or not one this API key may see).",
    413: "The upload or request body is over the server's configured limit.",
    415: "Unsupported request content type.",
    429: "The intake pool is full (`intake_pool_full`) or the API key is over one of its "
         "quotas (`quota_exceeded`); retry after the `Retry-After` seconds.",
    503: "The database stayed busy through the server's retries; nothing was changed. "
         "Retry after the `Retry-After` seconds.",
    507: "The server's storage volume is full; nothing was stored. Retry later.",
}


def error_responses(*statuses: int) -> dict[int, OpenApiResponse]:
    """OpenAPI responses for the error statuses a view answers, in the envelope."""
    return {code: OpenApiResponse(ErrorEnvelopeSerializer, description=_ERROR_DESCRIPTIONS[code])
            for code in statuses}


def json_error(request, message: str, status_code: int, error_type: str) -> JsonResponse:
    return JsonResponse(envelope(message, error_type=error_type), status=status_code)


def handler404(request, exception=None):
    return json_error(request, f"Unknown path: {request.path}", 404, "invalid_request_error")


def handler500(request):
    return json_error(request, "The server had an error while processing your request.",
                      500, "server_error")


def handler400(request, exception=None):
    return json_error(request, "Bad request.", 400, "invalid_request_error")
