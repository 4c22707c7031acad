"""The ETA model (batches/eta.py) and the deadline policy (batches/deadlines.py) on
their own: pure functions, a table of cases each."""

from __future__ import annotations

from collections import Counter

import pytest

from batches import eta
from batches.deadlines import at_risk, deadline_shares, late
from batches.eta import (
    PROMPT_WEIGHT_MAX,
    Dispatch,
    Held,
    Load,
    PromptFit,
    answer_prior,
    busy_seconds,
    chunk_finish_times,
    fair_finish_times,
    fair_shares,
    finish_times,
    left_output,
    measured_rate,
    request_steps,
    service_rate,
)

DAY = 86400.0


def test_one_batch_alone_finishes_after_its_work_over_the_rate():
    assert finish_times([Load("a", 1000)], rate=10) == {"a": pytest.approx(100)}


def test_equal_batches_share_the_model_and_a_small_one_finishes_first():
    finish = finish_times([Load("big", 1000), Load("small", 100)], rate=10)

    # Both run at 5/s until the small one is done (20 s), then the big one alone.
    assert finish == {"small": pytest.approx(20), "big": pytest.approx(110)}


def test_a_batch_that_arrives_on_the_way_takes_its_share_from_then():
    finish = finish_times([Load("a", 1000, owner=1)], rate=10,
                          arrivals=[(50.0, Load("b", 1000, owner=2))])

    # a runs alone at 10/s for 50 s (500 left), then both at 5/s: a is done at
    # 150 s, and b (500 left then) does its last 500 alone at 10/s.
    assert finish == {"a": pytest.approx(150), "b": pytest.approx(200)}


def test_a_batch_arriving_on_an_idle_model_starts_when_it_comes():
    finish = finish_times([Load("a", 100)], rate=10, arrivals=[(30.0, Load("b", 100))])

    assert finish == {"a": pytest.approx(10), "b": pytest.approx(40)}


def test_a_key_s_other_batch_inherits_its_share_when_one_finishes():
    loads = [Load("a1", 100, owner=1), Load("a2", 1000, owner=1), Load("b", 1000, owner=2)]

    finish = finish_times(loads, rate=10)

    # Keys 1 and 2 get 5/s each; a1 and a2 split key 1's, so a1 is done at 40 s.
    # Then a2 (900 left) and b (800 left) run at 5/s each: b done at 200 s, and a2
    # does its last 100 alone at 10/s.
    assert finish["a1"] == pytest.approx(40)
    assert finish["b"] == pytest.approx(200)
    assert finish["a2"] == pytest.approx(210)


def test_weights_and_priorities_set_the_split():
    assert fair_shares([Load("a", 1, owner=1, weight=2), Load("b1", 1, owner=2),
                        Load("b2", 1, owner=2, priority=3)]) == {
        "a": 2.0, "b1": 0.25, "b2": 0.75}


@pytest.mark.parametrize("loads", [
    [Load("a", 500), Load("b", 100, priority=3), Load("c", 50)],
    [Load("a", 500, owner=1), Load("b", 100, owner=2, weight=3)],
])
def test_the_quick_play_agrees_with_the_event_play(loads):
    slow, quick = finish_times(loads, rate=7), fair_finish_times(loads, rate=7)

    assert quick == pytest.approx(slow)


HISTORY = [(20.0, 19.0, 100), (400.0, 200.0, 100), (450.0, 180.0, 300)]


@pytest.mark.parametrize(("history", "limit", "expected"), [
    (HISTORY, 16, 16 * 0.95),  # only the batch of limit 20 is near 16
    (HISTORY, 400, 400 * (0.5 * 100 + 0.4 * 300) / 400),  # 400 and 450, by requests
    (HISTORY, 100, 100 * (0.95 * 100 + 0.5 * 100 + 0.4 * 300) / 500),  # none near: all
    (HISTORY, None, None),  # lines without a limit: no prior
    ([], 64, None),  # nothing finished yet
])
def test_the_answer_prior_scales_finished_batches_answers_to_the_limit(history, limit,
                                                                        expected):
    assert answer_prior(history, limit) == (None if expected is None
                                            else pytest.approx(expected))


