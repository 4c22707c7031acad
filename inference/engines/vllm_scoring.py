"""Score and rerank lines on the real engine, through vLLM's own `ServingScores`.

`vllm run-batch` serves `/score` and `/rerank` lines by handing vLLM's protocol
models (`ScoreRequest`, a union of its pair forms, and `RerankRequest`) to the
`ServingScores` that `init_app_state` builds when `enable_scoring_api` says the
model scores (an embedding model by the cosine of the two sides' embeddings, a
cross-encoder by reading each pair together). This module does the same on the
pooling engine that serves embeddings, so the scores, the rerank order, `top_n` and
usage are vLLM's; what BatchGen adds is `return_documents` (the spec's
`answer_as_asked`, applied by VllmEngine.generate), its error mapping, and no HTTP
response: the serving class answers with one, whose body is the JSON.

Kept apart from vllm_engine.py, which builds the serving object here and calls
`serve_score`/`serve_rerank` from its methods of the same names.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import TypeAdapter
from vllm.entrypoints.openai.models.serving import OpenAIServingModels
from vllm.entrypoints.pooling.scoring.protocol import RerankRequest, ScoreRequest
from vllm.entrypoints.pooling.scoring.serving import ServingScores
from vllm.entrypoints.pooling.utils import enable_scoring_api
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.exceptions import VLLMValidationError
from vllm.renderers.chat_utils import ChatTemplateConfig
from vllm.v1.engine.async_llm import AsyncLLM

# As run_batch validates a /score body: the union of the pair forms.
_SCORE_REQUEST = TypeAdapter(ScoreRequest)
# BatchGen's field, not vLLM's: answered by the spec, not sent.
_OURS = ("return_documents",)


async def scoring_serving(llm: AsyncLLM, models: OpenAIServingModels) -> ServingScores | None:
    """vLLM's scoring serving for this model, as `init_app_state` builds it; None
    when the model does not score (a generative model, a classifier with several
    labels)."""
    if llm.model_config.runner_type != "pooling":
        return None
    supported_tasks = await llm.get_supported_tasks()
    if not enable_scoring_api(supported_tasks, llm.model_config):
        return None
    return ServingScores(llm, models, supported_tasks=supported_tasks, request_logger=None,
                         chat_template_config=ChatTemplateConfig())


def _serving(serving: ServingScores | None, model: str) -> ServingScores:
    if serving is None:
        raise VLLMValidationError(f"model {model!r} does not serve scores (an embedding "
                                  "model or a cross-encoder does)", parameter="url")
    return serving


async def serve_score(serving: ServingScores | None, body: dict[str, Any],
                      model: str) -> dict[str, Any] | ErrorResponse:
    serving = _serving(serving, model)
    return _body(await serving(_SCORE_REQUEST.validate_python(body)))


async def serve_rerank(serving: ServingScores | None, body: dict[str, Any],
                       model: str) -> dict[str, Any] | ErrorResponse:
    serving = _serving(serving, model)
    request = RerankRequest.model_validate(
        {key: value for key, value in body.items() if key not in _OURS})
    return _body(await serving(request))


def _body(response: Any) -> dict[str, Any] | ErrorResponse:
    if isinstance(response, ErrorResponse):
        return response
    return orjson.loads(response.body)
