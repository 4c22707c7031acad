"""Each batch's ETA and at_risk (batches/estimates.py): measured from finished chunks
of several workers, played under fair share, cached on the batch row and shown on
the batch object. Run on PostgreSQL too (`make test`'s second pass)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from batches import chunks, dispatch, estimates, services
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus, ModelThroughput
from fleet import selectors as fleet_selectors
from fleet.models import Worker
from serving.model_info import served_model
from tests.concurrency import require_concurrent_database, run_together

pytestmark = pytest.mark.django_db


def eta_of(batch: Batch, now) -> float:
    """Seconds from `now` to the batch's estimated completion, as refreshed."""
    return (Batch.objects.get(id=batch.id).estimated_completion_at - now).total_seconds()


def not_dispatched(batch: Batch) -> Batch:
    """`batch` with none of its chunks sent to the broker yet."""
    Chunk.objects.filter(batch=batch).update(status=ChunkStatus.PENDING)
    return batch


def measured_at(now, model: str, *, rate: float, cost_per_request: float = 1,
                prompt_weight: float = 0.0) -> None:
    """The model's throughput as measured at `now`."""
    ModelThroughput.objects.create(model=model, rate=rate, cost_per_request=cost_per_request,
                                   prompt_weight=prompt_weight, workers=1, measured_at=now)


def running_on(worker: str, batch: Batch, index: int, claimed) -> None:
    """Chunk `index` of `batch` claimed by `worker` at `claimed`."""
    Chunk.objects.filter(batch=batch, index=index).update(
        status=ChunkStatus.RUNNING, worker=worker, claimed_at=claimed)


def live_workers(count: int, model: str) -> None:
    for n in range(Worker.objects.count(), count):
        Worker.objects.create(name=f"w{n}", hostname="h", pid=n, engine="simulated",
                              model=model, slots_capacity=2, ready=True,
                              heartbeat_at=timezone.now())


def worked(worker: str, *, busy: float, requests: int, prompt: int = 0, output: int = 0) -> None:
    """`worker`'s heartbeat says its engine held requests for `busy` seconds so far
    and did this work (Worker.busy_seconds and the counts beside it)."""
    Worker.objects.filter(name=worker).update(
        busy_seconds=busy, requests_completed=requests, prompt_tokens_computed=prompt,
        tokens_computed=output)


def finish(batch: Batch, indexes: range, *, workers: list[str], started, seconds: float,
           output_tokens: int = 0) -> None:
    """Chunks `indexes` of `batch` ran on `workers` (in turn) from `started` for
    `seconds` each, all at once, and finished."""
    done = 0
    for position, index in enumerate(indexes):
        chunk = Chunk.objects.get(batch=batch, index=index)
        Chunk.objects.filter(id=chunk.id).update(
            status=ChunkStatus.DONE, completed=chunk.count, worker=workers[position % len(workers)],
            claimed_at=started, finished_at=started + timedelta(seconds=seconds))
        done += chunk.count
    Batch.objects.filter(id=batch.id).update(completed=done, usage_output_tokens=output_tokens)


def test_the_eta_plays_the_chunks_over_the_rate_of_several_workers(running_batch, api):
    model = served_model().id
    live_workers(2, model)
    small, big = running_batch(10, chunk_size=2), running_batch(40, chunk_size=2)
    now = timezone.now()
    # Two workers each ran a chunk of 2 requests in the same 2 s: 2 requests a second.
    finish(small, range(2), workers=["w0", "w1"], started=now - timedelta(seconds=10),
           seconds=2)

    estimates.estimates_refresh(now)

    assert ModelThroughput.objects.get(model=model).rate == pytest.approx(2.0)
    # The small batch's three chunks left were published ahead of the big one's and
    # are dealt round the two workers (two on one: 4 s); the big one's 40 requests
    # follow on both, 46 requests at 2 a second, its last chunk on one worker: 24 s.
    small_row, big_row = Batch.objects.get(id=small.id), Batch.objects.get(id=big.id)
    assert (small_row.estimated_completion_at - now).total_seconds() == pytest.approx(4, abs=0.01)
    assert (big_row.estimated_completion_at - now).total_seconds() == pytest.approx(24, abs=0.01)
    shown = api.get(f"/v1/batches/{big.id}").json()
    assert shown["estimated_completion_at"] == int(big_row.estimated_completion_at.timestamp())
    assert shown["at_risk"] is False


def test_more_workers_shorten_the_eta_down_to_a_chunk_on_one_worker(running_batch):
    model = served_model().id
    live_workers(2, model)
    batch = running_batch(20, chunk_size=2)
    now = timezone.now()
    finish(batch, range(2), workers=["w0", "w1"], started=now - timedelta(seconds=10), seconds=2)
    estimates.estimates_refresh(now)
    before = Batch.objects.get(id=batch.id).estimated_completion_at - now

    live_workers(4, model)
    estimates.estimates_refresh(now)

    after = Batch.objects.get(id=batch.id).estimated_completion_at - now
    # 16 requests left in 8 chunks of 2, 1/s a worker, dealt round the workers as
    # the broker hands them out: 4 chunks each on two workers (8 s), 2 on four (4 s).
    assert before.total_seconds() == pytest.approx(8)
    assert after.total_seconds() == pytest.approx(4)


