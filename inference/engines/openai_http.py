"""The remote engine: an OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp ...)
does the inference, BatchGen keeps the batch.

Each request of a chunk is one POST to the server's endpoint of the same name
(`{engine_url}/chat/completions`, `/completions`, `/embeddings`, `/responses`,
`/score`, `/rerank`: vLLM serves the last two under /v1 too), and the
worker's slots are its concurrency: the runtime calls `generate()` once per slot, and
the HTTP client has no connection limit of its own to queue them behind.

What this module adds to a plain HTTP call:

- retries of what a retry can cure (the connection failed or dropped, a timeout, 408,
  429, 502, 503, 504), with tenacity: full-jitter exponential backoff, the server's
  `Retry-After` when it sends one, and a bounded total time (`engine_retry_seconds`).
  A retried request still gives one result, so the runtime writes it once; the
  answer of an attempt that was lost on the way is simply computed again;
- errors as the batch output shows them: a 4xx (and a 500) is that line's error, with
  the server's status and message; a server that stays unreachable for the whole
  retry time is `EngineUnavailable`, so the worker hands its chunks back rather than
  failing every line it holds;
- the model: requests name BatchGen's model id, the server gets its own id (the
  model entry's path, `name=<server's model id>:openai-http`), and the output shows
  BatchGen's again. At start the engine waits (bounded) for the server to list that
  model on `/models`, and takes its `max_model_len`;
- priority: vLLM started with `--scheduling-policy priority` serves lower `priority`
  values first; batch requests carry `engine_priority` (a high number), so the
  interactive traffic on the same GPUs goes ahead. A server that refuses the field
  is sent none from then on;
- adaptive concurrency (BATCHGEN_ADAPTIVE_CONCURRENCY, inference/adaptive.py): priority
  orders only the server's queue, and every engine step carries every sequence it runs,
  so the requests this engine has at the server follow the server's load (its
  /metrics, or the batch's own latencies) between a floor and a ceiling; the others
  wait at a gate in this engine, in the order the worker admitted them.

Why httpx rather than the `openai` SDK's AsyncOpenAI: a batch line's body goes to the
server as the client wrote it, with whatever extensions that server takes (vLLM's
`priority`, `guided_json`, `top_k` ...); the SDK's typed `create()` would need each of
them moved into `extra_body`, would parse the answer into its own models and back,
and its built-in retries would have to be turned off for ours. What remains of it is
httpx, which it is built on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    stop_before_delay,
    wait_exponential,
    wait_random_exponential,
)
from tenacity.wait import wait_base
from urllib3.util import Retry

from inference.adaptive import Limits
from inference.engines.adaptive_gate import AdaptiveConcurrency
from serving.endpoints import EndpointSpec, endpoint_spec
from serving.engines.base import (
    Engine,
    EngineConfig,
    EngineRequest,
    EngineResult,
    EngineUnavailable,
)

logger = logging.getLogger(__name__)

# Worth another attempt: the request timed out at a proxy or was shed under load.
RETRYABLE_STATUSES = frozenset({408, 429, 502, 503, 504})
CONNECT_TIMEOUT = 10.0  # a server on the same network accepts in milliseconds
# Backoff between attempts: full jitter, up to this many seconds. A restarted server
# is back within this long of listening again.
RETRY_WAIT_MAX = 10.0
START_WAIT_MAX = 5.0  # between start-up polls of /models
MODELS_TIMEOUT = 5.0  # the web process's one look at /models, for /v1/models
ERROR_CHARS = 2000  # of a server's error text kept in the line's message
_RETRY_AFTER = Retry()  # parses Retry-After: seconds or an HTTP date


class _RetryableStatus(Exception):
    """A response worth another attempt (RETRYABLE_STATUSES)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response
        header = response.headers.get("retry-after")
        try:
            self.retry_after = _RETRY_AFTER.parse_retry_after(header) if header else None
        except Exception:  # an unparsable header: back off as if there were none
            self.retry_after = None


class wait_retry_after(wait_base):
    """The server's Retry-After when the last answer had one, else `fallback`."""

    def __init__(self, fallback: wait_base) -> None:
        self.fallback = fallback

    def __call__(self, retry_state: RetryCallState) -> float:
        error = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(error, _RetryableStatus) and error.retry_after is not None:
            return float(error.retry_after)
        return self.fallback(retry_state)


@dataclass(frozen=True)
class ServedModel:
    id: str
    max_model_len: int | None


