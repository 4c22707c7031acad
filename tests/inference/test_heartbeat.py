"""The worker's heartbeat names the chunks it holds, claimed or only prefetched, so
recovery can tell them from chunks the broker lost (batches.recovery, issue 26); and
a database outage is said once, not as an ERROR at every flush and heartbeat."""

from __future__ import annotations

import logging

import pytest
from celery.worker import state
from django.db import OperationalError

from batches.usage import Usage
from core import outage
from fleet.models import Worker
from inference.worker_state import request_id
from serving.engines.base import EngineResult

pytestmark = pytest.mark.django_db(transaction=True)


class Prefetched:
    """A run_chunk message Celery took from the broker and holds for a free thread
    (celery.worker.request.Request: `type` is the task's name, `name` its shadow)."""

    type = "inference.run_chunk"
    name = "chunk batch_x#3"
    args = ("batch_x", 4242)


def test_the_heartbeat_names_claimed_and_prefetched_chunks(runtime_factory):
    runtime = runtime_factory()
    prefetched = Prefetched()
    state.reserved_requests.add(prefetched)
    runtime.ledger.hold(17)  # claimed and running
    try:
        runtime.heartbeat.beat_once()
    finally:
        state.reserved_requests.discard(prefetched)
        runtime.ledger.drop(17)

    assert Worker.objects.get(name=runtime.name).held_chunks == [17, 4242]


def test_the_heartbeat_tells_where_its_engine_is_in_each_chunk(runtime_factory, monkeypatch):
    """Worker.chunk_tails, from what the engine tells of each request in it
    (Engine.progress, vLLM's: tests/inference/test_vllm_engine.py): per chunk, its
    requests in the engine, the most tokens one may still generate, None when one
    has no limit, and those that have generated a token (a request without one has
    its prompt still to compute); empty from an engine that tells nothing (the
    simulated one)."""
    runtime = runtime_factory()
    runtime.heartbeat.beat_once()
    assert Worker.objects.get(name=runtime.name).chunk_tails == {}

    told = {request_id("batch_x", 3, 0, 1): (5, 24), request_id("batch_x", 3, 7, 1): (20, 32),
            request_id("batch_x", 3, 9, 1): (0, 16), request_id("batch_x", 4, 0, 0): (2, None),
            request_id("batch_y", 3, 2, 0): (9, 8), request_id("batch_y", 5, 0, 0): (0, 12)}
    monkeypatch.setattr(runtime.engines.engine, "progress", lambda: told)
    runtime.heartbeat.beat_once()
    assert Worker.objects.get(name=runtime.name).chunk_tails == {
        "batch_x-3": [3, 19, 2], "batch_x-4": [1, None, 1], "batch_y-3": [1, 0, 1],
        "batch_y-5": [1, 12, 0]}


def test_an_engine_that_cannot_tell_its_requests_costs_the_heartbeat_nothing(
        runtime_factory, monkeypatch, caplog):
    """Engine.progress is for the ETA: when it raises, the worker still beats (its
    liveness, its held chunks) without it, and says so once at WARNING."""
    runtime = runtime_factory()

    def broken():
        raise RuntimeError("dictionary changed size during iteration")

    monkeypatch.setattr(runtime.engines.engine, "progress", broken)
    runtime.ledger.hold(17)
    try:
        with caplog.at_level(logging.WARNING, logger="batchgen.inference"):
            runtime.heartbeat.beat()
            runtime.heartbeat.beat()
    finally:
        runtime.ledger.drop(17)

    row = Worker.objects.get(name=runtime.name)
    assert (row.held_chunks, row.chunk_tails) == ([17], {})
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.levelno for r in said] == [logging.WARNING]
    assert "reading the engine's requests" in said[0].getMessage()