def test_a_batch_of_long_answers_is_estimated_by_its_tokens(running_batch):
    """Ten times the output tokens a request take ten times the workers' time (cost
    units are a request plus its output tokens)."""
    model = served_model().id
    live_workers(1, model)
    short, long = running_batch(12, chunk_size=2), running_batch(12, chunk_size=2)
    now = timezone.now()
    finish(short, range(1), workers=["w0"], started=now - timedelta(seconds=20), seconds=1,
           output_tokens=2 * 9)   # cost 10 a request
    finish(long, range(1), workers=["w0"], started=now - timedelta(seconds=19), seconds=10,
           output_tokens=2 * 99)  # cost 100 a request

    estimates.estimates_refresh(now)

    # The worker's second chunk served from the first one's close: 200 units in
    # 10 s, 20 a second. The short batch's chunks are all in the broker's window
    # ahead of the long one's: its 10 requests left (100 units) take 5 s, then the
    # long one's 10 (1000 units) 50 s more.
    rows = {row.id: (row.estimated_completion_at - now).total_seconds()
            for row in Batch.objects.all()}
    assert ModelThroughput.objects.get(model=model).rate == pytest.approx(20)
    assert rows[short.id] == pytest.approx(5)
    assert rows[long.id] == pytest.approx(55)


def test_eta_is_null_until_a_rate_is_measured_and_after_the_batch_ends(running_batch, api):
    batch = running_batch(6, chunk_size=2)

    estimates.estimates_refresh()

    assert api.get(f"/v1/batches/{batch.id}").json()["estimated_completion_at"] is None
    Batch.objects.filter(id=batch.id).update(status=BatchStatus.COMPLETED,
                                             estimated_completion_at=timezone.now())
    assert api.get(f"/v1/batches/{batch.id}").json()["estimated_completion_at"] is None


def test_a_window_that_cannot_be_kept_with_the_whole_model_is_at_risk(running_batch, api):
    model = served_model().id
    live_workers(1, model)
    batch = running_batch(40, chunk_size=2)
    now = timezone.now()
    finish(batch, range(1), workers=["w0"], started=now - timedelta(seconds=5), seconds=2)
    # 1 request a second, 38 left, 10 s of window left.
    Batch.objects.filter(id=batch.id).update(expires_at=now + timedelta(seconds=10))

    estimates.estimates_refresh(now)

    assert api.get(f"/v1/batches/{batch.id}").json()["at_risk"] is True
    assert estimates.at_risk_count() == 1


def test_a_refresh_that_moves_nothing_writes_nothing(running_batch, django_assert_max_num_queries):
    model = served_model().id
    live_workers(1, model)
    batch = running_batch(10, chunk_size=2)
    now = timezone.now()
    finish(batch, range(1), workers=["w0"], started=now - timedelta(seconds=5), seconds=2)
    assert estimates.estimates_refresh(now) == 1

    assert estimates.estimates_refresh(now) == 0



def refreshes_asked(published) -> list[float]:
    """When each refresh that dispatch.send_refresh asked for was asked (the
    beat's ticks publish none)."""
    return [args[0] for name, args in published if name == "batches.refresh_estimates"]


def test_an_admission_refreshes_the_etas_at_once_and_a_burst_costs_one_refresh(
        running_batch, published):
    """A batch admitted shares its model with the others from then on: it asks the
    control worker for a refresh after its commit, which gives it its ETA and the
    others theirs at once rather than at the next tick. A refresh begun after an
    event covers it, and the event's plays the tick's measurements again without
    taking in the workers' figures."""
    model = served_model().id
    live_workers(1, model)
    first = running_batch(10, chunk_size=2)
    now = timezone.now()
    finish(first, range(1), workers=["w0"], started=now - timedelta(seconds=5), seconds=2)
    assert estimates.estimates_refresh() == 1  # the tick
    measured, rate = estimates.PROGRESS.at, ModelThroughput.objects.get(model=model).rate
    [admitted_first] = refreshes_asked(published)

    second = running_batch(10, chunk_size=2)

    admitted_first_again, admitted_second = refreshes_asked(published)
    assert admitted_first_again == admitted_first < admitted_second
    assert Batch.objects.get(id=second.id).estimated_completion_at is None  # until a tick
    assert estimates.estimates_refresh_after(admitted_first) == 0  # the tick began after
    assert estimates.estimates_refresh_after(admitted_second) == 1
    # 8 requests of the first and 10 of the second at 1 a second on one worker.
    assert eta_of(second, timezone.now()) == pytest.approx(18, abs=0.5)
    assert estimates.estimates_refresh_after(admitted_second) == 0  # a burst: one
    assert estimates.PROGRESS.at == measured  # the tick's figures, played again
    assert ModelThroughput.objects.get(model=model).rate == pytest.approx(rate)