def served_by(payload: Any) -> dict[str, ServedModel]:
    """The models of a `/models` answer, by id. vLLM and SGLang say each model's
    `max_model_len`; servers that do not leave it None."""
    models = {}
    for item in (payload or {}).get("data") or []:
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            length = item.get("max_model_len")
            models[item["id"]] = ServedModel(
                item["id"], length if isinstance(length, int) and length > 0 else None)
    return models


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def remote_context(model: str) -> int | None:
    """The engine spec's `describe_model` hook: the context of `model` as the server
    says, for /v1/models and the checks at batch create (in the web process, which
    never starts an engine). None when the server does not answer now: the inference
    worker waits for it, the web process shows no context rather than wait."""
    from django.conf import settings

    url = settings.BATCHGEN_ENGINE_URL
    if not url:
        return None
    try:
        response = httpx.get(f"{url.rstrip('/')}/models", timeout=MODELS_TIMEOUT,
                             headers=_headers(settings.BATCHGEN_ENGINE_API_KEY))
        response.raise_for_status()
        served = served_by(response.json()).get(model)
    except (httpx.HTTPError, ValueError) as exc:
        logger.warning("the engine server at %s did not list its models (%s); model %s "
                       "shows no context length", url, exc, model)
        return None
    return served.max_model_len if served else None


