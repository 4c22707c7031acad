"""vLLM's OpenAI serving classes as a batch uses them (inference/engines/vllm_engine.py):
subclassed at their render hook, where vLLM has just tokenized the prompt, to apply
the batch-level context cap (`EngineRequest.max_context_length`): a prompt over it is
refused, and the output token limit lowered to what the cap leaves."""

from __future__ import annotations

import contextvars
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from vllm.entrypoints.openai.models.serving import OpenAIServingModels
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.renderers.inputs.preprocess import extract_prompt_len
from vllm.renderers.online_renderer import OnlineRenderer
from vllm.v1.engine.async_llm import AsyncLLM

from serving.engines.base import EngineConfig

# The batch-level cap of the request being rendered. A context variable because the
# serving objects are shared by every concurrent request on the loop, while each
# generate() call runs in its own asyncio task (and so its own context).
_context_cap: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "batchgen_context_cap", default=None
)
# vLLM's renderer raises a VLLMValidationError naming one of these parameters when
# the prompt is longer than max_model_len (in characters or in tokens).
_PROMPT_LENGTH_PARAMS = frozenset({"input_tokens", "input_text"})


class PromptTooLong(Exception):
    def __init__(self, prompt_len: int, limit: int) -> None:
        if prompt_len > limit:
            message = f"Prompt length {prompt_len} exceeds model context {limit}"
        else:
            message = (
                f"Prompt length {prompt_len} leaves no room for output in model context {limit}"
            )
        super().__init__(message)
        self.prompt_len = prompt_len
        self.limit = limit


def _context_limit(max_model_len: int) -> int:
    cap = _context_cap.get()
    return max_model_len if cap is None else min(cap, max_model_len)


def _fit_context(serving: Any, request: Any, engine_inputs: list, field: str) -> None:
    """Apply the request's context limit to freshly rendered prompts.

    vLLM itself only knows `max_model_len`; the batch may lower it. A prompt that
    leaves no room for one output token is rejected; otherwise the output limit
    (`field` on the request, which vLLM then clamps to max_model_len - prompt)
    is lowered to what the limit leaves.
    """
    model_config = serving.model_config
    limit = _context_limit(model_config.max_model_len)
    prompt_len = max(extract_prompt_len(model_config, prompt) for prompt in engine_inputs)
    if prompt_len >= limit:
        raise PromptTooLong(prompt_len, limit)
    # A batch-level max_decoding_length larger than what the context leaves is a
    # ceiling, not an error: lower it to the room left after the prompt.
    room = limit - prompt_len
    requested = getattr(request, field)
    if field == "max_completion_tokens" and requested is None:
        # The chat request's max_tokens is a deprecated pydantic field: read it
        # without the warning. vLLM uses it when max_completion_tokens is unset.
        requested = vars(request).get("max_tokens")
    if requested is None or requested > room:
        setattr(request, field, room)


class _BatchServingChat(OpenAIServingChat):
    async def render_chat_request(self, request: ChatCompletionRequest):
        result = await super().render_chat_request(request)
        if not isinstance(result, ErrorResponse):
            _fit_context(self, request, result[1], "max_completion_tokens")
        return result


class _BatchServingCompletion(OpenAIServingCompletion):
    async def render_completion_request(self, request: CompletionRequest):
        result = await super().render_completion_request(request)
        if not isinstance(result, ErrorResponse):
            _fit_context(self, request, result, "max_tokens")
        return result


class _BatchServingResponses(OpenAIServingResponses):
    async def _render_resolved_response_inputs(self, request: ResponsesRequest, *args,
                                               **kwargs):
        result = await super()._render_resolved_response_inputs(request, *args, **kwargs)
        if not isinstance(result, ErrorResponse):
            _fit_context(self, request, [result.engine_input], "max_output_tokens")
        return result


def generative_serving(llm: AsyncLLM, models: OpenAIServingModels, config: EngineConfig
                   ) -> tuple[OpenAIServingChat, OpenAIServingCompletion,
                              OpenAIServingResponses]:
    """Chat, completion and responses serving for a model that generates text, as
    `init_app_state` builds them, on one renderer and one set of parsers."""
    reasoning_parser = config.reasoning_parser if config.parse_thinking else None
    tool_parser = config.tool_call_parser
    renderer = OnlineRenderer(
        model_config=llm.model_config,
        renderer=llm.renderer,
        request_logger=None,
        chat_template=None,  # the model's own template
        chat_template_content_format="auto",
        enable_auto_tools=tool_parser is not None,
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
    )
    renderer.warmup()
    chat = _BatchServingChat(
        llm,
        models,
        "assistant",
        online_renderer=renderer,
        request_logger=None,
        chat_template=None,
        chat_template_content_format="auto",
        reasoning_parser=reasoning_parser or "",
        enable_auto_tools=tool_parser is not None,
        tool_parser=tool_parser,
        # usage.prompt_tokens_details.cached_tokens: prefix-cache hits, per request.
        enable_prompt_tokens_details=True,
    )
    completion = _BatchServingCompletion(
        llm, models, online_renderer=renderer, request_logger=None,
        enable_prompt_tokens_details=True,
    )
    # As `vllm serve` builds it, on the same renderer and parsers as chat. No tool
    # server: a batch runs no built-in tools (validation refuses them). Its store
    # stays off (VLLM_ENABLE_RESPONSES_API_STORE), so no response is kept.
    responses = _BatchServingResponses(
        llm, models, renderer, request_logger=None, chat_template=None,
        chat_template_content_format="auto",
        reasoning_parser=reasoning_parser or "",
        enable_auto_tools=tool_parser is not None, tool_parser=tool_parser,
        enable_prompt_tokens_details=True,
    )
    return chat, completion, responses