def answered(*answers: tuple[int, int, int]) -> tuple[list[EngineResult], Usage]:
    """Results of (prompt tokens, completion tokens, cached prompt tokens), and their
    answers' usage summed, as a chunk's flush hands them to WorkerState.count."""
    results = [EngineResult(body={"usage": {
        "prompt_tokens": prompt, "completion_tokens": output,
        "prompt_tokens_details": {"cached_tokens": cached}}},
        prompt_tokens=prompt, completion_tokens=output) for prompt, output, cached in answers]
    usage = Usage()
    for result in results:
        usage.add_body(result.body)
    return results, usage


def test_the_heartbeat_tells_the_work_its_engine_did(runtime_factory):
    """Busy seconds, prompt tokens computed and tokens generated (the ETA's cost
    fit): from each answer for an engine that does not tell its steps (the
    simulated one; cached prompt tokens left out), from the engine's steps alone
    for one that does."""
    runtime = runtime_factory()
    state, slots = runtime.state, runtime.engines.slots
    assert not state.work_from_engine  # the simulated engine tells no steps
    assert slots.try_acquire()
    slots.release()
    state.count(*answered((30, 7, 16), (16, 0, 0)))
    runtime.heartbeat.beat_once()
    row = Worker.objects.get(name=runtime.name)
    assert (row.prompt_tokens_computed, row.tokens_computed) == (30, 7)  # 14 + 16
    assert row.busy_seconds > 0

    state.work_from_engine = True  # as for vLLM: its steps told the work already
    state.add_work(100, 5)
    state.count(*answered((100, 5, 0)))
    runtime.heartbeat.beat_once()
    row = Worker.objects.get(name=runtime.name)
    assert (row.prompt_tokens_computed, row.tokens_computed) == (130, 12)
    assert (row.requests_completed, row.tokens_generated) == (3, 12)


def test_the_engines_steps_tell_a_prompt_tokens_cost(runtime_factory):
    """Each step's seconds over its work (WorkerState.add_work from an engine that
    tells both) fit a prompt token's cost against a decode unit's (a request done
    or a token generated) within a few steps, where steps that prefill sit beside
    steps that only decode; the heartbeat carries it (Worker.engine_prompt_weight),
    the ETA's prior for a model not fitted yet. A new engine starts afresh."""
    runtime = runtime_factory()
    state = runtime.state
    state.work_from_engine = True
    assert state.engine_prompt_weight() is None
    # A decode unit 4 ms, a prompt token 1 ms: a prompt token is worth 0.25.
    for prompt, output, finished in ((2000, 20, 0), (0, 60, 4), (800, 60, 2), (0, 40, 8),
                                     (1500, 30, 1), (300, 64, 0)):
        state.add_work(prompt, output, finished, 0.004 * (output + finished) + 0.001 * prompt)
    state.add_work(100, 1)  # a step that says no time: counted, not fitted
    assert state.engine_prompt_weight() == pytest.approx(0.25)
    assert (state.prompt_tokens_computed, state.tokens_computed) == (4700, 275)
    runtime.heartbeat.beat_once()
    assert Worker.objects.get(name=runtime.name).engine_prompt_weight == pytest.approx(0.25)

    state.new_engine()  # a swap: another model's steps
    assert state.engine_prompt_weight() is None
    runtime.heartbeat.beat_once()
    assert Worker.objects.get(name=runtime.name).engine_prompt_weight is None


def test_flushes_and_heartbeats_in_a_database_outage_say_it_once(runtime_factory, monkeypatch,
                                                                 caplog):
    runtime = runtime_factory()
    monkeypatch.setattr(outage, "_down", {})

    def unreachable(**kwargs):
        raise OperationalError("connection failed: Connection refused")

    monkeypatch.setattr(runtime.ledger, "_flush", unreachable)
    monkeypatch.setattr(runtime.database, "heartbeat", unreachable)
    runtime.ledger.hold(17)
    with caplog.at_level(logging.INFO):
        for _ in range(5):
            runtime.heartbeat.flush_once()
            runtime.heartbeat.beat()
    runtime.ledger.drop(17)

    assert [(r.name, r.levelname) for r in caplog.records if r.levelno >= logging.WARNING] \
        == [("batchgen.outage", "WARNING")]
