"""The input line's shape as msgspec types: the fast path of validation.

msgspec decodes and checks a line in one pass in C. Every line it accepts is one the
rule-by-rule checks in batches/validation.py accept too (the types here are no more
lenient); a line it refuses goes through those checks, which name the exact problem.
So the precise error codes cost nothing on valid input.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

# orjson (the slow path) reads integers past 64 bits as floats, which the checks
# refuse; the bounds keep the fast path from accepting them.
INT64_MAX = 2**63 - 1
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]
Int64 = Annotated[int, msgspec.Meta(ge=-INT64_MAX - 1, le=INT64_MAX)]
CustomId = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]


class Message(msgspec.Struct):
    role: str
    content: Any = None


class _Body(msgspec.Struct, kw_only=True):
    model: Annotated[str, msgspec.Meta(min_length=1)]
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    max_decoding_length: PositiveInt | None = None
    max_context_length: PositiveInt | None = None
    # Finite bounds: JSON has no infinity, but 1e999 would decode to one.
    temperature: Annotated[float, msgspec.Meta(ge=0, le=1e300)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)] | None = None
    n: Literal[1] | None = None
    stream: Literal[False] | None = None


class ChatBody(_Body, kw_only=True):
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]


class CompletionBody(_Body, kw_only=True):
    prompt: str | Annotated[list[str | Int64], msgspec.Meta(min_length=1)]


class ChatLine(msgspec.Struct):
    custom_id: CustomId
    method: Literal["POST"]
    url: Literal["/v1/chat/completions"]
    body: ChatBody


class CompletionLine(msgspec.Struct):
    custom_id: CustomId
    method: Literal["POST"]
    url: Literal["/v1/completions"]
    body: CompletionBody


DECODERS = {
    "/v1/chat/completions": msgspec.json.Decoder(ChatLine),
    "/v1/completions": msgspec.json.Decoder(CompletionLine),
}
# RecursionError: msgspec gives up on very deep nesting; the slow path refuses it.
DecodeError = msgspec.ValidationError, msgspec.DecodeError, RecursionError
