"""The refresh's plays recorded for replay (BATCHGEN_ETA_RECORD, batches/eta_record.py):
what is written plays again to the ETAs the refresh wrote. Run on PostgreSQL too."""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import importlib.util
import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from batches import estimates, eta, eta_record
from batches.models import Batch
from fleet.models import Worker
from serving.model_info import served_model
from tests.batches.test_estimates import (
    eta_of,
    finish,
    live_workers,
    not_dispatched,
    running_on,
    worked,
)

# The plays here are whole requests', read by hand (conftest's `whole`).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("whole")]


def test_a_refresh_s_play_is_recorded_and_plays_again_to_the_etas_it_wrote(
        running_batch, settings, tmp_path):
    """Two workers: one runs a chunk whose requests are all in its engine (its steps
    left told), the other a chunk it tells nothing of; a third batch waits
    in the database. Each refresh appends one line for the model, whose play is the
    ETAs written, and which this checkout's play makes again from the line alone."""
    settings.BATCHGEN_ETA_RECORD = str(tmp_path / "plays.jsonl")
    model = served_model().id
    live_workers(2, model)
    first, second = running_batch(6, chunk_size=2), running_batch(4, chunk_size=2)
    waiting = not_dispatched(running_batch(8, chunk_size=2))
    now = timezone.now()
    finish(first, range(1), workers=["w0"], started=now - timedelta(seconds=20), seconds=10,
           output_tokens=2 * 99)
    running_on("w0", first, 1, now)
    running_on("w1", second, 0, now - timedelta(seconds=2))
    Worker.objects.filter(name="w0").update(chunk_tails={f"{first.id}-1": [2, 29, 2]})

    estimates.estimates_refresh(now)
    written = {batch.id: eta_of(batch, now) for batch in (first, second, waiting)}
    worked("w1", busy=5, requests=2, prompt=100, output=40)  # over the next 5 s
    estimates.estimates_refresh(now + timedelta(seconds=5))

    plays = eta_record.read(settings.BATCHGEN_ETA_RECORD)
    assert [(one.at, one.model) for one in plays] == [
        (now.timestamp(), model), ((now + timedelta(seconds=5)).timestamp(), model)]
    one = plays[0]
    assert one.played == pytest.approx(written, abs=1e-3)
    assert one.replay() == pytest.approx(one.played)
    held = {held.chunks[0][0]: held for held in one.state.workers}
    assert held[first.id].left_steps == {0: 30.0}  # the tails told, read back as ints
    assert held[second.id].left_steps == {}
    assert held[first.id].started == {0: 2.0}  # both of its requests have a token
    assert held[second.id].started is None  # w1's engine tells nothing
    assert one.state.pending == {waiting.id: (4, 8)}
    assert {load.batch_id for load in one.loads} == {first.id, second.id, waiting.id}
    assert one.prompt_weight == 0.0 and one.spans == ()  # nothing measured before it
    assert plays[1].spans == ((now.timestamp(), (now + timedelta(seconds=5)).timestamp(),
                               42.0, 100.0, 5.0),)


def test_a_recording_of_another_version_reads_what_this_one_knows(tmp_path):
    """A load or a worker field this version lacks is left out; one the recording
    lacks takes its default."""
    path = tmp_path / "plays.jsonl"
    eta_record.write(path, eta_record.Recorded(
        at=1.0, model="m", one=1.0, rate=1.0, delay=0.0, policy=False,
        loads=(eta.Load(batch_id="a", remaining=4.0, chunk=2.0),),
        state=eta.Dispatch(workers=(eta.Held(threads=1, chunks=(("a", 2.0),), slots=1),),
                           pending={"a": (1, 2)}),
        played={"a": 4.0}))
    lines = path.read_bytes().replace(b'"steps":null', b'"steps":null,"gone":1')
    path.write_bytes(lines.replace(b'"slots":1,', b""))
    assert b'"gone":1' in lines and b'"slots"' not in path.read_bytes()

    (one,) = eta_record.read(path)

    assert one.loads[0] == eta.Load(batch_id="a", remaining=4.0, chunk=2.0)
    assert one.state.workers[0].slots == dataclasses.fields(eta.Held)[2].default == 1
    assert one.replay() == pytest.approx({"a": 4.0})
    assert Batch.objects.count() == 0