@pytest.mark.parametrize(("done", "left", "tokens", "limit_done", "limit_mean", "expected"), [
    # 4 of 10 done, the short ones (limits 8 of a mean 16), answered to their limits:
    # the 6 left hold 160 - 32 limit tokens, answered alike
    (4, 6, 32, 32, 16.0, (160 - 32) / 6),
    # done ones of the mean limit, answered at half of it: the mean so far
    (4, 6, 32, 64, 16.0, 8.0),
    # the long ones done first (answers of a limit 24 at 3 / 4): the rest at 3 / 4 of 12
    (5, 5, 90, 120, 18.0, 0.75 * 12),
    # the limits left reckoned below none (a line's limit over the mean): none
    (4, 6, 32, 200, 16.0, 0.0),
    (4, 6, 32, 0, 16.0, None),  # no limit counted (older workers): no answer
    (4, 6, 32, 32, None, None),  # lines without a limit
    (0, 10, 0, 0, 16.0, None),  # nothing done yet: the prior's to say
    (10, 0, 80, 160, 16.0, None),  # nothing left
])
def test_the_requests_left_are_costed_by_their_limits_left(done, left, tokens, limit_done,
                                                            limit_mean, expected):
    got = left_output(done, left, tokens, limit_done, limit_mean)
    assert got == (None if expected is None else pytest.approx(expected))


def test_busy_time_leaves_idle_gaps_out():
    assert busy_seconds([(0, 10), (5, 15), (20, 30)]) == 25


# --- the deadline policy: a table of cases -----------------------------------------------

# (name, loads, rate, expected): expected is "fair" (the fair shares unchanged) or
# the batches whose finish, played under the policy, lies inside their windows.
CASES = [
    ("every window kept: fair share unchanged",
     [Load("a", 1000, time_left=DAY), Load("b", 1000, time_left=DAY)], 10, "fair"),
    ("no windows at all: fair share",
     [Load("a", 1000), Load("b", 10)], 10, "fair"),
    ("a short window behind two long batches is kept, and theirs too",
     [Load("long1", 1000, time_left=DAY), Load("long2", 1000, time_left=DAY),
      Load("short", 100, time_left=15)], 10, {"long1", "long2", "short"}),
    ("two late batches: least slack served first, both kept when capacity allows",
     [Load("long", 5000, time_left=DAY), Load("s1", 100, time_left=24),
      Load("s2", 100, time_left=25)], 10, {"long", "s1", "s2"}),
    ("a long batch with a tight window is not broken to save a hopeless one",
     [Load("tight", 900, time_left=100), Load("hopeless", 1000, time_left=50)], 10,
     {"tight"}),
]


@pytest.mark.parametrize("name, loads, rate, expected", CASES, ids=[c[0] for c in CASES])
def test_deadline_policy(name, loads, rate, expected):
    shares = deadline_shares(loads, rate)

    assert sum(shares.values()) == pytest.approx(sum(fair_shares(loads).values()))
    assert all(share > 0 for share in shares.values())  # no batch starves
    if expected == "fair":
        assert shares == fair_shares(loads)
        return
    assert late(loads, rate)  # fair share alone would miss a window
    finish = finish_times(loads, rate, lambda active: deadline_shares(active, rate))
    kept = {load.batch_id for load in loads
            if load.time_left is None or finish[load.batch_id] <= load.time_left + 1e-6}
    assert kept == expected


def test_a_batch_that_misses_even_with_the_whole_model_is_at_risk():
    assert at_risk(Load("x", 1000, time_left=50), rate=10)
    assert not at_risk(Load("x", 1000, time_left=150), rate=10)
    assert not at_risk(Load("x", 1000), rate=10)


def test_the_rate_counts_work_in_flight_once_from_the_earliest_finish():
    # Two workers, one chunk each at a time, 10 units a second each: chunks of 100
    # units take 10 s. Measured: one finished at 10 s, one finished at 15 s (started
    # at 5 s), one running since 10 s, half done at 15 s.
    chunks = [(0.0, 10.0, 100.0), (5.0, 15.0, 100.0), (10.0, 15.0, 50.0)]

    # From 10 s to 15 s: half of the second chunk and the running one's 50: 100 units
    # in 5 s. Claim to finish over the whole (250 units in 15 s) would say 16.7.
    assert measured_rate(chunks) == pytest.approx(20.0)


