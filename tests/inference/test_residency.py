"""Model multiplexing on the database and on a worker: the decider
(batches/residency.py: one decision per worker per epoch), the worker's swap
(inference/swap.py) and what the figures show. The policy itself, a pure function, is
tested in tests/fleet_records/test_residency_plan.py."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from batches.models import Chunk
from batches.residency import residency_decide
from fleet.models import ModelSwap, Residency, Worker
from fleet.residency import Reason
from fleet.services import residency_join

pytestmark_db = pytest.mark.django_db(transaction=True)


def live_worker(name: str, model: str = "") -> None:
    Worker.objects.create(name=name, hostname="h", pid=1, engine="simulated", model=model,
                          slots_capacity=8, ready=True, heartbeat_at=timezone.now())


@pytestmark_db
def test_the_decider_assigns_once_and_a_second_turn_changes_nothing(
        batch_in_progress, settings):
    settings.BATCHGEN_MULTIPLEX = True
    batch = batch_in_progress(6, chunk_size=3)
    live_worker("w1")
    residency_join(worker="w1")

    first = residency_decide()
    second = residency_decide()

    assert [(d.worker, d.model) for d in first] == [("w1", "m")]
    assert second == []
    row = Residency.objects.get(worker="w1")
    assert (row.model, row.epoch) == ("m", 1)
    swap = ModelSwap.objects.get(id=row.swap)
    assert (swap.from_model, swap.to_model, swap.reason) == ("", "m", "idle")
    assert Chunk.objects.filter(batch=batch).count() == 2


@pytestmark_db
def test_a_decision_on_a_stale_epoch_is_not_written(batch_in_progress):
    """Two deciders that both read epoch 0: the second one's UPDATE finds epoch 1 and
    writes nothing (and leaves no swap behind)."""
    from batches.residency import _write
    from fleet.residency import Decision

    live_worker("w1")
    residency_join(worker="w1")
    now = timezone.now()
    assert _write(Decision("w1", "m", Reason.IDLE), "", now)
    assert not _write(Decision("w1", "x", Reason.IDLE), "", now)
    assert Residency.objects.get(worker="w1").model == "m"
    assert ModelSwap.objects.count() == 1


@pytestmark_db
def test_a_gone_worker_is_forgotten_and_its_model_waits_again(batch_in_progress):
    batch_in_progress(3, chunk_size=3)
    live_worker("dead", model="m")
    Residency.objects.create(worker="dead", model="m")
    Worker.objects.filter(name="dead").update(
        heartbeat_at=timezone.now() - timedelta(hours=1))
    live_worker("w2")
    residency_join(worker="w2")

    decisions = residency_decide()

    assert not Residency.objects.filter(worker="dead").exists()
    assert [(d.worker, d.model) for d in decisions] == [("w2", "m")]


# --- the worker's swap (inference/swap.py), in process ----------------------------------------


@pytest.fixture
def multiplexing_runtime(two_models, published):
    from inference.runtime import NO_MODEL, InferenceRuntime

    runtime = InferenceRuntime(config=NO_MODEL, capacity=2, name="mux-worker", multiplex=True)
    runtime.start()
    yield runtime
    runtime.stop()


@pytestmark_db
def test_a_swap_hands_the_running_chunk_back_and_loads_the_new_model(
        multiplexing_runtime, batch_in_progress, settings):
    import threading

    from celery.exceptions import Reject

    from batches.models import ChunkStatus
    from files import storage
    from inference.swap import ModelSwapper

    runtime = multiplexing_runtime
    settings.BATCHGEN_SIM_LATENCY_MS = 150  # 2 slots: a chunk of 12 takes about 1 s
    swapper = ModelSwapper(runtime)
    swapper.swap("m", None)
    assert runtime.engine is not None and runtime.config.served_model_name == "m"
    batch = batch_in_progress(12, chunk_size=12)
    chunk = Chunk.objects.get(batch=batch)
    thread = threading.Thread(target=runtime.run_chunk, args=(chunk.id, "inference.m"))
    thread.start()
    path = storage.absolute(storage.incremental_name(batch.id))
    wait_for(lambda: path.exists() and len(path.read_bytes().splitlines()) >= 2)

    # When: the scheduler moves the worker to "e" mid-chunk
    swapper.swap("e", None)
    thread.join(timeout=60)

    # Then: what finished is written once and accounted, the rest is queued again
    chunk.refresh_from_db()
    written = path.read_bytes().splitlines()
    assert chunk.status == ChunkStatus.QUEUED and 2 <= chunk.completed == len(written) < 12
    assert runtime.config.served_model_name == "e" and not runtime.swapping.is_set()
    # and a message of the old model's queue is handed back unclaimed
    with pytest.raises(Reject):
        runtime.run_chunk(chunk.id, "inference.m")
    chunk.refresh_from_db()
    assert chunk.status == ChunkStatus.QUEUED and chunk.attempts == 1


@pytestmark_db
def test_a_database_outage_pauses_the_swapper_and_it_swaps_once_the_database_answers(
        multiplexing_runtime, batch_in_progress, monkeypatch, caplog):
    """The swapper reads its assignment through an outage: said once, the worker
    stays up (before, the first failed read took the worker down)."""
    from django.db import OperationalError

    from core import outage
    from fleet import services as fleet_services
    from inference import swap

    monkeypatch.setattr(outage, "_down", {})
    monkeypatch.setattr(swap, "OUTAGE_POLL_SECONDS", 0.05)
    real = fleet_services.residency_assigned
    refused = OperationalError('connection failed: connection to server at "127.0.0.1", '
                               "port 5432 failed: Connection refused")
    down = {"reads": 0, "until": 5}

    def assigned(**kwargs):
        down["reads"] += 1
        if down["reads"] <= down["until"]:
            raise refused
        return real(**kwargs)

    monkeypatch.setattr(fleet_services, "residency_assigned", assigned)
    runtime = multiplexing_runtime

    # When: the swapper starts while the database refuses connections, then answers
    with caplog.at_level(logging.WARNING, logger="batchgen"):
        runtime.start_swapper()
        wait_for(lambda: down["reads"] > down["until"])
        wait_for(lambda: Residency.objects.filter(worker="mux-worker").exists())
        batch_in_progress(3, chunk_size=3)
        [decision] = residency_decide()
        wait_for(lambda: runtime.config.served_model_name == decision.model)

    # Then: one WARNING for the outage, the worker never failed, and it swapped
    assert runtime.failed is None
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("batchgen")]
    assert len(warnings) == 1 and "database outage" in warnings[0], warnings


def wait_for(predicate, timeout: float = 30.0) -> None:
    from tests.e2e.harness import wait_until

    wait_until(predicate, timeout=timeout, interval=0.02)


# --- what it shows ----------------------------------------------------------------------------


@pytestmark_db
def test_models_and_pool_status_show_residency_swaps_and_the_wait(
        api, two_models, batch_in_progress):
    from batches.selectors import pool_status

    # Given: "m" resident on w1 after a swap from "e" that took 5 s, and a batch of "e"
    # whose model is now resident nowhere
    live_worker("w1", model="m")
    Residency.objects.create(worker="w1", model="m")
    ModelSwap.objects.create(worker="w1", from_model="e", to_model="m", reason="stretch",
                             decided_at=timezone.now(), seconds=5.0, drain_seconds=1.0)
    batch = batch_in_progress(3, chunk_size=3)
    Chunk.objects.filter(batch=batch).update(model="e")

    models = {m["id"]: m for m in api.get("/v1/models").json()["data"]}
    pool = pool_status()

    assert (models["m"]["resident"], models["m"]["resident_on"]) == (True, ["w1"])
    assert (models["e"]["resident"], models["e"]["live"]) == (False, True)
    assert pool["multiplexing"] == {"workers": 1, "swaps": 1, "swaps_done": 1, "loads": 0,
                                    "swap_seconds": 5.0, "swap_hand_back_seconds": 1.0}
    by_model = {row["model"]: row for row in pool["models"]}
    assert by_model["m"]["resident_on"] == ["w1"] and by_model["m"]["waiting_seconds"] is None
    assert by_model["e"]["resident_on"] == [] and by_model["e"]["waiting_seconds"] >= 0
    metrics = api.get("/metrics").content.decode()
    assert "batchgen_model_swaps_total 1.0" in metrics
    assert 'batchgen_model_requests_open{model="e"} 3.0' in metrics


@pytestmark_db
def test_an_engine_that_can_sleep_is_woken_at_the_swap_back_not_started_again(
        multiplexing_runtime, settings):
    """As vLLM's sleep mode on a GPU: the simulated engine told it can sleep."""
    from inference.swap import ModelSwapper

    settings.BATCHGEN_ENGINE_ARGS = {"wake_seconds": 0.01}
    runtime = multiplexing_runtime
    swapper = ModelSwapper(runtime)
    swapper.swap("m", None)
    first = runtime.engine

    swapper.swap("e", None)
    assert runtime.engine is not first and first.asleep
    swapper.swap("m", None)

    assert runtime.engine is first and not first.asleep
    assert runtime.config.served_model_name == "m" and set(runtime.engines.asleep) == {"e"}


