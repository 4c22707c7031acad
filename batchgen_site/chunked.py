"""Request bodies sent with `Transfer-Encoding: chunked` (curl streaming an upload
with `-T`/`--data-binary @-`, HTTP clients sending a generator).

gunicorn decodes the chunks and says so (`wsgi.input_terminated`: its input ends
where the body ends), but Django reads exactly CONTENT_LENGTH bytes of a body and
there is none: it saw an empty body, and answered "No file was submitted" or
"input_file_id: This field is required". This middleware gives Django a length:

- multipart bodies (uploads) stream as they are, with the most the server accepts
  as their length; they end where the chunks end, and the upload handler counts the
  file's bytes against BATCHGEN_MAX_UPLOAD_BYTES as for any upload;
- other bodies (JSON) are read into memory, as Django reads them anyway, up to one
  byte past DATA_UPLOAD_MAX_MEMORY_SIZE, and get their exact length (Django then
  refuses one over the limit with 413, as it does a declared one).

A malformed chunk is a 400; a compressed transfer coding (gzip...), 501.
"""

from __future__ import annotations

import io
import json

from django.conf import settings
from gunicorn.http.errors import ParseException

from core.errors import envelope
from files.views import MULTIPART_ENVELOPE_BYTES


def is_chunked(environ) -> bool:
    return (environ.get("wsgi.input_terminated", False)
            and not environ.get("CONTENT_LENGTH")
            and "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower())


class ChunkedInput:
    """gunicorn's decoded body, whose malformed chunks raise OSError: Django turns
    that into UnreadablePostError, which the API answers 400 (gunicorn's own parse
    errors would be a 500 from inside the application)."""

    def __init__(self, stream):
        self.stream = stream

    def read(self, size=-1):
        try:
            return self.stream.read(size)
        except ParseException as exc:
            raise OSError(f"malformed chunked body: {exc}") from exc

    def readline(self, size=-1):
        try:
            return self.stream.readline(size)
        except ParseException as exc:
            raise OSError(f"malformed chunked body: {exc}") from exc


class ChunkedBodies:
    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        codings = {c.strip().lower() for c in environ.get("HTTP_TRANSFER_ENCODING", "").split(",")}
        if codings - {"", "chunked"}:
            # gunicorn passes gzip, deflate and compress on, still compressed: Django
            # would read them as garbage.
            return error(start_response, 501, "Not Implemented", (
                f"Transfer-Encoding {environ['HTTP_TRANSFER_ENCODING']!r} is not supported: "
                "send the body uncompressed (chunked or with a Content-Length)."),
                code="not_implemented")
        if not is_chunked(environ):
            return self.app(environ, start_response)
        stream = ChunkedInput(environ["wsgi.input"])
        if environ.get("CONTENT_TYPE", "").startswith("multipart/"):
            environ["wsgi.input"] = stream
            environ["CONTENT_LENGTH"] = str(settings.BATCHGEN_MAX_UPLOAD_BYTES
                                            + MULTIPART_ENVELOPE_BYTES)
            return self.app(environ, start_response)
        try:
            body = stream.read(settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
        except OSError as exc:
            return error(start_response, 400, "Bad Request",
                         f"The request body could not be read: {exc}", code="parse_error")
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return self.app(environ, start_response)


def error(start_response, status: int, reason: str, message: str, *, code: str) -> list[bytes]:
    body = json.dumps(envelope(message, error_type="invalid_request_error",
                               code=code)).encode()
    start_response(f"{status} {reason}", [("Content-Type", "application/json"),
                                          ("Content-Length", str(len(body)))])
    return [body]