def test_chunks_that_all_ended_together_are_measured_over_their_busy_time():
    assert measured_rate([(0.0, 2.0, 4.0), (0.0, 2.0, 4.0)]) == pytest.approx(4.0)
    assert measured_rate([]) is None


# --- wired into dispatch ------------------------------------------------------------------


@pytest.fixture
def behind_two_long_batches(api, upload, settings, published, monkeypatch,
                            django_capture_on_commit_callbacks):
    """Two 24 h batches of 40 requests and, behind them, 20 requests with a 40 s
    window, on a model measured at 1 request a second: fair share (a third each)
    would finish the short one after 60 s."""
    from django.utils import timezone

    from batches import services
    from batches.models import ModelThroughput
    from serving.model_info import served_model
    from tests.conftest import chat_line, jsonl

    settings.BATCHGEN_CHUNK_SIZE = 1
    settings.BATCHGEN_MIN_COMPLETION_WINDOW_SECONDS = 1
    model = served_model().id
    ModelThroughput.objects.create(model=model, rate=1.0, cost_per_request=1.0, workers=1,
                                   measured_at=timezone.now())
    made = []
    for requests, window in ((40, "24h"), (40, "24h"), (20, "40s")):
        file = upload(jsonl([chat_line(f"r{i}") for i in range(requests)]))
        batch = services.batch_create(input_file_id=file["id"], endpoint="/v1/chat/completions",
                                      model=model, completion_window=window)
        with django_capture_on_commit_callbacks(execute=False):  # no dispatch yet
            made.append(services.batch_validate(batch_id=batch.id))
    monkeypatch.setattr("fleet.selectors.dispatch_window", lambda model: 30)
    return made


def dispatched() -> Counter:
    from batches.models import Chunk, ChunkStatus

    return Counter(Chunk.objects.filter(status=ChunkStatus.QUEUED)
                   .values_list("batch_id", flat=True))


@pytest.mark.django_db
def test_dispatch_gives_a_batch_that_would_miss_its_window_the_share_it_needs(
        behind_two_long_batches):
    from batches import dispatch

    long1, long2, short = behind_two_long_batches

    assert dispatch.dispatch() == 30

    by_batch = dispatched()
    assert by_batch[short.id] == 20  # every one of its requests goes first
    assert by_batch[long1.id] + by_batch[long2.id] == 10


@pytest.mark.django_db
def test_without_the_deadline_policy_dispatch_is_fair_share_alone(
        behind_two_long_batches, settings):
    from batches import dispatch

    settings.BATCHGEN_DEADLINE_POLICY = False
    long1, long2, short = behind_two_long_batches

    assert dispatch.dispatch() == 30

    assert dispatched() == {long1.id: 10, long2.id: 10, short.id: 10}


# --- the chunk play --------------------------------------------------------------------


def test_a_worker_s_rate_is_its_chunks_served_one_after_another():
    # One worker holding three chunks of 100 units claimed at 0: they close at 10,
    # 20 and 30 s (10 units a second), each waiting behind the one before.
    assert service_rate([("w", 0.0, 10.0, 100.0), ("w", 0.0, 20.0, 100.0),
                         ("w", 0.0, 30.0, 100.0)]) == pytest.approx(10.0)
    # Claim to close (the mean of 10, 20 and 30 s for 100 units each) would say 5.


def test_an_idle_gap_and_a_second_worker_do_not_slow_the_measure():
    chunks = [("a", 0.0, 10.0, 100.0), ("a", 50.0, 60.0, 100.0),  # idle 10 s to 50 s
              ("b", 0.0, 5.0, 100.0), ("b", 0.0, 10.0, 100.0)]   # a worker twice as fast
    # a: its second chunk served 50 to 60 s (100 in 10 s); b: 100 in 5 s (its first
    # chunk only marks where the second began). 200 units in 15 s.
    assert service_rate(chunks) == pytest.approx(200 / 15)
    assert service_rate([("a", 2.0, 6.0, 40.0)]) == pytest.approx(10.0)  # alone: from its claim
    assert service_rate([]) is None


