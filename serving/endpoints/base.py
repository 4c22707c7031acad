"""What an endpoint is to BatchGen: one spec per URL, and the registry of them.

A spec holds everything that differs between endpoints, so nothing else in the code
spells a URL or branches on one: the line's msgspec type (the fast path of
validation), the body checks (the slow path, which names the problem), the prefix
key (chunking), the parameter resolution, the token estimate (admission), the
simulated engine's answer and the shape of the output body. Engines dispatch on the
spec's `name` to their own method for it (`VllmEngine.serve_chat`, ...).

Like vLLM's parser managers, specs register themselves by URL when their module is
imported; serving/endpoints/__init__.py imports every spec module.

Specs import neither Django nor vLLM: the web process, the control worker and the
inference workers all read them.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from serving.params import BatchParams, resolve_body

# Without earlier turns, the first characters of the only message or of the prompt
# stand for its prefix (batches/chunking.py).
PREFIX_CHARS = 512


class EndpointSpec:
    """One batch endpoint. Subclasses set the class attributes and the methods."""

    url: ClassVar[str]  # the batch's `endpoint` and every line's `url`
    name: ClassVar[str]  # short name: engines' methods are serve_<name>
    member: ClassVar[str]  # the member of batches.models.Endpoint (CHAT, COMPLETIONS, ...)
    line_type: ClassVar[type[msgspec.Struct]]  # a whole line, as the fast path decodes it
    # Where the output token limit goes in the body the engine runs.
    output_limit_field: ClassVar[str] = "max_tokens"
    generates: ClassVar[bool] = True  # produces output tokens (admission counts them)
    # Scores pairs of texts (/v1/score, /v1/rerank): what a cross-encoder model serves
    # (serving/engines/registry.py), besides an embedding model.
    scores_pairs: ClassVar[bool] = False

    def __init__(self) -> None:
        self.decoder = msgspec.json.Decoder(self.line_type)

    # --- validation ----------------------------------------------------------------------

    def check_body(self, body: dict[str, Any]) -> None:
        """The endpoint's own fields (`model` is checked by the caller), with the
        sampling ones (serving.line_checks.check_sampling) where it takes them; raise
        LineError naming what is wrong."""
        raise NotImplementedError

    def prefix_key_of_line(self, line: Any) -> int:
        """prefix_key for a line decoded by `decoder` (the fast path)."""
        raise NotImplementedError

    def prefix_key(self, body: dict[str, Any]) -> int:
        """A key equal for requests that likely share a prefix. Keys are compared only
        within one validation run, so Python's own hash serves."""
        raise NotImplementedError

    # --- running -------------------------------------------------------------------------

    def resolve_body(self, body: dict[str, Any], batch: BatchParams) -> dict[str, Any]:
        """The body the engine runs (serving/params.py: body > batch > server)."""
        return resolve_body(body, batch, output_limit_field=self.output_limit_field)

    def prompt_chars(self, body: dict[str, Any]) -> int:
        """The prompt's length in characters, for admission's token estimate."""
        raise NotImplementedError

    def shared_prefix_chars(self, body: dict[str, Any]) -> int:
        """How many of the prompt's first characters `prefix_key` stands for: requests
        with the same key share them, and the engine's prefix cache holds them once
        (admission counts them once, inference/slots.py). 0 when nothing is shared
        (an endpoint whose engine caches no prefixes)."""
        return 0

    def prompt_text(self, body: dict[str, Any]) -> str:
        """The prompt as one text (the simulated engine answers from it)."""
        raise NotImplementedError

    def simulated_body(self, *, request_id: str, model: str, created: int, text: str,
                       finish_reason: str, usage: dict[str, int],
                       request_body: dict[str, Any]) -> dict[str, Any]:
        """The simulated engine's output body for `text`, its answer to
        `request_body`."""
        raise NotImplementedError

    def token_counts(self, usage: dict[str, Any]) -> tuple[int, int]:
        """(input, output) tokens of a response body's `usage`."""
        return usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0

    def complete_usage(self, usage: dict[str, Any]) -> None:
        """Fill in what an engine's `usage` left out (zeros, the total), in place."""
        usage["prompt_tokens"] = usage.get("prompt_tokens") or 0
        usage["completion_tokens"] = usage.get("completion_tokens") or 0
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]

    def shape_output(self, body: dict[str, Any]) -> dict[str, Any]:
        """An engine's response body (a plain dict) as the API contract shapes it."""
        return body

    def answer_as_asked(self, body: dict[str, Any],
                        request_body: dict[str, Any]) -> dict[str, Any]:
        """The shaped body narrowed to what the request asked for where the engine
        answers more than that (rerank's `return_documents`, which vLLM lacks)."""
        return body


ENDPOINTS: dict[str, EndpointSpec] = {}
# Batch endpoints of OpenAI's that BatchGen refuses at create, and why.
# (None now: every one of them is registered.)
NOT_BATCHED: dict[str, str] = {}


def register(spec_class: type[EndpointSpec]) -> type[EndpointSpec]:
    """Class decorator: serve `spec_class.url` with one instance of it."""
    if spec_class.url in ENDPOINTS:
        raise ValueError(f"endpoint {spec_class.url} is registered twice")
    ENDPOINTS[spec_class.url] = spec_class()
    return spec_class


def endpoint_spec(url: str) -> EndpointSpec:
    try:
        return ENDPOINTS[url]
    except KeyError:
        raise ValueError(f"unknown endpoint {url!r}") from None


def choice_count(body: dict[str, Any]) -> int:
    """How many choices a request asks for (`n`, 1 when unset)."""
    return body.get("n") or 1


def choices_with_defaults(body: dict[str, Any]) -> dict[str, Any]:
    """Every choice carries finish_reason and logprobs, null when the engine left
    them out (the API contract's shape)."""
    for choice in body["choices"]:
        choice.setdefault("finish_reason", None)
        choice.setdefault("logprobs", None)
    return body


def text_prefix_key(prompt: Any) -> int:
    """The prefix key of a prompt given as text or as a list (of texts or tokens)."""
    return hash(prompt[:PREFIX_CHARS] if isinstance(prompt, str) else str(prompt)[:PREFIX_CHARS])
