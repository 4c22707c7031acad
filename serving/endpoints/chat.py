"""/v1/chat/completions: a list of messages in, an assistant message out."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from serving.endpoints.base import (
    PREFIX_CHARS,
    EndpointSpec,
    choice_count,
    choices_with_defaults,
    register,
)
from serving.line_checks import (
    LineError,
    check_flag,
    check_response_format,
    check_sampling,
    shown,
)
from serving.line_schema import Body, CustomId, Message


class ChatBody(Body, kw_only=True):
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    logprobs: bool | None = None  # chat's is a flag; top_logprobs says how many


class ChatLine(msgspec.Struct):
    custom_id: CustomId
    method: Literal["POST"]
    url: Literal["/v1/chat/completions"]
    body: ChatBody


# OpenAI's chat roles. Its deprecated `function` role is not taken: `tool` replaced it.
ROLES = ("system", "developer", "user", "assistant", "tool")
_ROLES_SHOWN = ", ".join(repr(role) for role in ROLES)


def check_message(message: Any, *, where: str) -> None:
    """One chat message, as OpenAI's schema has it: a known role; content a string
    or a non-empty list of parts, which only an assistant turn carrying tool calls
    may leave out; a tool message answers a tool_call_id."""
    if not isinstance(message, dict):
        raise LineError("invalid_body", f"{where} must be an object with a role.", where)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise LineError("invalid_body", f"{where}.role must be one of {_ROLES_SHOWN} "
                        f"(got {shown(role)}).", f"{where}.role")
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise LineError("invalid_body", f"{where}.tool_call_id is required in a tool "
                        "message (a string: the id of the call it answers).",
                        f"{where}.tool_call_id")
    calls_tools = False
    if role == "assistant":
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise LineError("invalid_body", f"{where}.tool_calls must be a list.",
                            f"{where}.tool_calls")
        calls_tools = bool(tool_calls) or message.get("function_call") is not None
    content = message.get("content")
    if content is None:
        if calls_tools:
            return
        raise LineError("invalid_body", f"{where}.content is required: a string or a "
                        "list of content parts.", f"{where}.content")
    check_content(content, where=f"{where}.content")


def check_content(content: Any, *, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not content:
        raise LineError("invalid_body", f"{where} must be a string or a non-empty list of "
                        f"content parts (got {shown(content)}).", where)
    for index, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise LineError("invalid_body", f"{where}[{index}] must be an object with a "
                            "type, such as {\"type\": \"text\", \"text\": \"...\"}.",
                            f"{where}[{index}]")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise LineError("invalid_body", f"{where}[{index}].text must be a string.",
                            f"{where}[{index}].text")


# A message's share of the prompt beyond its content: role and template tokens.
MESSAGE_OVERHEAD_CHARS = 16


@register
class ChatCompletions(EndpointSpec):
    url = "/v1/chat/completions"
    name = "chat"
    member = "CHAT"
    line_type = ChatLine
    # Chat takes max_completion_tokens (max_tokens is its deprecated alias).
    output_limit_field = "max_completion_tokens"

    def check_body(self, body: dict[str, Any]) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise LineError("invalid_body", "body.messages must be a non-empty list.",
                            "body.messages")
        for index, message in enumerate(messages):
            check_message(message, where=f"body.messages[{index}]")
        check_sampling(body, prefix="body.")
        check_flag(body, "logprobs")
        check_response_format(body)

    def prefix_key_of_line(self, line: ChatLine) -> int:
        messages = line.body.messages
        first = messages[0]
        content = first.content
        if not isinstance(content, str):
            # As the slow path sees them: the parts as dicts, not as msgspec structs.
            content = str(msgspec.to_builtins(content))
        if len(messages) == 1:
            content = content[:PREFIX_CHARS]
        return hash((first.role, content))

    def prefix_key(self, body: dict[str, Any]) -> int:
        """The first message (the system prompt, which few-shot turns follow) when
        more come after it; otherwise the first characters of the only message."""
        messages = body["messages"]
        first = messages[0]
        content = first.get("content")
        if not isinstance(content, str):
            content = str(content)
        if len(messages) == 1:
            content = content[:PREFIX_CHARS]
        return hash((first.get("role"), content))

    def prompt_chars(self, body: dict[str, Any]) -> int:
        return sum(len(str(m.get("content") or "")) + MESSAGE_OVERHEAD_CHARS
                   for m in body["messages"])

    def shared_prefix_chars(self, body: dict[str, Any]) -> int:
        """The first message, which prefix_key hashes (its first characters when
        it is the only one)."""
        messages = body["messages"]
        content = messages[0].get("content")
        size = len(content if isinstance(content, str) else str(content))
        if len(messages) == 1:
            size = min(size, PREFIX_CHARS)
        return size + MESSAGE_OVERHEAD_CHARS

    def prompt_text(self, body: dict[str, Any]) -> str:
        parts = []
        for message in body.get("messages", []):
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(f"{message.get('role')}: {content or ''}")
        return "\n".join(parts)

    def simulated_body(self, *, request_id: str, model: str, created: int, text: str,
                       finish_reason: str, usage: dict[str, int],
                       request_body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{request_id}", "object": "chat.completion",
            "created": created, "model": model,
            "choices": [{"index": index, "message": {
                "role": "assistant", "content": text, "reasoning_content": None,
                "tool_calls": []}, "logprobs": None, "finish_reason": finish_reason}
                for index in range(choice_count(request_body))],
            "usage": usage,
        }

    def shape_output(self, body: dict[str, Any]) -> dict[str, Any]:
        for choice in choices_with_defaults(body)["choices"]:
            message = choice.get("message")
            if message is not None:
                # vLLM calls the parsed thinking `reasoning`; the API contract (and
                # most OpenAI-compatible clients) call it `reasoning_content`.
                message["reasoning_content"] = message.pop("reasoning", None)
                message.setdefault("content", None)
                message.setdefault("tool_calls", [])
        return body