def play(workers, *, queued=(), window=4, pending=None, passes=None, loads=None, rate=1.0):
    pending = pending or {}
    names = {batch for held in workers for batch, _ in held.chunks}
    names |= {batch for batch, _ in queued} | set(pending)
    loads = loads or [Load(batch, 1.0) for batch in sorted(names)]
    return chunk_finish_times(loads, Dispatch(workers=tuple(workers), queued=tuple(queued),
                                              window=window, pending=pending,
                                              passes=passes or {}), rate)


@pytest.mark.parametrize(("case", "workers", "queued", "pending", "window", "expected"), [
    ("a worker serves what it holds in turn",
     [Held(3, (("a", 4.0), ("b", 2.0), ("a", 4.0)))], (), {}, 4, {"a": 10, "b": 6}),
    ("the broker's window is first in, first out",
     [Held(1, (("a", 2.0),))], (("b", 3.0), ("a", 1.0)), {}, 4, {"a": 6, "b": 5}),
    ("two workers take the window's chunks as they free a thread",
     [Held(1, (("a", 2.0),)), Held(1, (("b", 5.0),))], (("c", 1.0), ("c", 1.0)), {}, 4,
     {"a": 2, "b": 5, "c": 4}),
    ("pending chunks enter the window by stride pass, ties by batch",
     [Held(1)], (), {"a": (2, 4), "b": (1, 2)}, 1, {"a": 6, "b": 4}),
    ("a small batch's chunk waits behind the window and the worker's chunks",
     [Held(2, (("big", 3.0), ("big", 3.0)))], (("big", 3.0), ("big", 3.0)),
     {"small": (1, 1), "big": (5, 15)}, 2, {"small": 16, "big": 28}),
])
@pytest.mark.usefixtures("whole")
def test_the_chunk_play(case, workers, queued, pending, window, expected):
    finish = play(workers, queued=queued, pending=pending, window=window,
                  passes={"a": 0.0, "b": 0.0, "big": 0.0, "small": 0.0})
    assert finish == pytest.approx(expected), case


@pytest.mark.parametrize(("case", "held", "costs", "expected"), [
    ("one slot serves the chunks one after another",
     Held(3, (("a", 40.0), ("b", 4.0)), slots=1), {"a": 4.0, "b": 1.0}, {"a": 40, "b": 44}),
    # 14 requests in 64 slots share the engine: b's four (1 unit each) end when each
    # of the 14 did 1 unit (14 s); a's ten then do their last 3 each (44 s).
    ("a cheap chunk beside a dear one ends first",
     Held(3, (("a", 40.0), ("b", 4.0)), slots=64), {"a": 4.0, "b": 1.0}, {"a": 44, "b": 14}),
    # Six requests in 64 slots: the engine's whole rate is theirs (6 s, not 64).
    ("fewer requests than slots share only among themselves",
     Held(3, (("a", 6.0),), slots=64), {"a": 1.0}, {"a": 6}),
    # Twelve slots of requests of one step each (a unit): they go in waves of
    # twelve, a step of twelve units (12 s) each; a's last two go in the fifth wave
    # beside ten of b's (60 s), b's last four in the ninth beside eight of c's (108 s),
    # c's last six alone (6 s after 144).
    ("full slots of one step go in waves",
     Held(3, (("a", 50.0), ("b", 50.0), ("c", 50.0)), slots=12), {"a": 1.0, "b": 1.0, "c": 1.0},
     {"a": 60, "b": 108, "c": 150}),
    # The same waves: b's two requests of half a step go in the fifth beside a's last
    # two; their half step of four units ends first (50 s), a's last half step then
    # of two (51 s).
    ("a cheap chunk in full slots ends before the dear one it came behind",
     Held(3, (("a", 50.0), ("b", 1.0)), slots=12), {"a": 1.0, "b": 0.5}, {"a": 51, "b": 50}),
    ("a chunk waiting for slots has not started",
     Held(3, (("a", 4.0), ("b", 4.0)), slots=4), {"a": 1.0, "b": 1.0}, {"a": 4, "b": 8}),
])
@pytest.mark.usefixtures("whole")
def test_a_worker_runs_its_chunks_requests_side_by_side_in_its_slots(case, held, costs, expected):
    loads = [Load(batch, sum(work for name, work in held.chunks if name == batch), cost=cost)
             for batch, cost in costs.items()]
    finish = chunk_finish_times(loads, Dispatch(workers=(held,)), 1.0)
    assert finish == pytest.approx(expected), case


