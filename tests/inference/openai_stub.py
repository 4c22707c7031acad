"""A scripted OpenAI-compatible server on localhost, for the openai-http engine's
tests: it answers what the test tells it to, records what it was sent, and can go
down and come back on the same port (a restart)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from tests.e2e.harness import free_port

MODEL = "remote-model"
MAX_MODEL_LEN = 4096


def completion(body: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion as vLLM's server writes it, nulls included."""
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris.",
                                                 "refusal": None, "reasoning": None},
                         "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9,
                      "prompt_tokens_details": None},
            "kv_transfer_params": None}


@dataclass
class Seen:
    """One request the stub received."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    at: float
    aborted: bool = False  # the client went away before the answer


@dataclass
class Answer:
    status: int = 200
    json: Any = None  # None: a chat.completion for the request
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False  # close the connection without answering


class OpenAIStub:
    def __init__(self, *, models: list[dict] | None = None) -> None:
        self.port = free_port()
        self.models = models if models is not None else [
            {"id": MODEL, "object": "model", "max_model_len": MAX_MODEL_LEN}]
        self.script: deque[Answer] = deque()  # next answers to POSTs, then 200s
        self.seen: list[Seen] = []
        self.models_status = 200
        # /metrics as vLLM writes it, with `others` requests of other clients beside
        # those in flight here; None: the server has no /metrics (404).
        self.others: int | None = None
        self.in_flight = 0  # POSTs being answered now
        self.peak_in_flight = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def answer(self, *answers: Answer) -> None:
        self.script.extend(answers)

    def posts(self, predicate: Callable[[Seen], bool] = lambda seen: True) -> list[Seen]:
        return [seen for seen in self.seen if seen.path != "models" and predicate(seen)]

    # --- up and down ----------------------------------------------------------------------

    def start(self) -> OpenAIStub:
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        """Down: the port refuses connections, open ones are closed."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._runner = None

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/{path:.*}", self._post)
        # A client that disconnects cancels its handler, as vLLM's with_cancellation does.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    # --- handlers -------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        self.seen.append(Seen("models", {}, _headers(request), time.monotonic()))
        if self.models_status != 200:
            return web.json_response({"error": {"message": "not yet"}},
                                     status=self.models_status)
        return web.json_response({"object": "list", "data": self.models})

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.others is None:
            return web.Response(status=404, text="Not Found")
        registry = CollectorRegistry()
        Gauge("vllm:num_requests_running", "running", ["model_name"], registry=registry
              ).labels(MODEL).set(self.in_flight + self.others)
        Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=registry
              ).labels(MODEL).set(0)
        Histogram("vllm:inter_token_latency_seconds", "itl", ["model_name"],
                  registry=registry).labels(MODEL).observe(0.01)
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    async def _post(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen = Seen(request.match_info["path"], body, _headers(request), time.monotonic())
        self.seen.append(seen)
        answer = self.script.popleft() if self.script else Answer()
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await asyncio.sleep(answer.delay)
        except asyncio.CancelledError:
            seen.aborted = True
            raise
        finally:
            self.in_flight -= 1
        if answer.drop:
            request.transport.close()
            return web.Response()
        payload = answer.json if answer.json is not None else completion(body)
        return web.json_response(payload, status=answer.status, headers=answer.headers)


def _headers(request: web.Request) -> dict[str, str]:
    return {name.lower(): value for name, value in request.headers.items()}
