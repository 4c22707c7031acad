"""The openai-http engine's side of adaptive concurrency (inference/adaptive.py): the
gate its requests pass to reach the server, and the look at the server's load.

The worker's slots still bound what the engine holds (BATCHGEN_MAX_POOL_SIZE); the
gate bounds how many of those are at the server, and the controller moves that bound.
Requests wait at the gate in the order they came (the slot pool's chunk order), so
the order in which batches share the worker does not change. A request stopped by a
cut (`shed`) goes back to the front of the gate and is sent again: the server aborts
it when its connection closes, and nothing of it was written, so exactly once holds as
for any retried request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from inference.adaptive import Admission, Limits, Sample, limit_step, signals, start

logger = logging.getLogger(__name__)

# vLLM's names (vllm/v1/metrics/loggers.py, 0.32); summed over every series (engines,
# models): what the server as a whole carries is what an interactive token waits for.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
INTER_TOKEN = "vllm:inter_token_latency_seconds"
FIRST_TOKEN = "vllm:time_to_first_token_seconds"
_FAMILIES = frozenset({RUNNING, WAITING, INTER_TOKEN, FIRST_TOKEN})
_SAMPLES = frozenset({RUNNING, WAITING, f"{INTER_TOKEN}_sum", f"{INTER_TOKEN}_count",
                      f"{FIRST_TOKEN}_sum", f"{FIRST_TOKEN}_count"})
METRICS_TIMEOUT = 2.0  # a look that takes longer than this is no look at "now"
# A look at the server this often: the first interactive request after a quiet spell
# meets the batch at its ceiling until the next look cuts it, so the look must come
# within a few engine steps (10-100 ms on a CPU here, less on a GPU); rendering vLLM's
# /metrics takes its API process a few ms, about 2% of a core at this rate.
SAMPLE_SECONDS = 0.25


class Shed(Exception):
    """The gate stopped this request to make room (a cut of the limit)."""


class AdmissionGate:
    """At most `limit` requests pass at once; the others wait in arrival order."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._passed: OrderedDict[object, asyncio.Task | None] = OrderedDict()  # oldest first
        self._waiting: deque[tuple[object, asyncio.Future]] = deque()
        self._shed: set[object] = set()

    @property
    def in_flight(self) -> int:
        return len(self._passed)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    async def enter(self, ticket: object, *, first: bool = False) -> None:
        """Wait for room. `first`: a request that was shed goes before the others."""
        if len(self._passed) < self.limit and not self._waiting:
            self._passed[ticket] = None
            return
        future = asyncio.get_running_loop().create_future()
        entry = (ticket, future)
        self._waiting.appendleft(entry) if first else self._waiting.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # let in as it was cancelled
                self.leave(ticket)
            else:
                self._waiting.remove(entry)
            raise

    def hold(self, ticket: object, task: asyncio.Task) -> None:
        """`task` sends the request of `ticket`: what a cut cancels."""
        if ticket in self._passed:
            self._passed[ticket] = task

    def was_shed(self, ticket: object) -> bool:
        return ticket in self._shed

    def leave(self, ticket: object) -> None:
        self._passed.pop(ticket, None)
        self._shed.discard(ticket)
        self._let_in()

    def set_limit(self, limit: int, *, shed: bool = False) -> int:
        """The new limit; with `shed`, the newest requests above it are stopped.
        Returns how many were."""
        self.limit = limit
        stopped = 0
        if shed:
            for ticket in list(self._passed)[limit:]:
                task = self._passed[ticket]
                if task is not None and not task.done() and ticket not in self._shed:
                    self._shed.add(ticket)
                    task.cancel()
                    stopped += 1
        self._let_in()
        return stopped

    def _let_in(self) -> None:
        while self._waiting and len(self._passed) < self.limit:
            ticket, future = self._waiting.popleft()
            if not future.done():
                self._passed[ticket] = None
                future.set_result(None)


@dataclass(frozen=True, slots=True)
class ServerFigures:
    """A vLLM server's gauges now and its latency histograms' running totals."""

    running: int
    waiting: int
    inter_token_sum: float = 0.0
    inter_token_count: float = 0.0
    first_token_sum: float = 0.0
    first_token_count: float = 0.0


def parse_metrics(text: str) -> ServerFigures | None:
    """The figures of a Prometheus text page; None when it has not vLLM's gauges."""
    totals: dict[str, float] = {}
    # vLLM's page holds hundreds of series (every histogram bucket): only the lines of
    # these four go to the parser, which then costs well under a millisecond.
    wanted = "\n".join(line for line in text.splitlines() if _wanted(line))
    for family in text_string_to_metric_families(wanted):
        if family.name not in (RUNNING, WAITING, INTER_TOKEN, FIRST_TOKEN):
            continue
        for sample in family.samples:
            if sample.name in (RUNNING, WAITING) or sample.name.endswith(("_sum", "_count")):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    if RUNNING not in totals or WAITING not in totals:
        return None
    return ServerFigures(
        running=round(totals[RUNNING]), waiting=round(totals[WAITING]),
        inter_token_sum=totals.get(f"{INTER_TOKEN}_sum", 0.0),
        inter_token_count=totals.get(f"{INTER_TOKEN}_count", 0.0),
        first_token_sum=totals.get(f"{FIRST_TOKEN}_sum", 0.0),
        first_token_count=totals.get(f"{FIRST_TOKEN}_count", 0.0))