@pytest.mark.parametrize(("case", "steps", "expected"), [
    # Twelve requests of 4 units claimed into 64 free slots, ten of "long" (4 steps,
    # a unit a step) and two of "short" (a dear prompt, one step: 3 units of prompt
    # and the step's). Shared by cost, all twelve end together (48 s). Step by step,
    # as vLLM runs them: the short ones' prompts first (6 s), then the first step of
    # twelve units (18 s) ends them; the long ones' three steps left do 10 units
    # each (30 s).
    ("shared by cost, requests of one cost end together", {}, {"long": 48, "short": 48}),
    ("step by step, a short answer leaves after its step, however dear its prompt",
     {"long": 4.0, "short": 1.0}, {"long": 48, "short": 18}),
    # Steps in proportion to cost are processor sharing: as without them.
    ("steps that are the cost units are sharing by cost",
     {"long": 4.0, "short": 4.0}, {"long": 48, "short": 48}),
])
def test_requests_share_the_engine_by_their_steps(case, steps, expected):
    loads = [Load(batch, work, cost=4.0, steps=steps.get(batch))
             for batch, work in (("long", 40.0), ("short", 8.0))]
    state = Dispatch(workers=(Held(3, slots=64),), queued=(("long", 40.0), ("short", 8.0)))
    assert chunk_finish_times(loads, state, 1.0) == pytest.approx(expected), case


@pytest.mark.usefixtures("whole")
def test_requests_found_in_the_engine_have_computed_their_prompts():
    # The same twelve found in the engine at the start: only their steps are left.
    # The first step of twelve units (12 s) ends the short ones, the long ones' three
    # steps left then 30 s.
    held = Held(3, (("long", 40.0), ("short", 8.0)), slots=64)
    loads = [Load("long", 40.0, cost=4.0, steps=4.0), Load("short", 8.0, cost=4.0, steps=1.0)]
    assert chunk_finish_times(loads, Dispatch(workers=(held,)), 1.0) == \
        pytest.approx({"long": 42, "short": 12})


@pytest.mark.usefixtures("whole")
def test_a_chunk_s_close_counts_the_requests_claimed_after_it():
    # One worker of two slots and two chunk threads at 1 unit a second, holding "a"
    # (one request of 10 steps, a unit each) and "b" (one of 2 steps at 1 a step),
    # "c" (as b) in the broker's window. b leaves after two steps of 2 units (4 s);
    # the thread it frees takes c, whose request fills b's slot beside a's for two
    # more steps of 2 units, and a's last six steps take 6 s alone: a ends at 14.
    # Worked out when a was claimed, with c not yet taken, a read 12.
    loads = [Load("a", 10.0, cost=10.0, steps=10.0), Load("b", 2.0, cost=2.0, steps=2.0),
             Load("c", 2.0, cost=2.0, steps=2.0)]
    state = Dispatch(workers=(Held(2, (("a", 10.0), ("b", 2.0)), slots=2),),
                     queued=(("c", 2.0),))
    finish = chunk_finish_times(loads, state, 1.0)
    assert finish["a"] == pytest.approx(14)
    assert finish["b"] == pytest.approx(4)


@pytest.mark.usefixtures("whole")
@pytest.mark.parametrize(("created", "first"), [((2.0, 1.0), "b"), ((1.0, 2.0), "a"),
                                                 ((0.0, 0.0), "a")])
def test_level_passes_go_to_the_older_batch(created, first):
    # One worker, one slot, a window of one chunk; "a" and "b" each one chunk of 50
    # requests at the same pass: the older goes first and ends at 50, the other at
    # 100, as dispatch breaks the tie. Created unknown (recorded before): by id.
    loads = [Load("a", 50.0, chunk=50.0, created=created[0]),
             Load("b", 50.0, chunk=50.0, created=created[1])]
    state = Dispatch(workers=(Held(1),), window=1, pending={"a": (1, 50), "b": (1, 50)},
                     passes={"a": 3.0, "b": 3.0})
    finish = chunk_finish_times(loads, state, 1.0)
    assert finish[first] == pytest.approx(50)
    assert finish[({"a", "b"} - {first}).pop()] == pytest.approx(100)


