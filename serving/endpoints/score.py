"""/v1/score (and vLLM's unversioned /score): pairs of texts in, one relevance score
per pair out, as vLLM's Score API defines them.

A body gives two sides, in one of vLLM's forms: `text_1`/`text_2`, `queries`/
`documents`, `queries`/`items` or `data_1`/`data_2`. Each side is a text or a list of
texts (vLLM's multimodal `{"content": [...]}` items too, on the slow path); the first
side has one item (scored against every item of the second: one-to-many) or as many as
the second (one-to-one). An embedding model scores a pair by the cosine of its two
embeddings; a cross-encoder (a sequence classifier with one label) reads the pair
together. Both run on vLLM's pooling runner and generate nothing, so the body runs as
sent and admission counts only the input. The first side keys the prefix grouping:
lines about the same query land in the same chunk.

Shared with /v1/rerank (serving/endpoints/rerank.py): the checks of a side and of the
pooling options, the simulated scores and the usage shape."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from serving.endpoints.base import EndpointSpec, register, text_prefix_key
from serving.endpoints.embeddings import SIMULATED_DIMENSIONS, _simulated_vector
from serving.line_checks import LineError, check_flag
from serving.line_schema import CustomId
from serving.params import INT64_MAX, BatchParams, Bound

Text = Annotated[str, msgspec.Meta(min_length=1)]
Side = Text | Annotated[list[Text], msgspec.Meta(min_length=1)]
# vLLM's pair forms, the first side's name then the second's; its own order of trying.
PAIR_FORMS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
              ("text_1", "text_2"))
# vLLM's pooling options a line may give (the others it takes need no check of ours).
TRUNCATE_PROMPT_TOKENS = Bound(integer=True, low=-1, high=INT64_MAX)
TOKENS_PER_SIDE = Bound(integer=True, low=0, high=INT64_MAX)


class ScoringOptions(msgspec.Struct, kw_only=True):
    """The fields every scoring body may carry (vLLM's ScoringRequestMixin)."""

    model: Annotated[str, msgspec.Meta(min_length=1)]
    truncate_prompt_tokens: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)] | None = None
    max_tokens_per_query: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)] | None = None
    max_tokens_per_doc: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)] | None = None
    use_activation: bool | None = None
    instruction: str | None = None


class ScoreBody(ScoringOptions, kw_only=True):
    """The fast path takes the `queries`/`documents` and `text_1`/`text_2` forms with
    text sides; the other forms and multimodal items take the slow path, which
    accepts them too. The form is picked as the slow path picks it (so the other
    forms' names are fields here, only to be seen)."""

    queries: Side | None = None
    documents: Side | None = None
    text_1: Side | None = None
    text_2: Side | None = None
    items: Any = None
    data_1: Any = None
    data_2: Any = None

    def __post_init__(self) -> None:
        # A ValueError here is msgspec's ValidationError: the line takes the slow path.
        try:
            first, second = pair_form(lambda key: getattr(self, key) is not None)
        except LineError as error:
            raise ValueError(error.message) from None
        if (first, second) not in FAST_FORMS or getattr(self, second) is None:
            raise ValueError("a form the slow path checks")
        firsts, seconds = side_items(getattr(self, first)), side_items(getattr(self, second))
        if len(firsts) > 1 and len(firsts) != len(seconds):
            raise ValueError("sides of different lengths")

    @property
    def first_side(self) -> Any:
        return self.queries if self.documents is not None else self.text_1


FAST_FORMS = (("queries", "documents"), ("text_1", "text_2"))


class ScoreLine(msgspec.Struct):
    custom_id: CustomId
    method: Literal["POST"]
    url: Literal["/v1/score"]
    body: ScoreBody


# --- shared with /v1/rerank -------------------------------------------------------------------


def _valid_item(value: Any) -> bool:
    """A text (non-empty) or vLLM's multimodal item, `{"content": [parts]}`."""
    if isinstance(value, str):
        return bool(value)
    return (isinstance(value, dict) and isinstance(value.get("content"), list)
            and bool(value["content"]) and all(isinstance(part, dict)
                                               for part in value["content"]))


def side_items(value: Any) -> list[Any]:
    """A side as a list of items (a single item is a list of one)."""
    return value if isinstance(value, list) else [value]


def check_side(body: dict[str, Any], key: str, *, allow_list: bool = True) -> list[Any]:
    """One side of a pair: a text, or a non-empty list of texts; its items."""
    value = body.get(key)
    items = side_items(value) if allow_list else [value]
    if value is None or not items or not all(map(_valid_item, items)):
        what = ("a non-empty string or a non-empty list of non-empty strings"
                if allow_list else "a non-empty string")
        raise LineError("invalid_body", f"body.{key} must be {what}.", f"body.{key}")
    return items


def check_scoring_options(body: dict[str, Any]) -> None:
    """vLLM's pooling options of a scoring request (ScoringRequestMixin)."""
    for key, bound in (("truncate_prompt_tokens", TRUNCATE_PROMPT_TOKENS),
                       ("max_tokens_per_query", TOKENS_PER_SIDE),
                       ("max_tokens_per_doc", TOKENS_PER_SIDE)):
        value = body.get(key)
        if value is not None and not bound.admits(value):
            raise LineError("invalid_body", f"body.{key} {bound.must}.", f"body.{key}")
    check_flag(body, "use_activation")
    instruction = body.get("instruction")
    if instruction is not None and not isinstance(instruction, str):
        raise LineError("invalid_body", "body.instruction must be a string.",
                        "body.instruction")