def _wanted(line: str) -> bool:
    if line.startswith("#"):
        parts = line.split(" ", 3)
        return len(parts) > 2 and parts[1] == "TYPE" and parts[2] in _FAMILIES
    return line.split("{", 1)[0].split(" ", 1)[0] in _SAMPLES


def metrics_url(engine_url: str) -> str:
    """vLLM (and SGLang, TGI) serve /metrics at the root, beside /v1."""
    base = engine_url.rstrip("/")
    return f"{base.removesuffix('/v1')}/metrics"


async def read_server(client: httpx.AsyncClient, url: str) -> ServerFigures | None:
    """The server's figures now; None when it has no /metrics or not vLLM's. Raises
    httpx.TransportError when it does not answer (then there is nothing to decide on)."""
    response = await client.get(url, timeout=METRICS_TIMEOUT)
    if response.status_code != 200:
        return None
    try:
        return parse_metrics(response.text)
    except ValueError as exc:  # not Prometheus' text format
        logger.debug("the engine server's %s is not Prometheus text: %s", url, exc)
        return None


def mean_since(total: float, count: float, before_total: float,
               before_count: float) -> float | None:
    """The mean of a histogram's observations since the last look; None if none."""
    observed = count - before_count
    if observed <= 0:
        return None
    return (total - before_total) / observed


class AdaptiveConcurrency:
    """The gate, the controller's state and the look at the server every
    SAMPLE_SECONDS, for one engine (on its event loop)."""

    def __init__(self, limits: Limits, engine_url: str) -> None:
        self.limits = limits
        self.state: Admission = start(limits)
        self.gate = AdmissionGate(self.state.limit)
        self.url = metrics_url(engine_url)
        self.source = "metrics"  # or "latency": the batch's own (the server has none)
        self.shed_total = 0
        self._figures: ServerFigures | None = None
        self._sample: Sample | None = None
        self._own = [0.0, 0]  # the batch's seconds per output token: sum, requests
        self._own_before = (0.0, 0)
        self._task: asyncio.Task | None = None

    def start(self, client: httpx.AsyncClient) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sample_forever(client))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def send(self, ticket: object,
                   post: Callable[[int], Awaitable[httpx.Response]],
                   ) -> tuple[httpx.Response, float]:
        """`post(0)` through the gate (`post(1)`, `post(2)` ..., first in line, when a cut
        stops it); its response and the seconds it took at the server."""
        again = 0
        while True:
            await self.gate.enter(ticket, first=bool(again))
            began = time.monotonic()
            task = asyncio.ensure_future(post(again))
            self.gate.hold(ticket, task)
            try:
                return await task, time.monotonic() - began
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if not self.gate.was_shed(ticket) or (current and current.cancelling()):
                    raise
                again += 1  # shed: sent again when there is room
            finally:
                self.gate.leave(ticket)

    def finished(self, seconds: float, completion_tokens: int) -> None:
        """A request of the batch ended: its time per output token (rule 3's latency)."""
        self._own[0] += seconds / max(completion_tokens, 1)
        self._own[1] += 1

    def report(self) -> dict:
        """The limit and the signals it read, for the worker's heartbeat."""
        return {**self.state.as_dict(), "source": self.source, "floor": self.limits.floor,
                "ceiling": self.limits.ceiling, "target": self.limits.target,
                "in_flight": self.gate.in_flight, "waiting_at_gate": self.gate.queued,
                "shed_total": self.shed_total, "signals": signals(self._sample)}

    async def _sample_forever(self, client: httpx.AsyncClient) -> None:
        while True:
            await asyncio.sleep(SAMPLE_SECONDS)
            try:
                await self.step(client)
            except httpx.HTTPError as exc:
                # The server is away (its requests retry meanwhile): no figures, no
                # decision; the limit stays as it is until it answers.
                logger.debug("no look at %s: %s", self.url, exc)
            except Exception:  # a bug here must not stop the batch: the limit stays
                logger.exception("adaptive concurrency: the look at %s failed", self.url)

    async def step(self, client: httpx.AsyncClient) -> Admission:
        """One look at the server and one decision."""
        figures = await read_server(client, self.url)
        sample = self._sample_of(figures, time.monotonic())
        previous, self.state = self.state, limit_step(self.state, sample, self.limits)
        self._sample = sample
        stopped = self.gate.set_limit(self.state.limit, shed=self.state.shed)
        self.shed_total += stopped
        if self.state.mode is not previous.mode:
            logger.info("adaptive concurrency: %s -> %s, limit %s (%s in flight, %s "
                        "stopped to make room)", previous.mode, self.state.mode,
                        self.state.limit, sample.in_flight, stopped)
        return self.state

    def _sample_of(self, figures: ServerFigures | None, now: float) -> Sample:
        in_flight = self.gate.in_flight
        if figures is None:
            self.source = "latency"
            total, count = self._own
            latency = mean_since(total, count, *self._own_before)
            self._own_before = (total, count)
            return Sample(at=now, in_flight=in_flight, latency=latency)
        self.source = "metrics"
        before, self._figures = self._figures, figures
        latency = ttft = None
        if before is not None:
            latency = mean_since(figures.inter_token_sum, figures.inter_token_count,
                                 before.inter_token_sum, before.inter_token_count)
            ttft = mean_since(figures.first_token_sum, figures.first_token_count,
                              before.first_token_sum, before.first_token_count)
        return Sample(at=now, in_flight=in_flight, running=figures.running,
                      waiting=figures.waiting, latency=latency, ttft=ttft)