@pytest.mark.usefixtures("whole")
def test_a_batch_s_pending_chunks_are_full_but_its_last():
    # One worker, one slot, a window of one chunk; "a" has 60 requests left in two
    # chunks of at most 50 (50 and 10, as validation cut them), "b" 50 in one, at
    # equal shares. Stride: a's 50, b's 50, a's 10. Split evenly (30 and 30), b's
    # chunk would go second and end at 80.
    loads = [Load("a", 60.0, chunk=50.0), Load("b", 50.0, chunk=50.0)]
    state = Dispatch(workers=(Held(1),), window=1, pending={"a": (2, 60), "b": (1, 50)})
    assert chunk_finish_times(loads, state, 1.0) == pytest.approx({"a": 110, "b": 100})
    # Without a chunk size, the play can only split them evenly.
    even = [Load("a", 60.0), Load("b", 50.0)]
    assert chunk_finish_times(even, state, 1.0) == pytest.approx({"a": 110, "b": 80})


@pytest.mark.parametrize(("done", "tokens", "prior", "answer", "expected"), [
    (0, 0, None, None, None),  # nothing known: shared by cost
    (0, 0, 31.0, None, 32.0),  # the answer prior before any finished
    (10, 200, 31.0, None, 21.0),  # its answers so far
    (10, 200, 31.0, 30.0, 31.0),  # by the limits left (left_output)
    (10, 9000, 31.0, None, 100.0),  # no more steps than its cost (100 units)
])
@pytest.mark.parametrize("limit", [None, 64.0])  # the lines' limit only without a prior
def test_a_request_s_steps_are_one_plus_its_answer(done, tokens, prior, answer, expected,
                                                   limit):
    if limit and expected is None:
        expected = 1.0 + limit  # before the model has a history: the most it can answer
    assert request_steps(done, tokens, prior, answer, limit=limit, cost=100.0) == expected


def test_the_requests_in_the_engine_are_spread_by_their_admission():
    # 64 requests of 10 steps found in 64 slots, the worker telling nothing of them:
    # the oldest with half of their steps left, the newest with all (IN_ENGINE_SPREAD
    # 0.5), in groups of four by admission. 7.5 steps each on average, a unit a
    # step: 480 s, where counted whole it is 640.
    loads = [Load("a", 640.0, cost=10.0, steps=10.0)]
    held = Held(3, (("a", 640.0),), slots=64)
    assert eta.IN_ENGINE_SPREAD == 0.5
    assert chunk_finish_times(loads, Dispatch(workers=(held,)), 1.0) == pytest.approx({"a": 480})
    # Those behind the slots wait, whole, prompts and all: 32 more of 10 steps with a
    # prompt of 5 units each. The engine is never idle, so it takes all the units
    # over the rate: 480 + 32 x 15.
    dear = [Load("a", 1440.0, cost=15.0, steps=10.0)]
    behind = Held(3, (("a", 1440.0),), slots=64)
    assert chunk_finish_times(dear, Dispatch(workers=(behind,)), 1.0) == pytest.approx({"a": 960})


@pytest.mark.usefixtures("whole")
def test_a_chunk_all_in_the_engine_stays_for_the_steps_its_longest_has_left():
    # The worker of the close test above, its engine telling that a's one request
    # (10 steps) has 3 steps left (Held.left_steps). a's last 3 steps: 2 beside b
    # (2 units each, 4 s) and 1 beside c, which took b's slot (2 units): 6 s, where
    # counted whole it is 14. b, not told, keeps its whole 2 steps (4 s).
    loads = [Load("a", 10.0, cost=10.0, steps=10.0), Load("b", 2.0, cost=2.0, steps=2.0),
             Load("c", 2.0, cost=2.0, steps=2.0)]
    told = Held(2, (("a", 10.0), ("b", 2.0)), slots=2, left_steps={0: 3.0})
    finish = chunk_finish_times(loads, Dispatch(workers=(told,), queued=(("c", 2.0),)), 1.0)
    assert finish["a"] == pytest.approx(6)
    assert finish["b"] == pytest.approx(4)
    # Never more than a whole request's steps: a limit above the batch's steps (an
    # answer that ends before its max_tokens) reads as the whole request.
    long = Held(2, (("a", 10.0), ("b", 2.0)), slots=2, left_steps={0: 50.0})
    assert chunk_finish_times(loads, Dispatch(workers=(long,), queued=(("c", 2.0),)),
                              1.0)["a"] == pytest.approx(14)


