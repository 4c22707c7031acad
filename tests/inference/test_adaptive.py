"""The adaptive concurrency controller (inference/adaptive.py) as a pure function: a
table of sample sequences, each with the limits and modes it must set."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from inference.adaptive import (
    HOLD_CAP,
    HOLD_SECONDS,
    Limits,
    Mode,
    Sample,
    limit_step,
    start,
)

LIMITS = Limits(target=1.5, floor=2, ceiling=64)
FULL = None  # in_flight: the batch fills the limit it was given


@dataclass(frozen=True)
class Look:
    """One sample of a row: `dt` seconds after the last, the server's figures (None:
    it reports none), the batch's in flight (FULL: the current limit)."""

    running: int | None = None  # the server's running, beyond the batch's own
    waiting: int | None = 0
    latency: float | None = None
    in_flight: int | None = FULL
    dt: float = 0.5
    others: int = 0  # requests of other clients at the server
    # A CPU server's step grows with the sequences in it: seconds added to `latency`
    # for each one running.
    per_sequence: float = 0.0

    def sample(self, at: float, limit: int) -> Sample:
        in_flight = limit if self.in_flight is FULL else self.in_flight
        latency = self.latency
        if latency is not None:
            latency += self.per_sequence * (in_flight + self.others)
        if self.running is None and self.waiting is None:
            return Sample(at=at, in_flight=in_flight, latency=latency)
        running = in_flight + self.others if self.running is None else self.running
        return Sample(at=at, in_flight=in_flight, running=running, waiting=self.waiting,
                      latency=latency)


ALONE = Look()
OTHERS = Look(others=1, latency=0.010)
BLIND = Look(waiting=None)
# A CPU-like server: 10 ms a step and 1 ms more a sequence. The shared rule (target
# 1.5 over the unloaded 12 ms at 2 sequences) settles at 6-9 sequences; alone, the
# token rate n / (10 + n) ms still gains a twentieth up to about 60.
CPU = Look(latency=0.010, per_sequence=0.001, dt=1.0)
BURST = Look(latency=0.010, per_sequence=0.001, others=4, dt=1.0)
CPU_4S = Look(latency=0.010, per_sequence=0.001, dt=4.0)  # looks 4 s apart (shorter rows)