@pytestmark_db
def test_a_batch_says_it_waits_for_its_model_to_be_loaded_until_it_is(
        api, two_models, batch_in_progress):
    from batches import availability

    live_worker("w1", model="e")
    Residency.objects.create(worker="w1", model="e")
    batch = batch_in_progress(3, chunk_size=3)  # of model "m"

    assert availability.batches_watch_models() == 0
    shown = api.get(f"/v1/batches/{batch.id}").json()["error"]
    assert shown["code"] == "model_not_resident" and "m is not loaded" in shown["message"]

    Residency.objects.filter(worker="w1").update(model="m")
    availability.batches_watch_models()
    after = api.get(f"/v1/batches/{batch.id}").json()
    assert (after["status"], after["error"]) == ("in_progress", None)


@pytestmark_db
def test_a_chunk_claimed_while_a_swap_began_goes_back_without_running(
        multiplexing_runtime, batch_in_progress, monkeypatch):
    from batches.models import ChunkStatus
    from inference.swap import ModelSwapper

    runtime = multiplexing_runtime
    ModelSwapper(runtime).swap("m", None)
    batch = batch_in_progress(4, chunk_size=4)
    chunk = Chunk.objects.get(batch=batch)
    claim = runtime.chunks.claim

    def claim_during_a_swap(chunk_id):
        work = claim(chunk_id)
        runtime.swapping.set()  # the swapper began while the claim ran
        return work

    monkeypatch.setattr(runtime.chunks, "claim", claim_during_a_swap)
    outcome = runtime.run_chunk(chunk.id, "inference.m")

    chunk.refresh_from_db()
    assert "released, model swap" in outcome
    assert (chunk.status, chunk.completed, chunk.failed) == (ChunkStatus.QUEUED, 0, 0)