def test_a_cancel_asks_for_a_refresh_which_measures_in_a_process_that_never_has(
        running_batch, published, django_capture_on_commit_callbacks):
    """A cancelled batch's share goes to the others: it asks for a refresh too. A
    control worker that has not refreshed on a tick yet (just started) measures
    in it, as the tick would."""
    model = served_model().id
    live_workers(1, model)
    kept, cancelled = running_batch(10, chunk_size=2), running_batch(10, chunk_size=2)
    finish(kept, range(1), workers=["w0"], started=timezone.now() - timedelta(seconds=5),
           seconds=2)
    asked = len(refreshes_asked(published))

    with django_capture_on_commit_callbacks(execute=True):
        services.batch_cancel(batch_id=cancelled.id)

    assert len(refreshes_asked(published)) == asked + 1
    assert estimates.PROGRESS.at is None
    assert estimates.estimates_refresh_after(refreshes_asked(published)[-1]) == 1
    assert estimates.PROGRESS.at is not None
    assert eta_of(kept, timezone.now()) == pytest.approx(8, abs=0.5)


def test_batches_that_expire_ask_for_one_refresh_and_leave_the_others_eta_at_once(
        running_batch, published, django_capture_on_commit_callbacks):
    """Two batches past their windows fail together: their shares go to the batch
    left, which asks for one refresh, not one each (none while nothing expired)."""
    model = served_model().id
    live_workers(1, model)
    late = [running_batch(10, chunk_size=2) for _ in range(2)]  # ahead in the window
    kept = running_batch(10, chunk_size=2)
    now = timezone.now()
    measured_at(now, model, rate=1)
    estimates.estimates_refresh(now)
    before = eta_of(kept, now)
    Batch.objects.filter(id__in=[batch.id for batch in late]).update(
        expires_at=now - timedelta(seconds=1))
    asked = len(refreshes_asked(published))

    with django_capture_on_commit_callbacks(execute=True):
        assert services.batches_expire() == 2
        assert services.batches_expire() == 0

    assert len(refreshes_asked(published)) == asked + 1
    assert estimates.estimates_refresh_after(refreshes_asked(published)[-1]) >= 1
    assert eta_of(kept, now) < before


@pytest.mark.django_db(transaction=True)
def test_refreshes_beside_several_workers_flushing_and_dispatching_never_deadlock(
        upload, published, settings):
    """Estimate refreshes, dispatches and four workers' progress flushes over chunks
    of the same batches, at once (PostgreSQL: the lock order of DESIGN.md's facts)."""
    require_concurrent_database()
    from batches import services
    from tests.conftest import chat_line, jsonl

    settings.BATCHGEN_CHUNK_SIZE = 2
    model = served_model().id
    live_workers(4, model)
    batches = []
    for n in range(3):
        batch = services.batch_create(
            input_file_id=upload(jsonl([chat_line(f"b{n}-{i}") for i in range(24)]))["id"],
            endpoint="/v1/chat/completions", model=model, completion_window="24h")
        batches.append(services.batch_validate(batch_id=batch.id))
    held: dict[str, list[int]] = {f"w{i}": [] for i in range(4)}
    for position, chunk in enumerate(Chunk.objects.filter(index__lt=6).order_by("id")):
        worker = f"w{position % 4}"
        Chunk.objects.filter(id=chunk.id).update(status=ChunkStatus.QUEUED)
        assert chunks.chunk_claim(chunk_id=chunk.id, worker=worker)
        held[worker].append(chunk.id)
    rounds, errors, lock = 10, [], threading.Lock()

    def work(i: int):
        try:
            if i < 4:
                name = f"w{i}"
                for round_ in range(rounds):
                    counts = {chunk_id: (1, 0) if round_ < 2 else (0, 0) for chunk_id in held[name]}
                    if round_ == rounds - 1:
                        chunks.chunks_flush(worker=name, closing=counts)
                    else:
                        chunks.chunks_flush(worker=name, progress=counts, holding=held[name])
            elif i == 4:
                for _ in range(rounds):
                    dispatch.dispatch()
            else:
                for _ in range(rounds):
                    estimates.estimates_refresh()
        except BaseException as exc:
            with lock:
                errors.append(exc)
            raise

    run_together(6, work)

    assert errors == []
    estimates.estimates_refresh()
    rows = Batch.objects.filter(id__in=[b.id for b in batches])
    assert all(row.estimated_completion_at is not None for row in rows), [
        (row.id, row.status) for row in rows]


@pytest.fixture
def one_request_a_second(settings):
    model = served_model().id
    live_workers(1, model)
    ModelThroughput.objects.create(model=model, rate=1.0, cost_per_request=1.0, workers=1,
                                   measured_at=timezone.now())
    settings.BATCHGEN_MIN_COMPLETION_WINDOW_SECONDS = 60


def create_200(api, upload, window: str):
    from tests.conftest import chat_line, jsonl

    file = upload(jsonl([chat_line(f"r{i}") for i in range(200)]))
    return api.post("/v1/batches", {"input_file_id": file["id"], "completion_window": window},
                    format="json")


def test_strict_admission_refuses_a_window_its_eta_cannot_keep_naming_the_eta(
        api, upload, published, settings, one_request_a_second):
    settings.BATCHGEN_STRICT_COMPLETION_WINDOW = True

    response = create_200(api, upload, "2m")  # 200 requests at 1/s: 200 s

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "completion_window_infeasible"
    assert error["param"] == "completion_window"
    assert "in 200 seconds" in error["message"] and "Unix" in error["message"]
    assert not Batch.objects.exists()
    assert create_200(api, upload, "5m").status_code == 200