# (what it shows, the looks, the limit after each, the mode after each, shed after each)
TABLE = [
    ("alone, the limit grows by half a look from the floor to the ceiling",
     [ALONE] * 10, [3, 5, 8, 12, 18, 27, 41, 62, 64, 64], ["alone"] * 10, None),
    ("alone, a limit the batch does not fill does not grow",
     [Look(in_flight=1)] * 3, [2, 2, 2], ["alone"] * 3, None),
    ("alone, a server that queues once may be between two steps: the limit holds",
     [ALONE, ALONE, Look(waiting=3, running=2), ALONE, ALONE],
     [3, 5, 5, 8, 12], ["alone"] * 5, None),
    ("alone, batch requests waiting twice: the limit falls to what the server runs and"
     " holds",
     [ALONE, ALONE, Look(waiting=3, running=2), Look(waiting=3, running=2), ALONE, ALONE],
     [3, 5, 5, 2, 2, 2], ["alone"] * 6, None),
    ("alone, the token rate decides: growth while it rises by a twentieth; two whole"
     " windows without it: back and hold at the knee",
     # rate = in flight / latency: 2/0.01=200, 3/0.01=300, 5/0.016=312 (+4%: a miss),
     # measured over KNEE_WINDOW samples twice after the one with the prefills
     [Look(latency=0.010)] * 4 + [Look(latency=0.016)] * 11,
     [2, 3, 3, 5] + [5] * 8 + [4, 4, 4], ["alone"] * 15, None),
    ("alone, one window without the gain is not the knee: a second that shows it grows",
     [Look(latency=0.010)] * 4 + [Look(latency=0.016)] * 5 + [Look(latency=0.010)],
     [2, 3, 3, 5] + [5] * 5 + [8], ["alone"] * 10, None),
    ("alone, held at the knee: a probe after PROBE_SECONDS grows one step, kept when"
     " the rate rose",
     # the knee at 4 at 6.5 s; the rate at 4 measured meanwhile (400); the probe at
     # 11.5 s to 6, 6/0.01=600: growth again
     [Look(latency=0.010)] * 4 + [Look(latency=0.016)] * 9 + [Look(latency=0.010)] * 12,
     [2, 3, 3, 5] + [5] * 8 + [4] * 10 + [6, 6, 9], ["alone"] * 25, None),
    ("alone, a probe that does not pay goes back to the knee and holds again",
     # at 4: 4/0.016=250; the probe to 6 at 0.024: 250 again, two windows: back to 4
     [Look(latency=0.010)] * 4 + [Look(latency=0.016)] * 19 + [Look(latency=0.024)] * 10,
     [2, 3, 3, 5] + [5] * 8 + [4] * 10 + [6] * 9 + [4, 4], ["alone"] * 33, None),
    ("alone, the first full sample at a new limit is not measured (its prefills)",
     [Look(latency=0.010), Look(latency=0.010), Look(latency=0.100),
      Look(latency=0.010)],
     [2, 3, 3, 5], ["alone"] * 4, None),
    ("others appear: the floor at once, the newest requests above it stopped",
     [ALONE] * 6 + [OTHERS], [3, 5, 8, 12, 18, 27, 2], ["alone"] * 6 + ["shared"],
     [False] * 6 + [True]),
    ("shared, latency within the target: one more a look; beyond it: a cut by 0.7",
     [OTHERS, Look(others=1, latency=0.012), Look(others=1, latency=0.014),
      Look(others=1, latency=0.016), Look(others=1, latency=0.020),
      Look(others=1, latency=0.012)],
     [2, 3, 4, 2, 2, 3], ["shared"] * 6, [False] * 6),
    ("shared, another client waiting at the server: a cut, never below the floor",
     [OTHERS, OTHERS, OTHERS, OTHERS, Look(others=1, waiting=1, latency=0.010)],
     [2, 3, 4, 5, 3], ["shared"] * 5, None),
    ("others gone: shared for HOLD_SECONDS, then the batch takes the capacity back"
     " (measured: growth every second full sample)",
     [OTHERS] + [Look(latency=0.010, dt=1.0)] * int(HOLD_SECONDS - 1)
     + [Look(latency=0.010, dt=1.0)] * 3,
     [2, *range(3, 32), 31, 47, 47], ["shared"] * 30 + ["alone"] * 3, None),
    ("bursts every 10 s (CPU-like server): the first cuts to the floor; the pauses end"
     " within the hold, so between bursts the batch keeps to the shared rule's level"
     " (6-10 here, where alone it grows to 59), never alone, no cut at a burst",
     [CPU] * 3 + ([BURST] + [CPU] * 9) * 4,
     [2, 3, 3] + [2, 3, 4, 5, 6, 7, 8, 9, 6, 7] + [4, 5, 6, 7, 8, 9] + [6, 7, 8, 9] * 3
     + [6, 7] + [4, 5, 6, 7, 8, 9, 10, 7, 8, 9],
     ["alone"] * 3 + ["shared"] * 40, [False] * 3 + [True] + [False] * 39),
    ("bursts every 40 s: the first pause outlasts HOLD_SECONDS and the batch alone"
     " grows (to 59); the burst after it teaches the rhythm (hold 2 x 39 s): from then"
     " on the shared rule's level between bursts",
     [CPU] * 3 + ([BURST] + [CPU] * 39) * 2 + [BURST] + [CPU] * 9,
     [2, 3, 3] + [2, 3, 4, 5, 6, 7, 8, 9] + [6, 7, 8, 9] * 5 + [6, 7]
     + [7, 11, 11, 17, 17, 26, 26, 39, 39, 59] + [2, 3, 4, 5, 6, 7, 8, 9]
     + [6, 7, 8, 9] * 6 + [10, 7, 8, 9] * 2 + [6, 7, 8, 9, 10, 7, 8, 9, 10, 7],
     ["alone"] * 3 + ["shared"] * 30 + ["alone"] * 10 + ["shared"] * 50,
     [False] * 3 + [True] + [False] * 39 + [True] + [False] * 49),
    ("traffic gone for long: after pauses of 60 s the hold is HOLD_CAP (120 s); once"
     " that passes without others the batch is alone and grows back to the ceiling",
     [CPU] * 3 + [BURST] + [CPU_4S] * 15 + [BURST] + [CPU_4S] * 30 + [CPU] * 12,
     [2, 3, 3] + [2, 3, 4, 5, 6, 7, 8, 9] + [9, 14, 14, 21, 21, 32, 32, 48]
     + [2, 3, 4, 5, 6, 7, 8, 9] + [6, 7, 8, 9] * 5 + [6, 7]
     + [7, 11, 11, 17, 17, 26, 26, 39, 39, 59, 59, 64, 64],
     ["alone"] * 3 + ["shared"] * 8 + ["alone"] * 8 + ["shared"] * 30 + ["alone"] * 13,
     None),
    ("ours counted by us and not yet by the server are not others",
     [Look(running=1, in_flight=2), Look(running=0, waiting=1, in_flight=3)],
     [3, 3], ["alone", "alone"], None),
    ("no server figures: the batch's own latency takes the inter-token latency's place",
     [Look(waiting=None, latency=0.05), Look(waiting=None, latency=0.06),
      Look(waiting=None, latency=0.07), Look(waiting=None, latency=0.09),
      Look(waiting=None, latency=None)],
     [3, 4, 5, 3, 4], ["blind"] * 5, None),
    ("a ceiling at the floor holds the limit there whatever happens",
     [ALONE, OTHERS, ALONE], [2, 2, 2], ["alone", "shared", "shared"], None),
]