@pytestmark_db
def test_two_deciders_at_once_decide_each_worker_once(batch_in_progress):
    from tests.concurrency import require_concurrent_database, run_together

    require_concurrent_database()
    batch_in_progress(6, chunk_size=3)
    for name in ("w1", "w2"):
        live_worker(name)
        residency_join(worker=name)

    outcomes = run_together(4, lambda _: residency_decide())

    assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
    decided = [d for outcome in outcomes for d in outcome]
    assert len(decided) == len({d.worker for d in decided}) == 1  # one model, one worker
    assert ModelSwap.objects.count() == 1
    assert Residency.objects.filter(epoch=1).count() == 1


def test_the_queue_switch_follows_the_model_a_multiplexing_worker_holds():
    """Consume the bare queue while holding nothing or swapping, the model's queue
    once its engine is up, nothing while the storage volume is full."""
    import threading
    from types import SimpleNamespace

    from inference.signals import QueueSwitch

    consumed = {"inference"}

    class Queues(dict):  # kombu's Queues, as far as the switch uses them
        consume_from = {"inference": None}

        def select_add(self, queue):
            pass

        def deselect(self, name):
            pass

        def __missing__(self, name):
            return name

    class Consumer:
        app = SimpleNamespace(amqp=SimpleNamespace(queues=Queues()))
        task_consumer = SimpleNamespace(consuming_from=lambda name: name in consumed)

        def call_soon(self, fn):
            fn()

        def cancel_task_queue(self, name):
            consumed.discard(name)

        def add_task_queue(self, name):
            consumed.add(name)

    runtime = SimpleNamespace(storage_error="", multiplex=True, swapping=threading.Event(),
                              engine=None, config=SimpleNamespace(served_model_name=""))
    switch = QueueSwitch(Consumer(), runtime)

    runtime.engine, runtime.config.served_model_name = object(), "m"
    switch.changed()
    assert consumed == {"inference", "inference.m"}
    runtime.swapping.set()
    switch.changed()
    assert consumed == {"inference"}
    runtime.swapping.clear()
    runtime.config.served_model_name = "e"
    switch.changed()
    assert consumed == {"inference", "inference.e"}
    runtime.storage_error = "No space left on device"
    switch.changed()
    assert consumed == set()