class OpenAIHttpEngine(Engine):
    name = "openai-http"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        if not config.engine_url:
            raise ValueError("the openai-http engine needs the server's URL: "
                             "--engine-url / BATCHGEN_ENGINE_URL, e.g. http://gpu-pool:8000/v1")
        self._client: httpx.AsyncClient | None = None
        self._context: int | None = None
        self._priority = config.engine_priority
        self._outage_since: float | None = None  # when requests began to retry
        self._adaptive = (AdaptiveConcurrency(
            Limits(target=config.adaptive_target, floor=config.adaptive_floor,
                   ceiling=max(config.adaptive_ceiling, config.adaptive_floor)),
            config.engine_url) if config.adaptive else None)

    @property
    def url(self) -> str:
        return self.config.engine_url.rstrip("/")

    @property
    def admission(self) -> dict | None:
        return None if self._adaptive is None else self._adaptive.report()

    @property
    def max_context_length(self) -> int:
        """The server's max_model_len under the server's cap; 0 when neither says."""
        limits = [v for v in (self._context, self.config.max_context_length) if v]
        return min(limits, default=0)

    # --- start-up -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._client is not None:
            return
        self._client = httpx.AsyncClient(
            base_url=self.url + "/",
            headers=_headers(self.config.engine_api_key),
            timeout=httpx.Timeout(self.config.engine_timeout, connect=CONNECT_TIMEOUT),
            # The worker's slots bound the requests in flight; a pool limit here would
            # only queue them a second time (and time them out while queued).
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )
        try:
            served = await self._wait_for_model()
        except BaseException:
            await self.shutdown()
            raise
        self._context = served.max_model_len
        if self._adaptive is not None:
            self._adaptive.start(self._client)
        logger.info("engine server %s serves %r as BatchGen's %r (max_model_len %s); "
                    "batch requests carry priority %s", self.url, served.id,
                    self.config.served_model_name, served.max_model_len or "not given",
                    "none" if self._priority is None else self._priority)

    async def _wait_for_model(self) -> ServedModel:
        """Poll `/models` until the server lists this worker's model, for at most
        engine_start_timeout seconds: the worker is not ready (so /health says so)
        until then. A server that answers without the model, or refuses the key, is
        a configuration error and fails at once."""
        timeout = self.config.engine_start_timeout

        def waiting(state: RetryCallState) -> None:
            if state.attempt_number == 1 or state.attempt_number % 12 == 0:
                logger.warning("waiting for the engine server at %s to serve %r (%s); "
                               "%.0f s of %.0f s gone", self.url, self.config.model,
                               _reason(state.outcome.exception()),
                               state.seconds_since_start, timeout)

        try:
            async for attempt in AsyncRetrying(
                    retry=retry_if_exception_type((httpx.TransportError, _RetryableStatus)),
                    stop=stop_after_delay(timeout),
                    wait=wait_exponential(multiplier=0.5, max=START_WAIT_MAX),
                    before_sleep=waiting, reraise=True):
                with attempt:
                    response = await self._client.get("models")
                    if (response.status_code in RETRYABLE_STATUSES
                            or response.status_code >= 500):
                        raise _RetryableStatus(response)
        except (httpx.TransportError, _RetryableStatus) as exc:
            raise RuntimeError(f"the engine server at {self.url} did not list its models "
                               f"within {timeout:.0f} s ({_reason(exc)})") from exc
        if response.status_code != 200:
            raise RuntimeError(
                f"the engine server at {self.url} answered {response.status_code} on "
                f"/models: {_error_text(response)} (does --engine-url end in /v1, and is "
                "--engine-api-key / BATCHGEN_ENGINE_API_KEY its key?)")
        models = served_by(response.json())
        if self.config.model not in models:
            raise RuntimeError(
                f"the engine server at {self.url} does not serve {self.config.model!r}; "
                f"it serves {sorted(models)}: name one of them in BATCHGEN_MODELS "
                f"({self.config.served_model_name}=<its id>:openai-http)")
        return models[self.config.model]

    # --- requests -------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> EngineResult:
        if self._client is None:
            raise RuntimeError("OpenAIHttpEngine.start() has not run")
        if request.body.get("model") != self.config.served_model_name:
            # As vLLM's OpenAIServingModels does: a worker answers only its own model.
            return EngineResult.failure(
                "model_not_found", f"The model {request.body.get('model')!r} is not the one "
                f"this worker holds ({self.config.served_model_name!r}).")
        spec = endpoint_spec(request.endpoint)
        body = self._body(request, spec)
        path = request.endpoint.removeprefix("/v1/")
        response, seconds = await self._admitted(path, body, request.request_id)
        if (response.status_code in (400, 422) and "priority" in body
                and "priority" in response.text.lower()):
            self._refuses_priority(response)
            body.pop("priority")
            response, seconds = await self._admitted(path, body, request.request_id)
        if response.status_code != 200:
            return _failure(response, endpoint=request.endpoint)
        result = self._answer(response, spec, request.max_context_length, request.body)
        if self._adaptive is not None:
            self._adaptive.finished(seconds, result.completion_tokens)
        return result

    async def _admitted(self, path: str, body: dict[str, Any],
                        request_id: str) -> tuple[httpx.Response, float]:
        """`_send` once the adaptive gate lets the request in (at once without it);
        the answer and the seconds it took."""
        if self._adaptive is None:
            began = time.monotonic()
            return await self._send(path, body, request_id), time.monotonic() - began
        # A request sent again after a cut gets its own id: the stopped one may still
        # be inside the server.
        return await self._adaptive.send(object(), lambda again: self._send(
            path, body, f"{request_id}-again{again}" if again else request_id))

    def _answer(self, response: httpx.Response, spec: EndpointSpec,
                cap: int | None, request_body: dict[str, Any]) -> EngineResult:
        try:
            answer = response.json()
        except ValueError:
            return EngineResult.failure(
                "engine_error", f"the engine server answered 200 with no JSON body: "
                f"{response.text[:ERROR_CHARS]!r}")
        if not isinstance(answer, dict):
            return EngineResult.failure("engine_error", "the engine server answered 200 "
                                        "with JSON that is not an object")
        return self._result(answer, spec, cap, request_body)

    def _body(self, request: EngineRequest, spec: EndpointSpec) -> dict[str, Any]:
        """The request as the server takes it: its own model id, one full answer, the
        batch's priority and, under a batch-level context cap, an output limit no
        larger than the cap."""
        body = {**request.body, "model": self.config.model}
        if spec.generates:
            body.update(stream=False)
            body.pop("stream_options", None)
        if self._priority is not None:
            body["priority"] = self._priority
        cap = request.max_context_length
        if cap and spec.generates:
            limit = body.get(spec.output_limit_field)
            body[spec.output_limit_field] = min(limit or cap, cap)
        return body

    def _refuses_priority(self, response: httpx.Response) -> None:
        if self._priority is not None:
            logger.warning("the engine server at %s refuses the priority field (%s); "
                           "batch requests go without it from now on (set "
                           "BATCHGEN_ENGINE_PRIORITY empty to silence this)", self.url,
                           _error_text(response)[:200])
            self._priority = None

    async def _send(self, path: str, body: dict[str, Any], request_id: str) -> httpx.Response:
        """POST with retries; the last answer that is not worth retrying. Cancelling
        the calling task closes the connection, which a vLLM server takes as the
        client's disconnect and aborts the request."""
        try:
            async for attempt in AsyncRetrying(
                    retry=retry_if_exception_type((httpx.TransportError, _RetryableStatus)),
                    stop=stop_before_delay(self.config.engine_retry_seconds),
                    wait=wait_retry_after(wait_random_exponential(multiplier=0.5,
                                                                  max=RETRY_WAIT_MAX)),
                    before_sleep=self._retrying, reraise=True):
                with attempt:
                    # vLLM takes the header as its request id, which must be unique
                    # while in flight: an abandoned attempt may still be inside it.
                    number = attempt.retry_state.attempt_number
                    response = await self._client.post(
                        path, json=body, headers={"X-Request-Id": f"{request_id}-{number}"})
                    if response.status_code in RETRYABLE_STATUSES:
                        raise _RetryableStatus(response)
        except _RetryableStatus as exc:
            return exc.response  # still busy after the retry time: the line's error
        except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:
            return _timed_out(exc, self.config.engine_timeout)
        except httpx.TransportError as exc:
            raise EngineUnavailable(
                f"the engine server at {self.url} has not answered for "
                f"{self.config.engine_retry_seconds:.0f} s: {_reason(exc)}") from exc
        if self._outage_since is not None:
            logger.warning("the engine server at %s answers again after %.0f s", self.url,
                           time.monotonic() - self._outage_since)
            self._outage_since = None
        return response

    def _retrying(self, state: RetryCallState) -> None:
        reason = _reason(state.outcome.exception())
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            logger.warning("the engine server at %s: %s; requests retry for up to %.0f s",
                           self.url, reason, self.config.engine_retry_seconds)
        logger.debug("retrying in %.1f s after %s", state.upcoming_sleep, reason)

    def _result(self, answer: dict[str, Any], spec: EndpointSpec,
                cap: int | None, request_body: dict[str, Any]) -> EngineResult:
        """The server's answer as the API contract shapes it: without the nulls the
        in-process engine leaves out, BatchGen's model id, complete usage."""
        body = _without_nulls(answer)
        body["model"] = self.config.served_model_name
        usage = body.setdefault("usage", {})
        spec.complete_usage(usage)
        prompt_tokens, _ = spec.token_counts(usage)
        if cap and prompt_tokens >= cap:
            # The server knows only its own context; the batch's cap is checked on the
            # prompt length it reports.
            return EngineResult.failure(
                "context_length_exceeded", f"Prompt length {prompt_tokens} exceeds model "
                f"context {cap}")
        body = spec.answer_as_asked(spec.shape_output(body), request_body)
        _, completion_tokens = spec.token_counts(body["usage"])
        return EngineResult(body=body, prompt_tokens=prompt_tokens,
                            completion_tokens=completion_tokens)

    async def shutdown(self) -> None:
        if self._adaptive is not None:
            await self._adaptive.stop()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def _without_nulls(value: Any) -> Any:
    """What pydantic's exclude_none gives the in-process engine: no null members."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def _error_text(response: httpx.Response) -> str:
    """The message of an OpenAI-style error body (`{"error": {"message": ...}}`, or
    the older `{"message": ...}`), else the body's text."""
    try:
        payload = response.json()
    except ValueError:
        return response.text[:ERROR_CHARS] or response.reason_phrase
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        for key in ("message", "detail"):  # FastAPI's own errors say "detail"
            if isinstance(error, dict) and isinstance(error.get(key), str):
                return error[key][:ERROR_CHARS]
        if isinstance(error, str):
            return error[:ERROR_CHARS]
    return response.text[:ERROR_CHARS]


