"""The slow path's checks every endpoint shares: the error they raise and the
sampling and length parameters (serving/params.py's bounds). Each endpoint's own
fields are checked by its spec (serving/endpoints/)."""

from __future__ import annotations

from typing import Any

from serving.params import SAMPLING_BOUNDS


class LineError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def shown(value: Any, limit: int = 80) -> str:
    """A value quoted in an error message, cut short: a line may be megabytes, and
    up to MAX_LISTED_ERRORS messages are kept on the batch."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


# Each checked parameter: (value is fine?, what it must be). Only the keys a body
# actually has are looked at, so a typical line costs one set intersection.
SAMPLING_RULES: dict[str, tuple[Any, str]] = {
    **{key: (bound.admits, bound.must) for key, bound in SAMPLING_BOUNDS.items()},
    "stream": (lambda v: v is False, "must be false: streaming is not available in a batch"),
}
_SAMPLING_KEYS = SAMPLING_RULES.keys()


def check_sampling(values: dict[str, Any], *, prefix: str = "") -> None:
    """The sampling and length parameters shared by lines and batches."""
    for key in values.keys() & _SAMPLING_KEYS:
        value = values[key]
        if value is None:
            continue
        valid, must = SAMPLING_RULES[key]
        if not valid(value):
            raise LineError("invalid_body", f"{prefix}{key} {must}.", f"{prefix}{key}")


# OpenAI's structured-output formats; vLLM's guided decoding runs them.
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def check_response_format(body: dict[str, Any]) -> None:
    """`response_format`, as OpenAI's schema has it. Whether the JSON schema itself
    is one the engine can follow is the engine's verdict, per line."""
    value = body.get("response_format")
    if value is None:
        return
    if not isinstance(value, dict) or value.get("type") not in RESPONSE_FORMATS:
        raise LineError("invalid_body", "body.response_format must be an object whose type "
                        "is \"text\", \"json_object\" or \"json_schema\".",
                        "body.response_format")
    if value["type"] != "json_schema":
        return
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise LineError("invalid_body", "body.response_format.json_schema must be an object "
                        "with a name (a string) and a schema.",
                        "body.response_format.json_schema")
    if spec.get("schema") is not None and not isinstance(spec["schema"], dict):
        raise LineError("invalid_body", "body.response_format.json_schema.schema must be a "
                        "JSON schema (an object).", "body.response_format.json_schema.schema")


def check_flag(body: dict[str, Any], key: str) -> None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise LineError("invalid_body", f"body.{key} must be true or false.", f"body.{key}")