def test_a_chunk_all_in_the_engine_ends_evenly_up_to_its_longest():
    # 64 requests of 10 steps in 64 slots, each with 5 steps left at most
    # (Held.left_steps): four groups of 16 end at 1.25, 2.5, 3.75 and 5 steps, 200
    # request-steps at a unit each: 200 s, the last with the longest.
    loads = [Load("a", 640.0, cost=10.0, steps=10.0)]
    held = Held(3, (("a", 640.0),), slots=64, left_steps={0: 5.0})
    assert chunk_finish_times(loads, Dispatch(workers=(held,)), 1.0) == \
        pytest.approx({"a": 200})


def test_the_prompts_of_requests_in_the_engine_without_a_token_come_first():
    """Held.started: the worker tells which requests in its slots have generated a
    token. Those without one have their prompts still to compute (admitted since
    its engine last told, on their way in, or waiting for prefill), and the engine
    computes those prompts as well as the steps. 64 requests of 10 steps in 64
    slots, with 5 steps left at most, take 200 s (the test above); each costs 15
    units, 5 of them its prompt."""
    loads = [Load("a", 960.0, cost=15.0, steps=10.0)]

    def played(started, left_steps=None):
        held = Held(3, (("a", 960.0),), slots=64, left_steps=left_steps or {},
                    started=started)
        return chunk_finish_times(loads, Dispatch(workers=(held,)), 1.0)["a"]

    told = {0: 5.0}
    # All 64 started, or an engine that tells nothing: the steps alone.
    assert played(None, told) == pytest.approx(200)
    assert played({0: 64.0}, told) == pytest.approx(200)
    # 16 without a token: their 16 x 5 units of prompt first.
    assert played({0: 48.0}, told) == pytest.approx(280)
    # Not told, the requests spread by their admission: still 80 units more, and
    # 320 where none has a token (the chunk missing from what the worker told).
    spread = played(None)
    assert played({0: 48.0}) == pytest.approx(spread + 80)
    assert played({}) == pytest.approx(spread + 320)


@pytest.mark.usefixtures("whole")
def test_a_held_chunk_with_nothing_left_closes_now():
    # Its requests all ended, not yet flushed: it closes at once, and the worker's
    # next chunk runs alone (its 4 requests of a unit, in 64 slots: 4 s).
    loads = [Load("a", 0.0), Load("b", 4.0)]
    held = Held(3, (("a", 0.0), ("b", 4.0)), slots=64)
    assert chunk_finish_times(loads, Dispatch(workers=(held,)), 1.0) == \
        pytest.approx({"a": 0, "b": 4})


def test_far_ahead_a_chunk_s_requests_admitted_near_together_end_together(monkeypatch):
    """Three batches of one-request steps 7, 19 and 40 long, 30 chunks of 50 each, on
    one worker of 12 slots: the short ones' ends admit a few requests at a time, and
    the groups would split down to single requests. Past EXACT_TURNS of the slots a
    chunk's requests admitted near together end together (MERGE_STEPS): the batches
    end within 1 % of the exact play."""
    loads = [Load(name, 1500.0 * steps, chunk=50.0 * steps, cost=steps, steps=steps)
             for name, steps in (("a", 7.0), ("b", 19.0), ("c", 40.0))]
    state = Dispatch(workers=(Held(3, slots=12),), window=4,
                     pending={name: (30, 1500) for name in "abc"})
    merged = chunk_finish_times(loads, state, 1.0)
    monkeypatch.setattr(eta, "EXACT_TURNS", 10**9)
    exact = chunk_finish_times(loads, state, 1.0)
    assert merged == pytest.approx(exact, rel=0.01)
    assert merged != exact  # it merged