def test_without_strict_admission_an_infeasible_window_is_taken_as_openai_would(
        api, upload, published, one_request_a_second):
    assert create_200(api, upload, "2m").status_code == 200


def test_a_refresh_reads_the_same_few_queries_for_two_batches_or_eight(running_batch):
    """Polls read the cached column; the refresh itself must not read per batch."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    model = served_model().id
    live_workers(2, model)
    first = running_batch(10, chunk_size=2)
    running_batch(10, chunk_size=2)
    now = timezone.now()
    finish(first, range(2), workers=["w0", "w1"], started=now - timedelta(seconds=10), seconds=2)
    estimates.estimates_refresh(now)
    with CaptureQueriesContext(connection) as two:
        assert estimates.estimates_refresh(now) == 0
    for _ in range(6):
        running_batch(10, chunk_size=2)
    estimates.estimates_refresh(now)

    with CaptureQueriesContext(connection) as eight:
        assert estimates.estimates_refresh(now) == 0

    assert len(eight.captured_queries) == len(two.captured_queries) <= 12


def test_strict_admission_counts_the_work_already_running(
        api, upload, published, settings, one_request_a_second, running_batch):
    """Alone, 200 requests at 1/s take 200 s and fit 6 minutes. Beside a running
    batch of 400 with a 24 h window they still do: the 100 of its requests already
    in the broker's window run first, then the deadline policy gives the new batch
    the model (fair share would take 500 s). Beside one that needs nearly the whole
    model to keep its own window (400 requests in 420 s), they do not."""
    settings.BATCHGEN_STRICT_COMPLETION_WINDOW = True
    running = running_batch(400, chunk_size=20)
    assert Chunk.objects.filter(batch=running, status=ChunkStatus.QUEUED).count() == 5

    assert create_200(api, upload, "6m").status_code == 200
    Batch.objects.filter(status=BatchStatus.VALIDATING).update(status=BatchStatus.FAILED)
    settings.BATCHGEN_DEADLINE_POLICY = False
    assert create_200(api, upload, "6m").status_code == 400
    settings.BATCHGEN_DEADLINE_POLICY = True
    Batch.objects.filter(id=running.id).update(expires_at=timezone.now() + timedelta(seconds=420))

    response = create_200(api, upload, "6m")

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "completion_window_infeasible"


def test_a_file_s_requests_are_estimated_from_its_head(tmp_path):
    path = tmp_path / "input.jsonl"
    line = b'{"custom_id": "x", "body": {}}\n'
    path.write_bytes(line * 100_000)

    estimate = estimates.requests_estimate(path=path, size=path.stat().st_size)

    assert estimate == pytest.approx(100_000, rel=0.001)


@pytest.mark.django_db(transaction=True)
def test_the_refresh_task_through_a_database_outage_warns_once_and_resumes(
        running_batch, monkeypatch, caplog):
    """PostgreSQL cut off (through a TCP proxy: every connection reset, new ones
    refused) while the beat runs batches.refresh_estimates at its ticks: one WARNING,
    no ERROR and no traceback, and the first tick after the database is back writes
    the estimate."""
    import logging

    from django.db import connection

    from batches.tasks import refresh_estimates
    from core import outage, transient
    from tests.faults.tcp_proxy import TcpProxy

    if connection.vendor != "postgresql":
        pytest.skip("the outage is a cut PostgreSQL connection (make test's second pass)")
    monkeypatch.setattr(outage, "_down", {})
    monkeypatch.setattr(transient._retrying, "sleep", lambda seconds: None)
    model = served_model().id
    live_workers(2, model)
    batch = running_batch(40, chunk_size=2)
    now = timezone.now()
    finish(batch, range(2), workers=["w0", "w1"], started=now - timedelta(seconds=5), seconds=2)
    real = dict(connection.settings_dict)
    proxy = TcpProxy(real["HOST"] or "127.0.0.1", int(real["PORT"] or 5432)).start()
    try:
        connection.close()
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(proxy.port))
        connection.ensure_connection()
        caplog.clear()
        proxy.cut()
        with caplog.at_level(logging.INFO):
            ticks = [refresh_estimates.apply() for _ in range(3)]
            proxy.restore()
            after = refresh_estimates.apply()
    finally:
        connection.close()
        connection.settings_dict.update(HOST=real["HOST"], PORT=real["PORT"])
        proxy.close()

    assert [tick.result for tick in ticks] == ["skipped: the database is unreachable"] * 3
    assert after.successful() and after.result == 1, after.traceback
    loud = [(r.name, r.levelname) for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == [("batchgen.outage", "WARNING")]
    assert not [r for r in caplog.records if r.exc_info]
    assert Batch.objects.get(id=batch.id).estimated_completion_at is not None


@pytest.mark.parametrize(("limit", "seconds"), [
    (16, 10 * (1 + 16 * 0.95) / 10),  # short answers, as the batches of limit 20 gave
    (400, 10 * (1 + 400 * 0.5) / 10),  # long ones, as the batch of limit 400 gave
    (None, 10 * 101 / 10),  # no limit on its lines: the model's mean cost
])
def test_a_batch_before_any_answer_is_estimated_by_its_max_tokens(running_batch, limit,
                                                                  seconds):
    """Before any of its requests finished, a batch's answers are taken to be as long
    as the model's finished batches answered for their max_tokens (eta.answer_prior),
    not as long as the model's recent mean."""
    model = served_model().id
    live_workers(1, model)
    now = timezone.now()
    for cap, output in ((20, 19), (400, 200)):
        done = running_batch(4, chunk_size=2)
        Batch.objects.filter(id=done.id).update(
            status=BatchStatus.COMPLETED, completed=4, usage_output_tokens=4 * output,
            output_limit_mean=cap, completed_at=now)
    measured_at(now, model, rate=10, cost_per_request=101)
    batch = running_batch(10, chunk_size=5)
    Batch.objects.filter(id=batch.id).update(output_limit_mean=limit)

    estimates.estimates_refresh(now)

    eta_seconds = eta_of(batch, now)
    assert eta_seconds == pytest.approx(seconds)