def item_text(item: Any) -> str:
    """An item's text: the text parts of a multimodal item."""
    if isinstance(item, str):
        return item
    return " ".join(part.get("text", "") for part in item["content"]
                    if isinstance(part, dict) and isinstance(part.get("text"), str))


def item_prefix_key(item: Any) -> int:
    return text_prefix_key(item_text(item))


def simulated_score(first: Any, second: Any) -> float:
    """The simulated engine's score of a pair: the cosine of the two items' simulated
    embeddings (as vLLM scores with an embedding model), so it is deterministic."""
    vectors = [_simulated_vector(item_text(item), SIMULATED_DIMENSIONS)
               for item in (first, second)]
    return float(np.dot(*vectors))


def simulated_id(prefix: str, request_id: str) -> str:
    return f"{prefix}-{hashlib.sha256(request_id.encode()).hexdigest()[:24]}"


def input_usage(body: dict[str, Any]) -> dict[str, Any]:
    """A scoring answer's usage counts input tokens only, as vLLM's does."""
    usage = body["usage"]
    usage.pop("completion_tokens", None)
    usage["total_tokens"] = usage.get("prompt_tokens", 0)
    return body


class ScoringSpec(EndpointSpec):
    """What /v1/score and /v1/rerank share: no sampling, no output tokens, the body
    runs as sent."""

    generates = False
    scores_pairs = True

    def resolve_body(self, body: dict[str, Any], batch: BatchParams) -> dict[str, Any]:
        # Sampling and output limits mean nothing to a score: run it as sent.
        return dict(body)

    def shape_output(self, body: dict[str, Any]) -> dict[str, Any]:
        return input_usage(body)


# --- /v1/score ----------------------------------------------------------------------------------


def pair_form(present: Callable[[str], bool]) -> tuple[str, str]:
    """The body's pair form (its two sides' names), as vLLM picks it: the first form
    whose two sides are given, else the first whose first side is (its second side
    is then missing). `present(key)`: whether the body gives `key` (not null)."""
    for first, second in PAIR_FORMS:
        if present(first) and present(second):
            return first, second
    for first, second in PAIR_FORMS:
        if present(first):
            return first, second
    raise LineError("invalid_body", "body must give the two sides to score: text_1 and "
                    "text_2, or queries and documents (or items), or data_1 and data_2.",
                    "body.text_1")


def body_pair_form(body: dict[str, Any]) -> tuple[str, str]:
    return pair_form(lambda key: body.get(key) is not None)


@register
class Score(ScoringSpec):
    url = "/v1/score"
    name = "score"
    member = "SCORE"
    line_type = ScoreLine

    def check_body(self, body: dict[str, Any]) -> None:
        first, second = body_pair_form(body)
        firsts = check_side(body, first)
        seconds = check_side(body, second)
        if len(firsts) > 1 and len(firsts) != len(seconds):
            raise LineError("invalid_body", f"body.{first} must have one item (scored "
                            f"against each of body.{second}) or as many as body.{second} "
                            f"({len(seconds)}); it has {len(firsts)}.", f"body.{second}")
        check_scoring_options(body)

    def _sides(self, body: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        first, second = body_pair_form(body)
        return side_items(body[first]), side_items(body[second])

    def prefix_key_of_line(self, line: ScoreLine) -> int:
        return item_prefix_key(side_items(line.body.first_side)[0])

    def prefix_key(self, body: dict[str, Any]) -> int:
        try:
            first, _ = self._sides(body)
        except LineError:
            return 0
        return item_prefix_key(first[0]) if first else 0

    def prompt_chars(self, body: dict[str, Any]) -> int:
        firsts, seconds = self._sides(body)
        return sum(len(item_text(item)) for item in firsts + seconds)

    def prompt_text(self, body: dict[str, Any]) -> str:
        firsts, seconds = self._sides(body)
        return " ".join(item_text(item) for item in firsts + seconds)

    def simulated_body(self, *, request_id: str, model: str, created: int, text: str,
                       finish_reason: str, usage: dict[str, int],
                       request_body: dict[str, Any]) -> dict[str, Any]:
        firsts, seconds = self._sides(request_body)
        if len(firsts) == 1:
            firsts = firsts * len(seconds)
        data = [{"index": index, "object": "score", "score": simulated_score(a, b)}
                for index, (a, b) in enumerate(zip(firsts, seconds, strict=True))]
        prompt_tokens = usage["prompt_tokens"]
        return {"id": simulated_id("score", request_id), "object": "list",
                "created": created, "model": model, "data": data,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


class ScoreUnversionedLine(msgspec.Struct):
    custom_id: CustomId
    method: Literal["POST"]
    url: Literal["/score"]
    body: ScoreBody


@register
class ScoreUnversioned(Score):
    """vLLM's own path for the Score API (`vllm run-batch` takes it): the same spec."""

    url = "/score"
    member = "SCORE_UNVERSIONED"
    line_type = ScoreUnversionedLine
