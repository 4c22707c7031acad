"""/v1/responses: OpenAI's Responses API, one full response per line.

The body is OpenAI's (`input` a string or a list of input items, `instructions`,
`max_output_tokens`, `text.format`, `reasoning`, ...); the engine runs it through
vLLM's own Responses serving (`OpenAIServingResponses`) on the same path as chat, and
the output body is a Response object (`object: "response"`, `output` items, `usage` in
input/output tokens).

What a batch cannot do is refused per line with `unsupported_parameter`: streaming, a
background response, continuing a stored response or conversation
(`previous_response_id`, `conversation`: a batch line has none to continue from), a
stored prompt template, and built-in tools (web search, file search, code
interpreter...: BatchGen runs none of them). `store` is accepted and nothing is kept.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from serving.endpoints.base import PREFIX_CHARS, EndpointSpec, register
from serving.line_checks import LineError, check_flag, check_sampling, shown
from serving.line_schema import CustomId
from serving.params import SAMPLING_BOUNDS, BatchParams, Bound, resolve_body

# The sampling parameters a Responses body takes (OpenAI's, and vLLM's top_k and
# penalties), held to the same bounds as chat's.
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "presence_penalty",
                   "frequency_penalty", "top_logprobs")
MAX_OUTPUT_TOKENS = Bound(integer=True, low=1)
ROLES = ("user", "assistant", "system", "developer")
_ROLES_SHOWN = ", ".join(repr(role) for role in ROLES)
# Content parts of an input message (OpenAI's input_* parts; an assistant turn given
# back as input carries output_text or refusal parts).
TEXT_PARTS = ("input_text", "output_text")
PART_TYPES = (*TEXT_PARTS, "input_image", "input_file", "input_audio", "refusal")
# Input items beside messages: a function call and its result, given back as
# history, and a reasoning item from an earlier turn.
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
FORMAT_TYPES = ("text", "json_object", "json_schema")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
SUMMARIES = ("auto", "concise", "detailed")
# OpenAI's metadata limits (as on a batch): 16 pairs, keys of 64, values of 512.
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512
# Fields whose any value but "off" asks what a batch cannot do, with why.
UNSUPPORTED = {
    "previous_response_id": "a batch line has no stored response to continue from; "
                            "send the earlier turns in `input`",
    "conversation": "a batch line has no stored conversation; send the earlier turns "
                    "in `input`",
    "prompt": "stored prompt templates are not kept here; send the prompt in "
              "`instructions` and `input`",
}
MESSAGE_OVERHEAD_CHARS = 16  # a message's role and template tokens, as chat's


# --- the fast path: the common shapes, strictly ------------------------------------------


def _bounded(bound: Bound) -> Any:
    if bound.integer:
        return Annotated[int, msgspec.Meta(ge=bound.low, le=bound.high)]
    if bound.low_open:
        return Annotated[float, msgspec.Meta(gt=bound.low, le=bound.high)]
    return Annotated[float, msgspec.Meta(ge=bound.low, le=bound.high)]


class InputText(msgspec.Struct, tag_field="type", tag="input_text"):
    text: str


class OutputText(msgspec.Struct, tag_field="type", tag="output_text"):
    text: str


class InputMessage(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | Annotated[list[InputText | OutputText], msgspec.Meta(min_length=1)]
    type: Literal["message"] | None = None


class TextFormat(msgspec.Struct, tag_field="type", tag="text"):
    pass


class JsonObjectFormat(msgspec.Struct, tag_field="type", tag="json_object"):
    pass


class JsonSchemaFormat(msgspec.Struct, tag_field="type", tag="json_schema", kw_only=True):
    name: str
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat | JsonObjectFormat | JsonSchemaFormat | None = None


class ReasoningConfig(msgspec.Struct, kw_only=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


Metadata = Annotated[
    dict[Annotated[str, msgspec.Meta(max_length=METADATA_KEY)],
         Annotated[str, msgspec.Meta(max_length=METADATA_VALUE)]],
    msgspec.Meta(max_length=METADATA_PAIRS)]

ResponseBody = msgspec.defstruct(
    "ResponseBody",
    [("model", Annotated[str, msgspec.Meta(min_length=1)]),
     ("input", str | Annotated[list[InputMessage], msgspec.Meta(min_length=1)]),
     ("instructions", str | None, None),
     ("max_output_tokens", _bounded(MAX_OUTPUT_TOKENS) | None, None),
     *[(name, _bounded(SAMPLING_BOUNDS[name]) | None, None) for name in SAMPLING_FIELDS],
     ("text", TextConfig | None, None),
     ("reasoning", ReasoningConfig | None, None),
     ("metadata", Metadata | None, None),
     ("user", str | None, None),
     ("store", bool | None, None),
     ("stream", Literal[False] | None, None),
     ("background", Literal[False] | None, None),
     # Any value of these takes the slow path, which names the problem.
     ("tools", Annotated[list[Any], msgspec.Meta(max_length=0)] | None, None),
     *[(name, None, None) for name in UNSUPPORTED]],
    kw_only=True,
    module=__name__,
)


class ResponseLine(msgspec.Struct):
    custom_id: CustomId
    method: Literal["POST"]
    url: Literal["/v1/responses"]
    body: ResponseBody


# --- the slow path: every rule, naming the field -------------------------------------------


def _unsupported(param: str, why: str) -> LineError:
    return LineError("unsupported_parameter", f"{param} is not available in a batch: {why}.",
                     param)


def check_input(value: Any) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list) or not value:
        raise LineError("invalid_body", "body.input must be a string or a non-empty list of "
                        f"input items (got {shown(value)}).", "body.input")
    for index, item in enumerate(value):
        check_item(item, where=f"body.input[{index}]")


def check_item(item: Any, *, where: str) -> None:
    """One input item as OpenAI's schema has it: a message (its `type` may be left
    out), or a function call, its output or a reasoning item given back as history."""
    if not isinstance(item, dict):
        raise LineError("invalid_body", f"{where} must be an object: a message with a role "
                        "and content, or an item with a type.", where)
    kind = item.get("type")
    kind = "message" if kind is None else kind
    if kind not in ITEM_TYPES:
        if kind == "item_reference":
            raise _unsupported(f"{where}.type", "a batch line has no stored items to refer to")
        raise LineError("invalid_body", f"{where}.type must be one of "
                        f"{', '.join(map(repr, ITEM_TYPES))} (got {shown(kind)}).",
                        f"{where}.type")
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            raise LineError("invalid_body", f"{where}.role must be one of {_ROLES_SHOWN} "
                            f"(got {shown(role)}).", f"{where}.role")
        check_content(item.get("content"), where=f"{where}.content")
    elif kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise LineError("invalid_body", f"{where}.{key} must be a string.",
                                f"{where}.{key}")
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise LineError("invalid_body", f"{where}.call_id must be a string: the call "
                            "this output answers.", f"{where}.call_id")
        if not isinstance(item.get("output"), str | list):
            raise LineError("invalid_body", f"{where}.output must be a string or a list of "
                            "content parts.", f"{where}.output")
    elif not isinstance(item.get("summary"), list):  # reasoning
        raise LineError("invalid_body", f"{where}.summary must be a list.", f"{where}.summary")


def check_content(content: Any, *, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not content:
        raise LineError("invalid_body", f"{where} must be a string or a non-empty list of "
                        f"content parts (got {shown(content)}).", where)
    for index, part in enumerate(content):
        at = f"{where}[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in PART_TYPES:
            raise LineError("invalid_body", f"{at} must be a content part whose type is one "
                            f"of {', '.join(map(repr, PART_TYPES))}, such as "
                            "{\"type\": \"input_text\", \"text\": \"...\"}.", f"{at}.type")
        if kind in TEXT_PARTS and not isinstance(part.get("text"), str):
            raise LineError("invalid_body", f"{at}.text must be a string.", f"{at}.text")


def check_text(value: Any) -> None:
    """`text.format`: plain text, any JSON object, or JSON following a schema (vLLM's
    guided decoding runs it; whether it can follow the schema is its verdict, per
    line)."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise LineError("invalid_body", "body.text must be an object such as "
                        "{\"format\": {\"type\": \"text\"}}.", "body.text")
    fmt = value.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict) or fmt.get("type") not in FORMAT_TYPES:
        raise LineError("invalid_body", "body.text.format must be an object whose type is "
                        "\"text\", \"json_object\" or \"json_schema\".", "body.text.format")
    if fmt["type"] != "json_schema":
        return
    if not isinstance(fmt.get("name"), str):
        raise LineError("invalid_body", "body.text.format.name is required for json_schema "
                        "(a string).", "body.text.format.name")
    if not isinstance(fmt.get("schema"), dict):
        raise LineError("invalid_body", "body.text.format.schema must be a JSON schema (an "
                        "object).", "body.text.format.schema")
    for key, kind, must in (("strict", bool, "true or false"),
                            ("description", str, "a string")):
        if fmt.get(key) is not None and not isinstance(fmt[key], kind):
            raise LineError("invalid_body", f"body.text.format.{key} must be {must}.",
                            f"body.text.format.{key}")