@pytest.mark.parametrize(("limit", "cost", "steps"), [
    (8, 101, 9),  # one plus its lines' mean max_tokens, the most it can answer
    (400, 101, 101),  # no more steps than its cost: no answer of 400 costing 101
    (None, 101, None),  # nothing known: the play shares the engine by cost
])
def test_before_the_model_has_a_history_a_request_s_steps_are_its_limit(running_batch, limit,
                                                                        cost, steps):
    """Before a model has finished a batch there is no answer prior (eta.answer_prior),
    so a batch's steps in an engine come from its own lines' output limits, the cost
    staying the model's mean (load_of): its requests' prompts are then computed at
    admission, in the slots the batch ahead frees."""
    model = served_model().id
    now = timezone.now()
    measured_at(now, model, rate=10, cost_per_request=cost)
    batch = running_batch(10, chunk_size=5)
    Batch.objects.filter(id=batch.id).update(output_limit_mean=limit)
    row = Batch.objects.values_list(*estimates.COLUMNS).get(id=batch.id)

    load = estimates.load_of(row, 10, ModelThroughput.objects.get(model=model), now, [])

    assert (load.cost, load.steps) == (cost, steps)


@pytest.mark.parametrize(("answered", "seconds"), [
    (True, 10 * (1 + (8 + 0.5 * (60 - 20)) / 2) / 10),  # its own: cached tokens left out
    (False, 10 * (1 + 20 * 0.5 + 0.5 * 30) / 10),  # as the model's finished batch took
])
def test_a_batch_s_prompt_tokens_cost_at_the_model_s_prompt_weight(running_batch, answered,
                                                                   seconds):
    """A request costs its output tokens plus its computed prompt tokens at the
    model's prompt weight: its batch's own once some answered, else as the model's
    finished batches took them (eta.prompt_prior) beside the answer-length prior."""
    model = served_model().id
    live_workers(1, model)
    now = timezone.now()
    done = running_batch(4, chunk_size=2)
    Batch.objects.filter(id=done.id).update(
        status=BatchStatus.COMPLETED, completed=4, usage_output_tokens=4 * 10,
        usage_input_tokens=4 * 30, output_limit_mean=20, completed_at=now)
    measured_at(now, model, rate=10, cost_per_request=101, prompt_weight=0.5)
    batch = running_batch(10, chunk_size=5)
    Batch.objects.filter(id=batch.id).update(output_limit_mean=20)
    if answered:  # 2 answered (their chunks' counts not yet flushed: 10 left)
        Batch.objects.filter(id=batch.id).update(completed=2, usage_output_tokens=8,
                                                 usage_input_tokens=60, usage_cached_tokens=20)

    estimates.estimates_refresh(now)

    assert eta_of(batch, now) == pytest.approx(seconds)


def test_a_model_never_fitted_costs_prompts_as_its_engines_steps_tell(running_batch):
    """Before the intervals' fit tells a prompt token's worth, and with none stored,
    the model's live workers' engines tell it from their steps
    (Worker.engine_prompt_weight): the rate is measured and the requests costed at
    it, and it is stored with the rate. A finished chunk of 2 requests of 10 tokens
    and 30 prompt tokens took 5.2 s: 26 units each at 0.5, 10 units a second; the
    running batch's requests are expected to answer 20 (their limit 40, the model
    answers half of it) with 30 prompt tokens: 36 units each. At weight 0 the rate
    would read 4.2 and the ETA 50 s."""
    model = served_model().id
    live_workers(1, model)
    Worker.objects.update(engine_prompt_weight=0.5)
    now = timezone.now()
    done = running_batch(2, chunk_size=2)
    finish(done, range(1), workers=["w0"], started=now - timedelta(seconds=60), seconds=5.2,
           output_tokens=2 * 10)
    Batch.objects.filter(id=done.id).update(status=BatchStatus.COMPLETED, usage_input_tokens=60,
                                            output_limit_mean=20, completed_at=now)
    batch = running_batch(10, chunk_size=5)
    Batch.objects.filter(id=batch.id).update(output_limit_mean=40)

    estimates.estimates_refresh(now)

    assert ModelThroughput.objects.get(model=model).prompt_weight == 0.5
    assert eta_of(batch, now) == pytest.approx(10 * 36 / 10)


