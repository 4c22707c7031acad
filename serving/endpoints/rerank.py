"""/v1/rerank (and vLLM's unversioned /rerank): a query and its candidate documents
in, the documents ordered by relevance out, as vLLM's (Jina-compatible) Rerank API
defines them.

vLLM scores the query against every document (serving/endpoints/score.py says how)
and answers `results` sorted by `relevance_score`, each with the document's `index`
in the request. `top_n` keeps the best n; here it must be at least 1 when given
(vLLM reads 0 as "all", which leaving it out says). `return_documents` (Jina's and
Cohere's field, which vLLM's own model does not have) is honoured by the spec
(`answer_as_asked`): false drops each result's `document`; left out, results carry
them as vLLM answers. The query keys the prefix grouping."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from serving.endpoints.base import register
from serving.endpoints.score import (
    ScoringOptions,
    ScoringSpec,
    Side,
    Text,
    check_scoring_options,
    check_side,
    item_prefix_key,
    item_text,
    side_items,
    simulated_id,
    simulated_score,
)
from serving.line_checks import LineError, check_flag
from serving.line_schema import CustomId
from serving.params import INT64_MAX, Bound

TOP_N = Bound(integer=True, low=1, high=INT64_MAX)


class RerankBody(ScoringOptions, kw_only=True):
    query: Text
    documents: Side
    top_n: Annotated[int, msgspec.Meta(ge=TOP_N.low, le=TOP_N.high)] | None = None
    return_documents: bool | None = None


class RerankLine(msgspec.Struct):
    custom_id: CustomId
    method: Literal["POST"]
    url: Literal["/v1/rerank"]
    body: RerankBody


def _document(item: Any) -> dict[str, Any]:
    """A result's `document`, as vLLM's RerankDocument has it."""
    if isinstance(item, str):
        return {"text": item}
    return {"multi_modal": item.get("content", [])}


@register
class Rerank(ScoringSpec):
    url = "/v1/rerank"
    name = "rerank"
    member = "RERANK"
    line_type = RerankLine

    def check_body(self, body: dict[str, Any]) -> None:
        check_side(body, "query", allow_list=False)
        check_side(body, "documents")
        top_n = body.get("top_n")
        if top_n is not None and not TOP_N.admits(top_n):
            raise LineError("invalid_body", f"body.top_n {TOP_N.must}.", "body.top_n")
        check_flag(body, "return_documents")
        check_scoring_options(body)

    def prefix_key_of_line(self, line: RerankLine) -> int:
        return item_prefix_key(line.body.query)

    def prefix_key(self, body: dict[str, Any]) -> int:
        query = body.get("query")
        return item_prefix_key(query) if isinstance(query, str | dict) else 0

    def _texts(self, body: dict[str, Any]) -> list[str]:
        return [item_text(body["query"]), *map(item_text, side_items(body["documents"]))]

    def prompt_chars(self, body: dict[str, Any]) -> int:
        return sum(map(len, self._texts(body)))

    def prompt_text(self, body: dict[str, Any]) -> str:
        return " ".join(self._texts(body))

    def simulated_body(self, *, request_id: str, model: str, created: int, text: str,
                       finish_reason: str, usage: dict[str, int],
                       request_body: dict[str, Any]) -> dict[str, Any]:
        query = request_body["query"]
        documents = side_items(request_body["documents"])
        results = [{"index": index, "document": _document(document),
                    "relevance_score": simulated_score(query, document)}
                   for index, document in enumerate(documents)]
        results.sort(key=lambda result: result["relevance_score"], reverse=True)
        if request_body.get("top_n"):
            results = results[:request_body["top_n"]]
        prompt_tokens = usage["prompt_tokens"]
        body = {"id": simulated_id("rerank", request_id), "model": model,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
                "results": results}
        return self.answer_as_asked(body, request_body)

    def answer_as_asked(self, body: dict[str, Any],
                        request_body: dict[str, Any]) -> dict[str, Any]:
        if request_body.get("return_documents") is False:
            for result in body.get("results") or ():
                result.pop("document", None)
        return body


class RerankUnversionedLine(msgspec.Struct):
    custom_id: CustomId
    method: Literal["POST"]
    url: Literal["/rerank"]
    body: RerankBody


@register
class RerankUnversioned(Rerank):
    """vLLM's own path for the Rerank API (`vllm run-batch` takes it): the same spec."""

    url = "/rerank"
    member = "RERANK_UNVERSIONED"
    line_type = RerankUnversionedLine
