"""/v1/embeddings: texts (or token ids) in, one vector per input out.

No sampling and no output tokens: the body is run as it is, and admission counts only
the input. The fast path's type takes text inputs; token-id inputs, which msgspec
cannot tell from a list of texts in one union, take the slow path."""

from __future__ import annotations

import base64
import hashlib
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from serving.endpoints.base import EndpointSpec, register, text_prefix_key
from serving.line_checks import LineError
from serving.line_schema import CustomId
from serving.params import INT64_MAX, BatchParams, Bound

# all-MiniLM-L6-v2's size: what the simulated engine answers when none is asked.
SIMULATED_DIMENSIONS = 384
ENCODING_FORMATS = ("float", "base64")
DIMENSIONS = Bound(integer=True, low=1)
TOKEN_ID = Bound(integer=True, low=0, high=INT64_MAX)
CHARS_PER_TOKEN_ID = 4  # a token id stands for about this many characters of text
Text = Annotated[str, msgspec.Meta(min_length=1)]


class EmbeddingBody(msgspec.Struct, kw_only=True):
    model: Annotated[str, msgspec.Meta(min_length=1)]
    input: Text | Annotated[list[Text], msgspec.Meta(min_length=1)]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)] | None = None


class EmbeddingLine(msgspec.Struct):
    custom_id: CustomId
    method: Literal["POST"]
    url: Literal["/v1/embeddings"]
    body: EmbeddingBody


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(map(TOKEN_ID.admits, value))


def _valid_input(value: Any) -> bool:
    """OpenAI's four shapes: a text, texts, token ids, lists of token ids."""
    if isinstance(value, str):
        return bool(value)
    if not isinstance(value, list) or not value:
        return False
    return (all(isinstance(item, str) and item for item in value)
            or _is_token_ids(value)
            or all(_is_token_ids(item) for item in value))


def _inputs(body: dict[str, Any]) -> list[str | list[int]]:
    """The body's input as a list of single inputs (a text or token ids each)."""
    value = body["input"]
    if isinstance(value, str) or (value and isinstance(value[0], int)):
        return [value]
    return value


def _simulated_vector(item: str | list[int], dimensions: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(str(item).encode()).digest()[:8], "little")
    vector = np.random.default_rng(seed).standard_normal(dimensions).astype(np.float32)
    return vector / np.linalg.norm(vector)


@register
class Embeddings(EndpointSpec):
    url = "/v1/embeddings"
    name = "embeddings"
    member = "EMBEDDINGS"
    line_type = EmbeddingLine
    generates = False

    def check_body(self, body: dict[str, Any]) -> None:
        if not _valid_input(body.get("input")):
            raise LineError("invalid_body", "body.input must be a non-empty string, a "
                            "non-empty list of non-empty strings, a list of token ids or "
                            "a list of lists of token ids.", "body.input")
        encoding_format = body.get("encoding_format")
        if encoding_format is not None and encoding_format not in ENCODING_FORMATS:
            raise LineError("invalid_body", "body.encoding_format must be \"float\" or "
                            "\"base64\".", "body.encoding_format")
        dimensions = body.get("dimensions")
        if dimensions is not None and not DIMENSIONS.admits(dimensions):
            raise LineError("invalid_body", f"body.dimensions {DIMENSIONS.must}.",
                            "body.dimensions")

    def prefix_key_of_line(self, line: EmbeddingLine) -> int:
        return text_prefix_key(line.body.input)

    def prefix_key(self, body: dict[str, Any]) -> int:
        return text_prefix_key(body.get("input"))

    def resolve_body(self, body: dict[str, Any], batch: BatchParams) -> dict[str, Any]:
        # Sampling and output limits mean nothing to an embedding: run it as sent.
        return dict(body)

    def prompt_chars(self, body: dict[str, Any]) -> int:
        return sum(len(item) if isinstance(item, str) else CHARS_PER_TOKEN_ID * len(item)
                   for item in _inputs(body))

    def prompt_text(self, body: dict[str, Any]) -> str:
        return " ".join(item if isinstance(item, str) else " ".join(map(str, item))
                        for item in _inputs(body))

    def simulated_body(self, *, request_id: str, model: str, created: int, text: str,
                       finish_reason: str, usage: dict[str, int],
                       request_body: dict[str, Any]) -> dict[str, Any]:
        dimensions = request_body.get("dimensions") or SIMULATED_DIMENSIONS
        as_base64 = request_body.get("encoding_format") == "base64"
        data = []
        for index, item in enumerate(_inputs(request_body)):
            vector = _simulated_vector(item, dimensions)
            embedding = (base64.b64encode(vector.tobytes()).decode() if as_base64
                         else vector.tolist())
            data.append({"index": index, "object": "embedding", "embedding": embedding})
        prompt_tokens = usage["prompt_tokens"]
        return {"id": f"embd-{request_id}", "object": "list", "created": created,
                "model": model, "data": data,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}

    def shape_output(self, body: dict[str, Any]) -> dict[str, Any]:
        # OpenAI's embeddings usage counts input tokens only.
        usage = body["usage"]
        usage.pop("completion_tokens", None)
        usage["total_tokens"] = usage.get("prompt_tokens", 0)
        return body