def test_a_recording_that_cannot_be_written_is_said_once_and_costs_no_eta(
        running_batch, settings, tmp_path, caplog):
    """A path in no directory: the refreshes write their ETAs as without the
    setting, and one WARNING names the setting."""
    settings.BATCHGEN_ETA_RECORD = str(tmp_path / "gone" / "plays.jsonl")
    model = served_model().id
    live_workers(1, model)
    batch = running_batch(4, chunk_size=2)
    now = timezone.now()
    finish(batch, range(1), workers=["w0"], started=now - timedelta(seconds=20), seconds=10)

    estimates.estimates_refresh(now)
    estimates.estimates_refresh(now + timedelta(seconds=5))

    assert eta_of(batch, now) > 0
    said = [r for r in caplog.records if "BATCHGEN_ETA_RECORD" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING"]
    assert not (tmp_path / "gone").exists()


def test_a_gzipped_recording_reads_as_the_plain_one(tmp_path):
    """The runs kept in benchmarks/results/eta-recordings are gzip'd."""
    path = tmp_path / "plays.jsonl"
    for at in (1.0, 6.0):
        eta_record.write(path, eta_record.Recorded(
            at=at, model="m", one=2.0, rate=2.0, delay=0.0, policy=True,
            loads=(eta.Load(batch_id="a", remaining=4.0, chunk=2.0, time_left=60.0),),
            state=eta.Dispatch(workers=(eta.Held(threads=1),), pending={"a": (2, 4)}),
            played={"a": 2.0}, spans=((0.0, 1.0, 2.0, 3.0, 1.0),)))
    zipped = tmp_path / "plays.jsonl.gz"
    zipped.write_bytes(gzip.compress(path.read_bytes()))

    assert eta_record.read(zipped) == eta_record.read(path)
    assert [one.at for one in eta_record.read(zipped)] == [1.0, 6.0]


@pytest.mark.parametrize(("change", "left", "written"), [
    (0.5, 10.0, False),      # under a second
    (1.0, 10.0, True),
    (-1.0, 10.0, True),      # earlier as well as later
    (50.0, 86400.0, False),  # a day away: under 1 % of it
    (900.0, 86400.0, True),
])
def test_an_estimate_is_written_again_once_it_moved_a_second_and_1_percent(change, left,
                                                                           written):
    """The rule the refresh writes by (eta.moved), which the replay applies too."""
    assert eta.moved(change, left) is written


def replay_script(name: str = "eta_replay"):
    """benchmarks/eta_replay.py (or another of its scripts), as a module."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_replay_tells_a_run_s_ticks_and_admissions_from_its_other_refreshes():
    """`eta_replay.py --ticks-only` reads a run as a server refreshing only on its tick
    and at admissions would have shown it: the refreshes on the 5 s cadence (taken up
    again after a gap with nothing running), and the first to play each batch."""
    def refresh(at: float, *batches: str) -> eta_record.Recorded:
        return eta_record.Recorded(at=at, model="m", one=1.0, rate=1.0, delay=0.0,
                                   policy=False, loads=(), state=eta.Dispatch(workers=()),
                                   played=dict.fromkeys(batches, 1.0))

    ticks = [100.0, 105.02, 110.01, 135.3, 140.28]  # nothing ran from 111 to 135
    closes = [101.2, 106.0, 110.3, 141.0]  # 110.3: near the tick, the tick nearer
    admitted = 107.5  # the first play of batch b
    recorded = [refresh(at, "a") for at in ticks + closes] + [refresh(admitted, "a", "b")]

    assert replay_script().ticks_and_admissions(recorded) == {*ticks, admitted}


def test_the_replay_s_oracle_plays_each_refresh_at_the_rate_its_workers_went_on_to_do():
    """`eta_replay.py --future-rate S`: a refresh's rates scaled by what the intervals
    recorded after it did over the next S seconds against its own intervals, each at
    that refresh's prompt weight; one with nothing recorded after it stays."""
    def refresh(at: float, spans: tuple) -> eta_record.Recorded:
        return eta_record.Recorded(
            at=at, model="m", one=2.0, rate=4.0, delay=0.0, policy=False,
            loads=(eta.Load(batch_id="a", remaining=8.0),),
            state=eta.Dispatch(workers=(eta.Held(threads=1, chunks=(("a", 8.0),)),)),
            played={"a": 4.0}, prompt_weight=0.5, spans=spans)

    before = (-5.0, 0.0, 6.0, 8.0, 5.0)  # (6 + 0.5 * 8) / 5 = 2 units a worker-second
    after = (0.0, 5.0, 16.0, 8.0, 5.0)  # (16 + 4) / 5 = 4
    beyond = (5.0, 20.0, 60.0, 0.0, 10.0)  # ends past the next 10 s: not counted
    recorded = [refresh(0.0, (before,)), refresh(5.0, (before, after)),
                refresh(20.0, (after, beyond))]

    first, second, last = replay_script().future_rates(recorded, 10.0)

    assert (first.one, first.rate) == pytest.approx((4.0, 8.0))
    assert first.replay() == pytest.approx({"a": 2.0})  # twice as fast: half the time
    assert second == recorded[1]  # `beyond` ends 15 s after it
    assert last == recorded[2]  # nothing after it


def test_the_replay_gives_unknown_steps_the_limits_of_the_batches_made_again_from_the_seed():
    """`eta_replay.py --limits-from-seed`: a run's batches are made again from its
    seed and workload options (eta.workload) and matched to the run's in the order
    they were created, by size; a load of unknown steps then takes one plus its
    batch's mean max_tokens (its cost at most), as estimates.load_of now gives it;
    other options than the run's are refused."""
    replay = replay_script()
    options = argparse.Namespace(seed=0, batches=3, largest=80, arrivals=100.0, kinds=[8, 16])
    made = sorted(replay.workload(argparse.Namespace(**{**vars(options), "seed": 7})))
    caps = [[json.loads(line)["body"]["max_tokens"] for line in body.splitlines()]
            for *_, body in made]
    polled = [replay.Watched(id=f"b{n}", key=0, created=at,
                             samples=[(at, "completed", len(lines), len(lines), None)])
              for n, (at, lines) in enumerate(zip([at for at, *_ in made], caps, strict=True))]

    limits = replay.seed_limits("/tmp/rec/run-this-s7", polled[::-1], options)

    assert limits == {f"b{n}": sum(lines) / len(lines) for n, lines in enumerate(caps)}
    loads = (eta.Load("b0", 100.0, cost=200.0), eta.Load("b1", 100.0, cost=5.0),
             eta.Load("b2", 100.0, cost=200.0, steps=3.0))
    recorded = eta_record.Recorded(at=0.0, model="m", one=1.0, rate=1.0, delay=0.0,
                                   policy=False, loads=loads, state=eta.Dispatch(workers=()),
                                   played={})
    steps = [load.steps for load in replay.with_limits([recorded], limits)[0].loads]
    assert steps == [1 + limits["b0"], 5.0, 3.0]  # its cost at most; a known one stays
    with pytest.raises(SystemExit, match="not seed 7's"):
        replay.seed_limits("/tmp/rec/run-this-s7", polled,
                           argparse.Namespace(**{**vars(options), "largest": 90}))


def test_the_replay_plays_a_run_again_without_the_requests_started():
    """`eta_replay.py --without-started`: the workers' word on which requests in
    their engines have a token left out, so a run recorded with it is played as
    the code before it played every request in the slots, side by side. 4 requests
    in the engine (2 steps and a prompt of 2 units each), 1 with a token: the
    prompts of the other 3 (6 units) come first, or not at all without it."""
    held = eta.Held(threads=1, chunks=(("a", 16.0),), slots=4, left_steps={0: 2.0},
                    started={0: 1.0})
    recorded = eta_record.Recorded(
        at=0.0, model="m", one=1.0, rate=1.0, delay=0.0, policy=False,
        loads=(eta.Load("a", 16.0, cost=4.0, steps=2.0),),
        state=eta.Dispatch(workers=(held,)), played={})

    before, = replay_script().without_started([recorded])

    assert before.state.workers[0].started is None
    assert before.state.workers[0].left_steps == {0: 2.0}  # the rest as recorded
    assert recorded.replay()["a"] == pytest.approx(before.replay()["a"] + 6.0)


def test_the_replay_stands_in_for_the_requests_started_in_older_recordings():
    """`eta_replay.py --unstarted N`: a refresh recorded before the workers told
    which requests in their engines have a token gets each worker's last N requests
    in its slots, as the play places them (claim order, the slots filled), without
    one; a worker that told it keeps its word. 4 slots: chunk a's 3 requests
    (2 units each) and 1 of b's 2 (4 units each) are in; the last 2 of those
    have no token."""
    loads = (eta.Load("a", 6.0, cost=2.0, steps=1.0), eta.Load("b", 8.0, cost=4.0, steps=1.0))
    older = eta.Held(threads=2, chunks=(("a", 6.0), ("b", 8.0)), slots=4)
    told = eta.Held(threads=1, chunks=(("a", 6.0),), slots=4, started={0: 3.0})
    recorded = eta_record.Recorded(at=0.0, model="m", one=1.0, rate=2.0, delay=0.0,
                                   policy=False, loads=loads,
                                   state=eta.Dispatch(workers=(older, told)), played={})

    stood, = replay_script().with_unstarted([recorded], 2.0)

    assert [held.started for held in stood.state.workers] == [{0: 2.0, 1: 0.0}, {0: 3.0}]


def test_the_replay_s_interval_resamples_whole_runs():
    """A pooled median's interval by runs: a run of one reading counts as a run, so
    its reading is the pooled median whenever it is drawn twice (a quarter of the
    draws here), which resampling readings one by one would hide."""
    interval = replay_script().run_interval  # benchmarks/eta.py's, as the replay imports it

    assert interval([[0.0] * 9, [1.0]]) == (0.0, 1.0)
    assert interval([[0.1, 0.1, 0.1], [0.1, 0.1]]) == pytest.approx((0.1, 0.1))
    assert interval([[0.1, 0.2], []]) is None  # one run with readings: no interval


def test_a_twin_run_s_time_left_is_read_at_the_same_points_and_scaled_by_its_speed():
    """benchmarks/eta_twins.py: a batch's seconds from each point's first poll to its
    end in one run, predicted by the same in its twin (the same seed), as is and at
    the run's speed (the median ratio of the batches' create-to-end times); a reading
    within MIN_LEFT of the end and a batch that did not complete give none."""
    twins = replay_script("eta_twins")

    def run(pace: float, *, tail: float = 0.0) -> list:
        polled = [(pace * at, "in_progress", done, 10, None)
                  for at, done in ((1, 0), (10, 1), (20, 3), (30, 5))]
        done = twins.Watched(id="a", key=0, created=0.0, samples=polled,
                             final={"status": "completed", "completed_at": pace * 50 + tail})
        failed = twins.Watched(id="b", key=0, created=0.0, samples=polled,
                               final={"status": "failed", "completed_at": None})
        return [done, failed]

    fast, slow = run(1.0), run(2.0)

    assert twins.left_at_points(fast[0]) == {"queued": 49, "10%": 40, "25%": 30, "50%": 20}
    assert twins.left_at_points(fast[1]) == {}
    assert twins.speed(fast, slow) == 0.5
    assert twins.twin_errors(fast, slow) == {"queued": [1.0],
                                             "10%": [1.0], "25%": [1.0], "50%": [1.0]}
    assert twins.twin_errors(fast, slow, 0.5) == {point: [pytest.approx(0.0)]
                                                  for point in ("queued", "10%", "25%", "50%")}
    late = run(1.0, tail=-16.0)  # its 50 % reading 4 s before the end: left out
    assert twins.twin_errors(late, fast)["50%"] == []
    assert twins.twin_errors(late, fast)["25%"] == [pytest.approx(16 / 14)]


def test_twin_runs_tell_whether_the_eta_errs_on_the_same_batches_the_same_way():
    """eta_twins.repeated: the rank correlation of the API's signed ETA errors at a
    point, batch by batch, between two runs of one seed; None under three batches."""
    twins = replay_script("eta_twins")

    def run(*etas: float) -> list:
        # each batch half done at 10 s, its end at 110 s: signed error (ETA - 110) / 100
        return [twins.Watched(id=str(i), key=0, created=0.0,
                              samples=[(10.0, "in_progress", 5, 10, eta)],
                              final={"status": "completed", "completed_at": 110.0})
                for i, eta in enumerate(etas)]

    run_a = run(100.0, 110.0, 150.0)  # -0.1, 0.0, +0.4
    assert [round(e["50%"], 2) for e in twins.signed_errors(run_a)] == [-0.1, 0.0, 0.4]
    assert twins.repeated(run_a, run(105.0, 120.0, 125.0), "50%") == pytest.approx(1.0)
    assert twins.repeated(run_a, run(130.0, 111.0, 90.0), "50%") == pytest.approx(-1.0)
    assert twins.repeated(run_a[:2], run(105.0, 120.0), "50%") is None