def _failure(response: httpx.Response, *, endpoint: str) -> EngineResult:
    """A line's error for the server's answer: its status and message, under the
    code the in-process engine would give. A 404 that is not about the model (or a
    501) says the server has no such endpoint (one that serves no /score, say): the
    line is refused as `unsupported_endpoint`, the batch goes on."""
    status = response.status_code
    message = _error_text(response)
    text = f"{message} (HTTP {status} from the engine server)"
    lowered = message.lower()
    if "context length" in lowered or "input_tokens" in lowered:
        return EngineResult.failure("context_length_exceeded", text)
    if status == 404 and "model" in lowered:
        return EngineResult.failure("model_not_found", text)
    if status in (404, 501):
        return EngineResult.failure(
            "unsupported_endpoint", f"the engine server does not serve {endpoint}: {text}")
    if 400 <= status < 500 and status not in RETRYABLE_STATUSES:
        return EngineResult.failure("invalid_request", text)
    return EngineResult.failure("engine_error", text)  # the server's trouble, not the line's


def _timed_out(error: Exception, timeout: float) -> httpx.Response:
    """A 504 standing for the last attempt's timeout, so it becomes the line's error."""
    return httpx.Response(504, json={"error": {"message": (
        f"no answer within {timeout:g} s on the last attempt ({type(error).__name__}); "
        "raise BATCHGEN_ENGINE_TIMEOUT_SECONDS for long generations")}})


def _reason(error: BaseException | None) -> str:
    if isinstance(error, _RetryableStatus):
        return f"HTTP {error.response.status_code}"
    return f"{type(error).__name__}: {error}" if error else "no answer"