@pytestmark_db
def test_a_model_taken_off_a_worker_waits_from_then_not_from_its_batch_start(
        two_models, batch_in_progress):
    from batches.residency import model_demand

    batch = batch_in_progress(3, chunk_size=3)
    Chunk.objects.filter(batch=batch).update(model="e")
    began = batch.in_progress_at
    evicted_at = began + timedelta(seconds=30)
    ModelSwap.objects.create(worker="w1", from_model="e", to_model="m", reason="stretch",
                             decided_at=evicted_at)

    [demand_e] = model_demand(began + timedelta(seconds=60))

    assert (demand_e.model, demand_e.requests) == ("e", 3)
    assert demand_e.waiting_since == evicted_at.timestamp()


# --- a model whose engine cannot start (inference/swap.py, _start_failed) ---------------------


@pytestmark_db
def test_a_model_that_cannot_start_leaves_the_worker_serving_the_others(
        multiplexing_runtime, batch_in_progress, settings, api):
    """`e`'s engine refuses its settings (EngineConfigError): the worker records it
    with the cause, holds nothing, is never given `e` again and serves `m`; `e` shows
    it cannot start and its batch fails with model_unavailable at the bound, as on
    the pinned path."""
    from batches import availability
    from batches.models import Batch

    settings.BATCHGEN_ENGINE_ARGS = {"fail_start": {"e": "config"}}
    settings.BATCHGEN_MODEL_UNAVAILABLE_SECONDS = 60
    runtime = multiplexing_runtime
    runtime.start_swapper()
    wait_for(lambda: Residency.objects.filter(worker="mux-worker").exists())
    of_e = batch_in_progress(3, chunk_size=3)
    Chunk.objects.filter(batch=of_e).update(model="e")

    [decision] = residency_decide()
    assert decision.model == "e"
    wait_for(lambda: "e" in Residency.objects.get(worker="mux-worker").cannot_start)

    row = Residency.objects.get(worker="mux-worker")
    assert "refuse its settings" in row.cannot_start["e"] and row.model == ""
    assert ModelSwap.objects.get(id=decision_swap(decision)).error == row.cannot_start["e"]
    from fleet.selectors import swap_outcome

    assert swap_outcome(decision_swap(decision))["outcome"] == "failed"  # as Flower shows it
    assert runtime.failed is None and runtime.exit_code() is None
    assert runtime.engine is None and runtime.config.served_model_name == ""
    assert residency_decide() == []  # e waits for no one: it is never given again
    of_m = batch_in_progress(3, chunk_size=3)
    assert [d.model for d in residency_decide()] == ["m"]
    wait_for(lambda: runtime.config.served_model_name == "m" and runtime.engine is not None
             and not runtime.swapping.is_set())
    runtime.heartbeat.beat_once()

    models = {m["id"]: m for m in api.get("/v1/models").json()["data"]}
    assert "refuse its settings" in models["e"]["cannot_start"] and not models["e"]["live"]
    assert models["m"]["cannot_start"] is None and models["m"]["live"]
    health = api.get("/health").json()
    assert "model e cannot start" in health["reason"], health
    availability.batches_watch_models()
    assert Batch.objects.get(id=of_e.id).error["code"] == "model_unavailable"
    assert Batch.objects.get(id=of_m.id).error is None
    error = Batch.objects.get(id=of_e.id).error
    Batch.objects.filter(id=of_e.id).update(error={**error, "since": error["since"] - 61})
    assert availability.batches_watch_models() == 1
    failed = Batch.objects.get(id=of_e.id)
    assert (failed.status, failed.error["code"]) == ("failed", "model_unavailable")
    assert Batch.objects.get(id=of_m.id).status == "in_progress"