@pytest.mark.parametrize(("shows", "looks", "limits", "modes", "sheds"), TABLE,
                         ids=[row[0] for row in TABLE])
def test_the_controller_sets_these_limits_for_these_signals(shows, looks, limits, modes,
                                                            sheds):
    bounds = Limits(target=1.5, floor=2, ceiling=2) if "ceiling at the floor" in shows \
        else LIMITS
    state, at = start(bounds), 0.0
    seen_limits, seen_modes, seen_sheds = [], [], []
    for look in looks:
        at += look.dt
        state = limit_step(state, look.sample(at, state.limit), bounds)
        seen_limits.append(state.limit)
        seen_modes.append(state.mode.value)
        seen_sheds.append(state.shed)

    assert seen_limits == limits
    assert seen_modes == modes
    if sheds is not None:
        assert seen_sheds == sheds


def test_the_limit_starts_at_the_floor_and_stays_within_floor_and_ceiling():
    state = start(LIMITS)
    assert (state.limit, state.mode) == (2, Mode.START)
    at = 0.0
    # Any mix of figures, extreme ones included, never leaves the bounds.
    for index in range(400):
        at += 0.5
        look = [ALONE, OTHERS, Look(others=5, waiting=50, latency=9.0),
                Look(latency=0.0001), BLIND][index % 7 % 5]
        state = limit_step(state, look.sample(at, state.limit), LIMITS)
        assert LIMITS.floor <= state.limit <= LIMITS.ceiling


def test_the_unloaded_latency_is_the_lowest_seen_slowly_forgotten():
    state, at = start(LIMITS), 0.0
    for latency in (0.020, 0.010, 0.030):
        at += 0.5
        state = limit_step(state, Look(latency=latency).sample(at, state.limit), LIMITS)
    assert 0.010 < state.baseline < 0.0101  # the lowest, drifted up by a hair


def test_the_hold_is_twice_the_longest_recent_pause_within_its_bounds():
    """A pause of the others' traffic is learnt when they come back; a longer one
    remembered fades at each return; a pause longer than HOLD_CAP is a departure."""
    state, at, holds = start(LIMITS), 0.0, []

    def look(others: int, dt: float) -> None:
        nonlocal state, at
        at += dt
        state = limit_step(state, Look(others=others, latency=0.010).sample(
            at, state.limit), LIMITS)

    look(0, 1.0)
    holds.append(state.hold)  # no other traffic ever: the least hold
    look(1, 1.0), look(0, 1.0), look(1, 39.0)
    holds.append(state.hold)  # back after 40 s: twice that
    for _ in range(5):  # then a request a second: the 40 s pause fades
        look(0, 0.5), look(1, 0.5)
        holds.append(state.hold)
    look(0, 1.0), look(1, 69.0)
    holds.append(state.hold)  # back after 70 s: the cap
    look(0, 1.0), look(1, HOLD_CAP + 9)
    holds.append(state.hold)  # back after more than the cap: a departure, forgotten
    assert holds == pytest.approx([HOLD_SECONDS, 80.0, 64.0, 51.2, 40.96, 32.768,
                                   HOLD_SECONDS, HOLD_CAP, HOLD_SECONDS])