def check_reasoning(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise LineError("invalid_body", "body.reasoning must be an object such as "
                        "{\"effort\": \"low\"}.", "body.reasoning")
    for key, allowed in (("effort", EFFORTS), ("summary", SUMMARIES)):
        if value.get(key) is not None and value[key] not in allowed:
            raise LineError("invalid_body", f"body.reasoning.{key} must be one of "
                            f"{', '.join(map(repr, allowed))} (got {shown(value[key])}).",
                            f"body.reasoning.{key}")


def check_metadata(value: Any) -> None:
    if value is None:
        return
    valid = (isinstance(value, dict) and len(value) <= METADATA_PAIRS
             and all(isinstance(k, str) and len(k) <= METADATA_KEY and isinstance(v, str)
                     and len(v) <= METADATA_VALUE for k, v in value.items()))
    if not valid:
        raise LineError("invalid_body", f"body.metadata must be an object of at most "
                        f"{METADATA_PAIRS} string pairs (keys up to {METADATA_KEY} "
                        f"characters, values up to {METADATA_VALUE}).", "body.metadata")


def check_tools(value: Any) -> None:
    """Function tools only: the model's calls come back as function_call items for
    the caller to run. Built-in tools would need BatchGen to run them."""
    if value is None:
        return
    if not isinstance(value, list):
        raise LineError("invalid_body", "body.tools must be a list.", "body.tools")
    for index, tool in enumerate(value):
        where = f"body.tools[{index}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(kind, str):
            raise LineError("invalid_body", f"{where} must be an object with a type.", where)
        if kind != "function":
            raise _unsupported(f"{where}.type", f"built-in tools ({kind!r}) are not run "
                               "here; only function tools are")
        if not isinstance(tool.get("name"), str):
            raise LineError("invalid_body", f"{where}.name must be a string.",
                            f"{where}.name")


# --- the prefix: instructions and the leading input items --------------------------------


def _part_text(part: Any) -> str:
    if isinstance(part, dict):
        return f"{part.get('type')}:{part.get('text', '')}"
    return f"{part.__struct_config__.tag}:{part.text}"  # a fast-path struct


def _item_text(item: Any) -> str:
    """An input item as the prefix key reads it; the same for a dict (slow path) and
    a decoded struct (fast path)."""
    if isinstance(item, dict):
        role, content = item.get("role") or item.get("type"), item.get("content")
        if content is None:
            content = str(item)
    else:
        role, content = item.role, item.content
    if not isinstance(content, str):
        content = "\x1f".join(map(_part_text, content)) if isinstance(content, list) \
            else str(content)
    return f"{role}\x1e{content}"


def _prefix(instructions: Any, items: Any) -> tuple[str, str]:
    """What requests sharing a prefix have in common: the instructions and every
    input item before the last (few-shot turns, a shared document); the first
    characters of the only input when nothing comes before it."""
    instructions = instructions if isinstance(instructions, str) else ""
    if isinstance(items, str):
        return instructions, "" if instructions else items[:PREFIX_CHARS]
    if len(items) > 1:
        return instructions, "\x1d".join(map(_item_text, items[:-1]))
    return instructions, "" if instructions else _item_text(items[0])[:PREFIX_CHARS]


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


@register
class Responses(EndpointSpec):
    url = "/v1/responses"
    name = "responses"
    member = "RESPONSES"
    line_type = ResponseLine
    output_limit_field = "max_output_tokens"

    def check_body(self, body: dict[str, Any]) -> None:
        check_input(body.get("input"))
        if body.get("instructions") is not None and not isinstance(body["instructions"], str):
            raise LineError("invalid_body", "body.instructions must be a string.",
                            "body.instructions")
        limit = body.get("max_output_tokens")
        if limit is not None and not MAX_OUTPUT_TOKENS.admits(limit):
            raise LineError("invalid_body", f"body.max_output_tokens {MAX_OUTPUT_TOKENS.must}.",
                            "body.max_output_tokens")
        check_sampling({key: body[key] for key in SAMPLING_FIELDS if key in body},
                       prefix="body.")
        check_text(body.get("text"))
        check_reasoning(body.get("reasoning"))
        check_metadata(body.get("metadata"))
        if body.get("user") is not None and not isinstance(body["user"], str):
            raise LineError("invalid_body", "body.user must be a string.", "body.user")
        check_flag(body, "store")
        for key, why in (("stream", "a batch line gets one full response"),
                         ("background", "a batch runs every line in the background "
                                        "already")):
            check_flag(body, key)
            if body.get(key):
                raise _unsupported(f"body.{key}", why)
        for key, why in UNSUPPORTED.items():
            if body.get(key) is not None:
                raise _unsupported(f"body.{key}", why)
        check_tools(body.get("tools"))

    def prefix_key_of_line(self, line: ResponseLine) -> int:
        return hash(_prefix(line.body.instructions, line.body.input))

    def prefix_key(self, body: dict[str, Any]) -> int:
        return hash(_prefix(body.get("instructions"), body["input"]))

    def resolve_body(self, body: dict[str, Any], batch: BatchParams) -> dict[str, Any]:
        resolved = resolve_body(body, batch, output_limit_field=self.output_limit_field)
        # Nothing is kept: the engine (vLLM's, or a remote server) stores no response.
        resolved["store"] = False
        return resolved

    def _messages(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        """(role, text) of the instructions and of each input item."""
        messages = []
        if body.get("instructions"):
            messages.append(("system", body["instructions"]))
        items = body.get("input")
        if isinstance(items, str):
            return [*messages, ("user", items)]
        for item in items or []:
            if isinstance(item, dict):
                messages.append((str(item.get("role") or item.get("type")),
                                 _text_of(item.get("content", item.get("output",
                                                                       item.get("arguments"))))))
        return messages

    def prompt_chars(self, body: dict[str, Any]) -> int:
        return sum(len(text) + MESSAGE_OVERHEAD_CHARS for _, text in self._messages(body))

    def shared_prefix_chars(self, body: dict[str, Any]) -> int:
        instructions, leading = _prefix(body.get("instructions"), body["input"])
        return len(instructions) + len(leading) + MESSAGE_OVERHEAD_CHARS

    def prompt_text(self, body: dict[str, Any]) -> str:
        return "\n".join(f"{role}: {text}" for role, text in self._messages(body))

    # --- output ----------------------------------------------------------------------------

    def token_counts(self, usage: dict[str, Any]) -> tuple[int, int]:
        return usage.get("input_tokens") or 0, usage.get("output_tokens") or 0

    def complete_usage(self, usage: dict[str, Any]) -> None:
        """OpenAI's ResponseUsage, whole: input and output tokens with their details
        (vLLM's per-turn lists, which OpenAI does not have, left out)."""
        usage["input_tokens"] = usage.get("input_tokens") or 0
        usage["output_tokens"] = usage.get("output_tokens") or 0
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        inputs = usage.setdefault("input_tokens_details", {})
        inputs["cached_tokens"] = inputs.get("cached_tokens") or 0
        inputs["cache_write_tokens"] = inputs.get("cache_write_tokens") or 0
        outputs = usage.setdefault("output_tokens_details", {})
        outputs["reasoning_tokens"] = outputs.get("reasoning_tokens") or 0
        for details in (inputs, outputs):
            for key in [key for key in details if key.endswith("_per_turn")]:
                del details[key]

    def simulated_body(self, *, request_id: str, model: str, created: int, text: str,
                       finish_reason: str, usage: dict[str, int],
                       request_body: dict[str, Any]) -> dict[str, Any]:
        incomplete = finish_reason == "length"
        return {
            "id": f"resp_{request_id}", "object": "response", "created_at": created,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "error": None, "model": model,
            "instructions": request_body.get("instructions"),
            "metadata": request_body.get("metadata"),
            "output": [{"id": f"msg_{request_id}", "type": "message", "role": "assistant",
                        "status": "incomplete" if incomplete else "completed",
                        "content": [{"type": "output_text", "text": text,
                                     "annotations": []}]}],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "temperature": request_body.get("temperature"),
            "top_p": request_body.get("top_p"),
            "max_output_tokens": request_body.get("max_output_tokens"),
            "text": request_body.get("text") or {"format": {"type": "text"}},
            "usage": {"input_tokens": usage["prompt_tokens"],
                      "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                      "output_tokens": usage["completion_tokens"],
                      "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]},
        }

    def shape_output(self, body: dict[str, Any]) -> dict[str, Any]:
        # Members OpenAI's Response always carries, null when unset (the engine's
        # dump leaves nulls out).
        for key in ("error", "incomplete_details", "instructions", "metadata", "user"):
            body.setdefault(key, None)
        return body