@pytest.mark.usefixtures("whole")
def test_the_chunk_play_follows_the_shares_it_is_given():
    # Two batches with 4 chunks of one request each, one worker, a window of one:
    # equal shares alternate them; "b" with three times the share goes three to one.
    loads = [Load("a", 4.0), Load("b", 4.0)]
    state = Dispatch(workers=(Held(1),), window=1, pending={"a": (4, 4), "b": (4, 4)})
    assert chunk_finish_times(loads, state, 1.0) == pytest.approx({"a": 7, "b": 8})
    weighted = chunk_finish_times(loads, state, 1.0,
                                  lambda active: {load.batch_id: 3.0 if load.batch_id == "b"
                                                  else 1.0 for load in active})
    assert weighted == pytest.approx({"a": 8, "b": 6})


@pytest.mark.usefixtures("whole")
def test_the_chunk_play_is_the_fluid_play_for_many_chunks():
    """Batches of 200 and 400 one-request chunks on four workers: the chunk play and
    the fluid split (whose tail spreads the last chunks over fewer workers) agree to
    1 %."""
    loads = [Load("a", 200.0, chunk=1.0), Load("b", 400.0, chunk=1.0)]
    state = Dispatch(workers=tuple(Held(3) for _ in range(4)), window=14,
                     pending={"a": (200, 200), "b": (400, 400)})
    chunked = chunk_finish_times(loads, state, 1.0)
    fluid = finish_times(loads, rate=4.0, worker_rate=1.0)
    assert chunked == pytest.approx(fluid, rel=0.01)
    assert play([], pending={"a": (1, 1)}) == {"a": float("inf")}  # nobody to run it


def _fit(*intervals: tuple[float, float, float]) -> float | None:
    fit = PromptFit()
    for decode, prompt, busy in intervals:
        fit.add(5.0, decode, prompt, busy)
    return fit.weight()


@pytest.mark.parametrize(("intervals", "weight"), [
    # busy = 0.1 per decode unit + 0.02 per prompt token, the mix varied: 0.2
    ([(50, 1000, 25), (200, 200, 24), (100, 500, 20)], 0.2),
    # the same mix throughout: any weight explains it, so none is said
    ([(50, 1000, 25), (100, 2000, 50), (25, 500, 12.5)], None),
    # no prompt tokens at all
    ([(50, 0, 5), (100, 0, 10)], None),
    # prompts that take less time than none: at least 0
    ([(100, 100, 9), (100, 300, 8), (100, 200, 8.5)], 0.0),
    # prompt tokens dearer than output tokens: at most PROMPT_WEIGHT_MAX
    ([(10, 100, 31), (100, 10, 13), (50, 50, 20)], PROMPT_WEIGHT_MAX),
    # nothing yet, or too little to tell
    ([], None),
    ([(50, 1000, 25), (200, 200, 24)], None),
    # a worker busy throughout while what it finished came in bursts: 0.48 give or
    # take 0.24 is not told
    ([(100, 900, 5), (300, 1200, 5), (50, 800, 5), (200, 500, 5), (150, 1500, 5)], None),
])
def test_the_prompt_fit_tells_a_prompt_token_s_worth_only_when_the_mixes_differ(intervals,
                                                                                weight):
    assert _fit(*intervals) == (None if weight is None else pytest.approx(weight))


def test_the_prompt_fit_follows_a_change_with_the_newer_intervals_weighing_more():
    """Intervals PROMPT_HALF_LIFE apart weigh half as much: after a long run at one
    weight, an hour at another has taken over."""
    fit = PromptFit()
    for decode, prompt in ((50, 1000), (200, 200)) * 10:  # at 0.5 (u = 0.1, v = 0.05)
        fit.add(5.0, decode, prompt, 0.1 * decode + 0.05 * prompt)
    for decode, prompt in ((50, 1000), (200, 200)) * 360:  # then at 0.1
        fit.add(5.0, decode, prompt, 0.1 * decode + 0.01 * prompt)
    assert fit.weight() == pytest.approx(0.1, abs=0.01)
