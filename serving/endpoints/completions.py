"""/v1/completions: a prompt in (text, texts or token ids), text out."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from serving.endpoints.base import (
    PREFIX_CHARS,
    EndpointSpec,
    choice_count,
    choices_with_defaults,
    register,
    text_prefix_key,
)
from serving.line_checks import LineError, check_response_format, check_sampling
from serving.line_schema import Body, CustomId, Int64
from serving.params import SAMPLING_BOUNDS, Bound

# Completions' logprobs is a count (the most likely tokens at each step), up to
# what vLLM returns by default (its max_logprobs).
LOGPROBS = Bound(integer=True, low=0, high=SAMPLING_BOUNDS["top_logprobs"].high)


class CompletionBody(Body, kw_only=True):
    prompt: str | Annotated[list[str | Int64], msgspec.Meta(min_length=1)]
    logprobs: Annotated[int, msgspec.Meta(ge=LOGPROBS.low, le=LOGPROBS.high)] | None = None


class CompletionLine(msgspec.Struct):
    custom_id: CustomId
    method: Literal["POST"]
    url: Literal["/v1/completions"]
    body: CompletionBody


@register
class Completions(EndpointSpec):
    url = "/v1/completions"
    name = "completion"
    member = "COMPLETIONS"
    line_type = CompletionLine
    output_limit_field = "max_tokens"  # completions know no max_completion_tokens

    def check_body(self, body: dict[str, Any]) -> None:
        prompt = body.get("prompt")
        valid = isinstance(prompt, str) or (
            isinstance(prompt, list) and prompt
            and all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in prompt)
        )
        if not valid:
            raise LineError("invalid_body",
                            "body.prompt must be a string or a non-empty list.", "body.prompt")
        check_sampling(body, prefix="body.")
        logprobs = body.get("logprobs")
        if logprobs is not None and not LOGPROBS.admits(logprobs):
            raise LineError("invalid_body", f"body.logprobs {LOGPROBS.must}.", "body.logprobs")
        check_response_format(body)

    def prefix_key_of_line(self, line: CompletionLine) -> int:
        return text_prefix_key(line.body.prompt)

    def prefix_key(self, body: dict[str, Any]) -> int:
        return text_prefix_key(body.get("prompt"))

    def prompt_chars(self, body: dict[str, Any]) -> int:
        prompt = body.get("prompt")
        return len(prompt) if isinstance(prompt, str) else len(str(prompt))

    def shared_prefix_chars(self, body: dict[str, Any]) -> int:
        """The first characters of the prompt, which prefix_key hashes."""
        return min(self.prompt_chars(body), PREFIX_CHARS)

    def prompt_text(self, body: dict[str, Any]) -> str:
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))

    def simulated_body(self, *, request_id: str, model: str, created: int, text: str,
                       finish_reason: str, usage: dict[str, int],
                       request_body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": f"cmpl-{request_id}", "object": "text_completion",
            "created": created, "model": model,
            "choices": [{"index": index, "text": text, "logprobs": None,
                         "finish_reason": finish_reason}
                        for index in range(choice_count(request_body))],
            "usage": usage,
        }

    def shape_output(self, body: dict[str, Any]) -> dict[str, Any]:
        return choices_with_defaults(body)
