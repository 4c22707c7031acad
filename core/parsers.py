"""The JSON request parser: DRF's, reading with orjson."""

from __future__ import annotations

import orjson
from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    """Strict JSON with a fixed nesting limit. The standard library's parser raises
    RecursionError (a 500) on a deeply nested body and lets lone surrogates through
    (which no database or UTF-8 response can hold); orjson refuses both as invalid
    JSON, as it does NaN and Infinity. Being a JSONParser subclass, DRF still reads
    the body through `request.body`, so DATA_UPLOAD_MAX_MEMORY_SIZE applies."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return orjson.loads(stream.read())
        except orjson.JSONDecodeError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