@pytest.mark.parametrize(("fitted", "stored", "told", "weight"), [
    (0.3, 0.2, [0.9], 0.3),  # the intervals' fit first
    (None, 0.2, [0.9], 0.2),  # then the last one stored
    (None, 0.0, [0.9, 0.5, 0.7], 0.7),  # never fitted: the engines' median
    (None, None, [0.6, None], 0.6),  # nothing stored: the same
    (None, None, [None], 0.0),  # no engine tells: prompts cost nothing
])
def test_a_prompt_token_s_worth_is_the_fit_then_the_stored_then_the_engines(
        monkeypatch, fitted, stored, told, weight):
    progress = estimates.Progress()
    monkeypatch.setattr(progress, "prompt_weight", lambda model: fitted)
    monkeypatch.setattr(estimates, "PROGRESS", progress)
    row = None if stored is None else ModelThroughput(model="m", rate=1, prompt_weight=stored)
    workers = {f"w{n}": fleet_selectors.WorkerWork(8, 0, 0, 0, 0, prompt_weight=seen)
               for n, seen in enumerate(told)}
    assert estimates.prompt_weight("m", row, workers) == weight


@pytest.mark.parametrize(("limit_done", "seconds"), [
    (4 * 8, (6 + (16 * 10 - 32)) / 10),  # the short ones done: the rest by their limits
    (4 * 16, 6 * (1 + 8) / 10),  # done ones of the mean limit: the mean so far
    (0, 6 * (1 + 8) / 10),  # no limits counted: the mean so far
])
def test_a_running_batch_s_requests_left_are_costed_by_their_limits(running_batch,
                                                                    limit_done, seconds):
    """A batch of max_tokens 8 to 24 whose 4 short ones are done (answered to their
    limit, 8 each): its 6 left answer 128 tokens between them, not 6 times 8
    (eta.left_output)."""
    model = served_model().id
    live_workers(1, model)
    now = timezone.now()
    measured_at(now, model, rate=10)
    batch = running_batch(10, chunk_size=5)
    Chunk.objects.filter(batch=batch, index=0).update(completed=4)
    Batch.objects.filter(id=batch.id).update(completed=4, usage_output_tokens=4 * 8,
                                             output_limit_mean=16,
                                             output_limit_done=limit_done)

    estimates.estimates_refresh(now)

    assert eta_of(batch, now) == pytest.approx(seconds)


@pytest.mark.usefixtures("whole")
def test_a_batch_whose_work_all_runs_already_ends_with_its_running_chunks(running_batch):
    """Chunks in flight keep their worker whatever the shares: a batch with nothing
    left to dispatch ends when its last chunk closes on the worker holding it, not at
    its fair share of the model behind three other batches."""
    model = served_model().id
    live_workers(2, model)
    small = running_batch(4, chunk_size=2)
    others = [running_batch(10, chunk_size=2) for _ in range(3)]
    now = timezone.now()
    measured_at(now, model, rate=2)  # 1 request a second a worker
    running_on("w0", small, 0, now)
    running_on("w1", small, 1, now)

    estimates.estimates_refresh(now)

    assert eta_of(small, now) == pytest.approx(2.0)  # 2 requests at 1/s on each worker
    assert all(Batch.objects.get(id=other.id).estimated_completion_at for other in others)


def test_a_batch_not_yet_dispatched_waits_for_the_broker_s_window_ahead_of_it(running_batch):
    model = served_model().id
    live_workers(1, model)
    running_batch(10, chunk_size=2)  # ahead: all of its chunks in the broker's window
    late = not_dispatched(running_batch(4, chunk_size=2))
    now = timezone.now()
    measured_at(now, model, rate=2)

    estimates.estimates_refresh(now)

    # The worker serves the 10 requests ahead (5 s), then its 4 (2 s); a fluid
    # split of the model would say 4 s.
    assert eta_of(late, now) == pytest.approx(5 + 2)


@pytest.mark.usefixtures("whole")
def test_chunks_held_by_a_busy_worker_wait_for_it_while_another_is_idle(running_batch):
    """A worker serves the chunks it holds one after another, in the order it
    claimed them; an idle worker cannot take them over."""
    model = served_model().id
    live_workers(2, model)
    first, held = running_batch(2, chunk_size=2), running_batch(4, chunk_size=2)
    now = timezone.now()
    measured_at(now, model, rate=2)  # 1 request a second a worker
    running_on("w0", first, 0, now - timedelta(seconds=2))
    running_on("w0", held, 1, now - timedelta(seconds=1))
    running_on("w0", held, 0, now)

    estimates.estimates_refresh(now)

    # w0 serves 2 + 2 + 2 requests; w1, idle, would have halved it.
    assert eta_of(first, now) == pytest.approx(2)
    assert eta_of(held, now) == pytest.approx(6)


