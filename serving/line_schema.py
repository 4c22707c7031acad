"""The input line's shape as msgspec types: the fast path of validation. The parts
every endpoint shares are here; each endpoint's line type is in its spec
(serving/endpoints/).

msgspec decodes and checks a line in one pass in C. Every line it accepts is one the
rule-by-rule checks in batches/validation.py accept too (the types here are no more
lenient); a line it refuses goes through those checks, which name the exact problem.
So the precise error codes cost nothing on valid input.

Where a rule needs two fields at once the types are stricter than the checks, never
looser: an assistant message must have `content` here, while the checks also take
one that carries only tool calls. Such lines take the slow path.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from serving.params import INT64_MAX, SAMPLING_BOUNDS, Bound

CustomId = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
Int64 = Annotated[int, msgspec.Meta(ge=-INT64_MAX - 1, le=INT64_MAX)]


# --- messages: a tagged union on `role`, content parts on `type` ---------------------------


class TextPart(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class ImagePart(msgspec.Struct, tag_field="type", tag="image_url"):
    image_url: Any


Content = str | Annotated[list[TextPart | ImagePart], msgspec.Meta(min_length=1)]


class _Message(msgspec.Struct, tag_field="role"):
    content: Content

    @property
    def role(self) -> str:
        return self.__struct_config__.tag


class SystemMessage(_Message, tag="system"):
    pass


class DeveloperMessage(_Message, tag="developer"):
    pass


class UserMessage(_Message, tag="user"):
    pass


class AssistantMessage(_Message, tag="assistant"):
    tool_calls: list[Any] | None = None


class ToolMessage(_Message, tag="tool"):
    tool_call_id: str


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


# --- structured output: OpenAI's response_format, a tagged union on `type` ------------------


class TextFormat(msgspec.Struct, tag_field="type", tag="text"):
    pass


class JsonObjectFormat(msgspec.Struct, tag_field="type", tag="json_object"):
    pass


class JsonSchemaSpec(msgspec.Struct, kw_only=True):
    name: str
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class JsonSchemaFormat(msgspec.Struct, tag_field="type", tag="json_schema"):
    json_schema: JsonSchemaSpec


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat


# --- bodies: the sampling fields come from the one table of bounds -------------------------


def _bounded(bound: Bound) -> Any:
    if bound.integer:
        return Annotated[int, msgspec.Meta(ge=bound.low, le=bound.high)]
    if bound.low_open:
        return Annotated[float, msgspec.Meta(gt=bound.low, le=bound.high)]
    return Annotated[float, msgspec.Meta(ge=bound.low, le=bound.high)]


# Each endpoint's body (serving/endpoints/) adds its own fields to these.
Body = msgspec.defstruct(
    "Body",
    [("model", Annotated[str, msgspec.Meta(min_length=1)]),
     *[(name, _bounded(bound) | None, None) for name, bound in SAMPLING_BOUNDS.items()],
     ("stream", Literal[False] | None, None),
     ("response_format", ResponseFormat | None, None)],
    kw_only=True,
    module=__name__,
)


# RecursionError: msgspec gives up on very deep nesting; the slow path refuses it.
DecodeError = msgspec.ValidationError, msgspec.DecodeError, RecursionError