def decision_swap(decision) -> int:
    return ModelSwap.objects.filter(worker=decision.worker, to_model=decision.model).get().id


@pytestmark_db
def test_a_transient_start_failure_is_tried_again_then_the_worker_gives_up(
        multiplexing_runtime, settings, monkeypatch):
    from inference import swap
    from inference.swap import ModelSwapper

    monkeypatch.setattr(swap, "START_RETRY_SECONDS", 0.01)
    settings.BATCHGEN_ENGINE_ARGS = {"fail_start": {"e": "transient"}}
    runtime = multiplexing_runtime
    residency_join(worker=runtime.name)
    swapper = ModelSwapper(runtime)

    for _ in range(swap.START_TRIES - 1):
        swapper.swap("e", None)  # failed, to be tried again: the worker holds nothing
        assert runtime.engine is None and runtime.failed is None
    assert Residency.objects.get(worker=runtime.name).cannot_start == {}
    with pytest.raises(RuntimeError, match="fail its start"):
        swapper.swap("e", None)  # the swapper thread then stops the worker, as before
    swapper.swap("m", None)
    assert runtime.config.served_model_name == "m" and swapper.start_failures == {"e": 3}


# --- each swap shown as a task in Flower (residency.swap) -------------------------------------


@pytestmark_db
def test_each_swap_is_published_as_a_task_that_only_reads_it(
        multiplexing_runtime, batch_in_progress, published):
    from fleet.tasks import show_swap
    from inference.swap import ModelSwapper

    runtime = multiplexing_runtime
    residency_join(worker=runtime.name)
    batch_in_progress(3, chunk_size=3)
    [decision] = residency_decide()
    swap_id = Residency.objects.get(worker=runtime.name).swap

    ModelSwapper(runtime).swap(decision.model, swap_id)

    # Then: one residency.swap message, sent once the swap was recorded ...
    assert [args for name, args in published if name == "residency.swap"] == [(swap_id,)]
    recorded = (list(ModelSwap.objects.values()), list(Residency.objects.values()))
    assert recorded[0][0]["seconds"] is not None  # ... so never running it loses nothing
    # ... whose body, run twice (a redelivery), reports the same and changes nothing
    shown = {"worker": runtime.name, "from_model": "", "to_model": "m"}
    first = show_swap.apply(args=(swap_id,), kwargs=shown).get()
    assert show_swap.apply(args=(swap_id,), kwargs=shown).get() == first
    assert (first["worker"], first["from"], first["to"], first["outcome"]) == (
        runtime.name, "", "m", "done")
    assert first["seconds"] >= 0 and first["hand_back_seconds"] >= 0 and first["error"] is None
    assert (list(ModelSwap.objects.values()), list(Residency.objects.values())) == recorded
    assert show_swap(swap_id + 1000) is None  # a swap whose decision was undone