def test_the_requests_a_worker_runs_are_spread_by_their_admission(running_batch):
    """A worker's two requests of a unit each (2 a second) are read halfway between
    half and all of their step left (eta.IN_ENGINE_SPREAD): 0.75 s."""
    model = served_model().id
    live_workers(1, model)
    batch = running_batch(2, chunk_size=2)
    now = timezone.now()
    measured_at(now, model, rate=2)
    running_on("w0", batch, 0, now - timedelta(seconds=1))

    estimates.estimates_refresh(now)

    assert eta_of(batch, now) == pytest.approx(0.75)


@pytest.mark.usefixtures("whole")
def test_a_chunk_whose_requests_are_all_in_the_engine_ends_when_its_longest_has(
        running_batch):
    """The worker's heartbeat names the requests of each chunk in its engine and the
    most tokens one may still generate (Worker.chunk_tails). Its two requests of 100
    steps (99 output tokens, 100 cost units each) in its two slots take 10 s from
    their start at 20 units a second; with 29 tokens at most left (30 steps), they
    end evenly up to the longest's 30 steps, at 15 and 30: 45 units, 2.25 s; told of
    more steps than a whole request's (a limit above the answers), up to a whole
    request's, at 50 and 100: 7.5 s. Told of only one of them, or of one without a
    limit, the chunk is read whole."""
    model = served_model().id
    live_workers(1, model)
    batch = running_batch(4, chunk_size=2)
    now = timezone.now()
    finish(batch, range(1), workers=["w0"], started=now - timedelta(seconds=20), seconds=10,
           output_tokens=2 * 99)
    running_on("w0", batch, 1, now)
    key = f"{batch.id}-1"
    etas = []
    for tails in ({}, {key: [1, 29]}, {key: [2, None]}, {key: [2, 29]}, {key: [2, 500]}):
        Worker.objects.filter(name="w0").update(chunk_tails=tails)
        estimates.estimates_refresh(now)
        etas.append(eta_of(batch, now))

    assert ModelThroughput.objects.get(model=model).rate == pytest.approx(20)
    assert etas == pytest.approx([10, 10, 10, 2.25, 7.5])


def test_the_play_hears_which_requests_in_an_engine_have_a_token():
    """OpenChunks.dispatch reads each worker's chunk tails into Held.started, by
    the chunk's place in its claim order: the requests of a chunk in the engine that
    have generated a token, none where its chunk is missing from a worker that
    tells. None from a worker whose engine tells nothing (no tails), or from one of
    an older version (tails of two)."""
    from batches.eta import Load

    open_chunks = estimates.OpenChunks(
        left={"a": 8, "b": 4}, running=[("w0", "a", 4, 0), ("w0", "b", 4, 0),
                                        ("w1", "a", 4, 1), ("w2", "a", 0, 2)])
    loads = [Load("a", 16.0, cost=2.0), Load("b", 4.0)]
    tails = {"w0": {"a-0": [4, 7, 3]}, "w1": {}, "w2": {"a-2": [1, 3]}}
    state = open_chunks.dispatch(loads, {"w0": 8, "w1": 8, "w2": 8}, {}, tails)

    assert [held.chunks for held in state.workers] == [
        (("a", 8.0), ("b", 4.0)), (("a", 8.0),), (("a", 0.0),)]
    assert [held.started for held in state.workers] == [{0: 3.0}, None, None]
    assert state.workers[0].left_steps == {0: 8.0}


def observed():
    """A fresh Progress, `at(seconds, **workers)` showing it each worker's (model,
    busy seconds, requests, prompt tokens computed, tokens generated) that many
    seconds after the start."""
    start, progress = timezone.now(), estimates.Progress()

    def at(seconds: float, **workers) -> None:
        figures: dict = {}
        for name, (model, *seen) in workers.items():
            figures.setdefault(model, {})[name] = fleet_selectors.WorkerWork(8, *seen)
        progress.observe(start + timedelta(seconds=seconds), figures)

    return progress, at


def test_progress_counts_the_work_in_flight_and_not_a_warm_up():
    """Progress.rate: the cost units the workers did between refreshes over the
    seconds they held requests, summed over the model's workers, the first silence
    (an engine warming up) left out, and nothing until PROGRESS_MIN seconds are in."""
    progress, at = observed()

    at(0, w0=("m", 0, 0, 0, 0))
    at(5, w0=("m", 5, 0, 0, 0))  # warming up: not the rate
    at(10, w0=("m", 10, 5, 0, 5))  # 5 requests of 1 token: 10 units in 5 s
    assert progress.rate("m") is None  # 5 s in, PROGRESS_MIN is 10
    # w0 did 10 more units in its 2 s before it went idle; w1, seen for the first
    # time, is left out this once.
    at(15, w0=("m", 12, 10, 0, 10), w1=("m", 3, 10, 0, 10))
    assert progress.rate("m") == pytest.approx((10 + 10) / (5 + 2))
    at(20, w0=("m", 12, 10, 0, 10), w1=("m", 8, 10, 0, 10))  # a stall counts: 5 s of w1
    assert progress.rate("m") == pytest.approx((10 + 10) / (5 + 2 + 5))
    assert progress.rate("other") is None
    late = 20 + estimates.PROGRESS_SECONDS + 6
    at(late, w0=("m", 12, 10, 0, 10), w1=("m", 14, 20, 0, 30))  # the older ones are forgotten
    assert progress.rate("m") == pytest.approx(30 / 6)
    # Idle for longer than PROGRESS_SECONDS (swapped out, say): no stale rate, and
    # the next warm-up is left out again.
    idle = late + estimates.PROGRESS_SECONDS + 1
    at(idle, w0=("m", 12, 10, 0, 10))
    assert progress.rate("m") is None
    at(idle + 10, w0=("m", 22, 10, 0, 10))  # warming up
    at(idle + 20, w0=("m", 32, 20, 0, 30))
    assert progress.rate("m") == pytest.approx(30 / 10)


def test_progress_fits_a_prompt_token_s_cost_from_what_the_workers_say_they_did():
    """The workers' own figures between refreshes, summed per model, fit a prompt
    token at a quarter of an output token (B = 0.1 D + 0.025 P): 10 requests of 4
    tokens and 100 prompt tokens each in 30 s, then 10 of 19 and 20 in 25 s, then
    both workers 10 of the first kind in 30 s each; at that weight the rate is 10
    units a second throughout. A worker seen for the first time, one that changed
    model (a swap) and one whose figures went back (its engine's figures started
    afresh) are left out that once."""
    progress, at = observed()

    at(0, w0=("m", 0, 0, 0, 0))
    at(30, w0=("m", 30, 10, 1000, 40), w1=("m", 0, 0, 0, 0))
    assert progress.prompt_weight("m") is None  # one mix: a prompt token's worth is not told
    at(55, w0=("m", 55, 20, 1200, 230), w1=("m", 0, 0, 0, 0))
    at(85, w0=("m", 85, 30, 2200, 270), w1=("m", 30, 10, 1000, 40))
    assert progress.prompt_weight("m") == pytest.approx(0.25)
    assert progress.rate("m", prompt_weight=0.25) == pytest.approx(10.0)
    assert progress.rate("m") == pytest.approx((50 + 200 + 100) / 115)  # prompts uncounted
    fitted = progress.fits["m"].n

    # w0 now holds another model; w1's figures went back; w2 is new: no interval.
    at(95, w0=("other", 95, 40, 9000, 300), w1=("m", 5, 1, 10, 1), w2=("m", 9, 9, 9, 9))
    assert progress.fits["m"].n == fitted
    assert progress.prompt_weight("other") is None


def test_the_rate_of_a_worker_running_chunks_side_by_side_counts_what_is_in_flight(
        running_batch):
    """A worker with many slots runs several chunks at once: between two refreshes
    it did 20 requests in 10 s, which is one worker's rate (a second live worker
    held nothing), though the one chunk that closed took 20 s for its 20."""
    model = served_model().id
    live_workers(2, model)
    batch = running_batch(60, chunk_size=20)
    now = timezone.now()
    finish(batch, range(1), workers=["w0"], started=now - timedelta(seconds=30), seconds=20)
    for index in (1, 2):
        running_on("w0", batch, index, now - timedelta(seconds=10))
    worked("w0", busy=20, requests=20)
    estimates.estimates_refresh(now - timedelta(seconds=10))
    worked("w0", busy=30, requests=40)

    estimates.estimates_refresh(now)

    assert ModelThroughput.objects.get(model=model).rate == pytest.approx(2.0 * 2)


def test_before_any_chunk_closed_the_rate_leaves_the_engine_s_warm_up_out(running_batch):
    """A fresh engine answers nothing for a while: the worker held requests for 30 s
    and did its 10 in the last 5 s, so the rate is 2 a second, not 10 in 30 s."""
    model = served_model().id
    live_workers(1, model)
    batch = running_batch(40, chunk_size=20)
    now = timezone.now()
    running_on("w0", batch, 0, now - timedelta(seconds=30))
    for seconds in (15, 10, 5):  # warming up
        worked("w0", busy=30 - seconds, requests=0)
        estimates.estimates_refresh(now - timedelta(seconds=seconds))
    worked("w0", busy=30, requests=10)
    Chunk.objects.filter(batch=batch, index=0).update(completed=10)
    Batch.objects.filter(id=batch.id).update(completed=10)

    estimates.estimates_refresh(now)

    assert ModelThroughput.objects.get(model=model).rate == pytest.approx(2.0)


def test_before_any_chunk_closed_a_late_start_of_progress_does_not_lower_the_rate(
        running_batch):
    """A control worker that started late saw 1 request in its 2 s; the chunk did 11
    in the 10 s since its claim: the higher, 1.1 a second, is the rate."""
    model = served_model().id
    live_workers(1, model)
    batch = running_batch(40, chunk_size=20)
    now = timezone.now()
    running_on("w0", batch, 0, now - timedelta(seconds=10))
    for seconds, done in ((2, 10), (1, 11), (0, 11)):
        worked("w0", busy=10 - seconds, requests=done)
        Chunk.objects.filter(batch=batch, index=0).update(completed=done)
        Batch.objects.filter(id=batch.id).update(completed=done)
        estimates.estimates_refresh(now - timedelta(seconds=seconds))

    assert ModelThroughput.objects.get(model=model).rate == pytest.approx(1.1)
