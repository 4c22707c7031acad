"""Adaptive concurrency: how many batch requests the openai-http engine keeps in flight
at a server that other (interactive) traffic shares (issue 34).

Why a limit at all: vLLM's `priority` only orders its waiting queue. Every engine step,
which each interactive token waits for, carries every sequence the server runs, so a
batch with hundreds of requests in flight makes every interactive token slow however
first it is queued (measured: interactive TTFT p99 33.6x its value alone). What an
interactive request waits for is the step, and the step grows with the sequences in it.

The anchors, and what is taken from each:

- llm-d's batch gateway (AIMD on the server's queue): decrease on a congestion
  signal, increase otherwise. Its issue #491 found AIMD alone "partially works": it
  reacts only once interactive requests already queue.
- Netflix concurrency-limits, Gradient2 and Vegas: compare the latency now with the
  latency unloaded (`baseline`: the lowest seen, slowly forgotten) and keep the limit
  where their ratio stays within a tolerance; count what queues (Vegas) rather than wait
  for a drop.
- vLLM's own gauges (`/metrics`): `vllm:num_requests_running` and
  `vllm:num_requests_waiting` count every request at the server, so those beyond the
  batch's own in flight are someone else's; `vllm:inter_token_latency_seconds` is the
  step time each token waited for.

The policy (`limit_step`, a pure function of the last state and one sample):

1. *Alone* (no other request at the server for the hold, below): the batch wants
   throughput, but only the throughput more in flight buys. The limit grows by GROWTH
   (slow start) while the limit binds (the batch keeps it full), the server queues
   nothing and the batch's token rate (its sequences at the server over the step
   time, i.e. tokens/s) rose by at least KNEE_GAIN since the last growth. The rate at
   a limit is the mean over its full samples but the first (which still carries the
   new requests' prefills): a growth whose mean shows the gain is kept at once, one
   that does not is measured over KNEE_WINDOW samples, and only KNEE_MISSES such
   windows in a row without the gain call the knee (one look is noise on a CPU
   server). At the knee the limit goes back by GROWTH and holds (Vegas/Gradient-
   style): past it every step is longer for nothing, and every sequence in a step is
   one an interactive request that arrives must wait behind. Held, the rate at the
   held limit is measured all along and every PROBE_SECONDS one growth step is tried
   again against it, kept if it pays, undone by the same two windows if not (the knee
   moves with the requests' lengths). A server that keeps batch requests waiting on
   two samples in a row already runs all it can: the limit falls to what it runs and
   holds (probed as the knee), since a request waiting there adds nothing but an
   abort to make when others come. Without a latency figure the limit grows every
   full sample (and, held, does not probe).
2. *Shared* (another request seen at the server within the hold): when others
   appear the limit drops to the floor at once (`shed`: the engine also stops the
   newest requests above it, which the server aborts, and sends them again later),
   because a request already running holds its place in every step until it ends.
   From there it grows by one a sample while the server's inter-token latency stays
   within `target` times its baseline and nothing waits at the server, and falls by
   BACKOFF when either is broken (AIMD around a Gradient2 tolerance).
   *The hold* is how long the shared rule outlasts the last request of others seen:
   interactive traffic pauses and comes back, and a batch that grew to the knee in a
   pause meets the next request with all of it running (measured on a CPU: bursts of
   4 every 10 s at 5.96x their TTFT alone, with a 5 s hold). So the controller
   remembers the traffic's rhythm: each time others appear after a quiet spell, the
   spell's length is kept as `rhythm` if it is the longest recent one (a longer one
   remembered before counts RHYTHM_DECAY times less at each return); a spell longer
   than HOLD_CAP is no rhythm (the traffic had gone) and clears it. The hold is
   RHYTHM_FACTOR times the rhythm, at least HOLD_SECONDS (a pause shorter than half a
   minute is not a departure; the first pause of a new rhythm cannot be known before
   it ends), at most HOLD_CAP.
3. *No server figures* (a server without `/metrics`, or not vLLM's): other traffic
   cannot be seen, so the batch's own time per output token, measured on its own
   requests, takes the inter-token latency's place and rule 2 applies always: a batch
   alone then runs below its best throughput, the price of not knowing.

What it promises: the limit stays within [floor, ceiling]; within one sample of other
traffic appearing at a server that reports it after the hold ran out, the batch's
in-flight requests are at the floor; while others stay or come back within the hold,
the shared rule holds: the server's inter-token latency settles within `target` times
its unloaded value (or the limit at the floor), and a pause in their traffic is not
used to grow past that. What the batch gives up for it: after the others' last
request it keeps to the shared rule's limit for the hold, HOLD_SECONDS (30 s) for
traffic that never paused longer than 15 s, up to HOLD_CAP (120 s) for traffic that
came back after pauses of a minute or more. A batch that never saw other traffic
gives up nothing. Within the hold plus
2 log_GROWTH(ceiling / floor) samples of the others leaving (while each growth shows
its gain at once), the batch may use the ceiling again, or the knee (the least limit
past which a growth buys less than KNEE_GAIN more tokens/s over KNEE_MISSES windows)
or what the server runs, whichever is first; held there, it tries one step more every
PROBE_SECONDS; alone, the limit
is never kept above what the server runs while batch requests wait there. The floor
(at least 1) keeps the batch progressing under any load.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

# After the last request of another client is seen, the batch keeps to the shared rule
# at least this long: interactive traffic at one request a second is at the server
# about a third of the time, and a limit that rose between two requests would meet
# the next one with the full batch running; a pause of under half a minute is one a
# client's next request (a user's next question, the next burst) often ends.
HOLD_SECONDS = 30.0
# The hold is this many times the longest recent pause of the others' traffic (its
# rhythm), so that a pause like the last ones ends inside it...
RHYTHM_FACTOR = 2.0
# ... and at most this long: a pause longer than this is the traffic gone, not its
# rhythm, and a batch whose neighbours left takes the capacity back within it.
HOLD_CAP = 120.0
# A longer pause remembered counts this many times less at each return of the
# others (steady traffic after bursts shortens the hold within a few requests).
RHYTHM_DECAY = 0.8
GROWTH = 1.5  # alone: the limit's growth a sample (256 from 1 in 14 samples, 3.5 s)
BACKOFF = 0.7  # shared: the cut when the latency or the server's queue says too many
# The unloaded latency is forgotten this fast (a sample's factor): a server that got
# slower for good (a longer context in use, another model) is a new normal within
# a few minutes, as Gradient2's long-term RTT drifts.
BASELINE_DRIFT = 1.002
# Alone, a growth must raise the batch's token rate by this share to be kept: less is
# within the noise of a few steps and is not worth the longer steps it costs others.
KNEE_GAIN = 0.05
# The rate is the mean over the samples at a settled limit: a growth that shows the
# gain is kept at once (the ramp stays fast), one that does not is measured over
# KNEE_WINDOW samples (a second at SAMPLE_SECONDS 0.25), and the knee is called only
# when KNEE_MISSES such windows in a row miss the gain: one sample with new requests'
# prefills in it is noise on a CPU server (measured: a single look held at 10 what
# rose to 128, batch alone at 0.60x fixed).
KNEE_WINDOW = 4
KNEE_MISSES = 2
# Held at the knee, the batch tries one growth step again this often (Gradient2 and
# Vegas keep probing): the knee moves with the requests' lengths and with the server.
PROBE_SECONDS = 5.0
# A limit "binds" when the batch holds at least this share of it in flight: a limit
# the batch does not fill tells nothing about more (Netflix's rule).
BINDING_SHARE = 0.9


class Mode(enum.StrEnum):
    START = "start"  # no sample yet
    ALONE = "alone"  # no other traffic at the server
    SHARED = "shared"  # other traffic at the server within the hold
    BLIND = "blind"  # no server figures: the batch's own latency alone


@dataclass(frozen=True, slots=True)
class Limits:
    """The settings: BATCHGEN_ADAPTIVE_TARGET, _FLOOR and _CEILING."""

    target: float  # tolerated ratio of inter-token latency to its unloaded value
    floor: int
    ceiling: int


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at the server (and at the batch's own requests)."""

    at: float  # monotonic seconds
    in_flight: int  # the batch's requests at the server now
    # The server's gauges; None when it reports none (rule 3).
    running: int | None = None
    waiting: int | None = None
    # Mean seconds between two tokens since the last sample: the server's inter-token
    # latency histogram, or the batch's own time per output token (rule 3); None when
    # no token was made.
    latency: float | None = None
    ttft: float | None = None  # mean time to first token since the last sample (shown)

    @property
    def reports(self) -> bool:
        return self.running is not None and self.waiting is not None

    @property
    def others(self) -> int:
        """Requests at the server that are not the batch's. Ours may be counted here and
        not there yet (on the way) or no more (the answer on its way back): both make
        this smaller, never larger, so a positive count is another client's."""
        if not self.reports:
            return 0
        return max(0, self.running + self.waiting - self.in_flight)


@dataclass(frozen=True, slots=True)
class Admission:
    """The controller's state: the limit it set and what it remembers."""

    limit: int
    mode: Mode = Mode.START
    baseline: float | None = None  # the unloaded inter-token latency
    others_seen_at: float | None = None
    # The others' rhythm: the longest recent pause between their requests (s; None:
    # none seen yet, or the last pause was their departure), and whether the last
    # sample saw them (a sample that does after one that did not ends a pause).
    rhythm: float | None = None
    present: bool = False
    shed: bool = False  # this step cut the limit below what is in flight: stop the newest
    # Alone: the token rate measured at the limit before the last growth (the one a
    # growth must beat), the full samples seen at this limit, whether growth stopped
    # (the knee or the server's capacity) and since when, and whether the server kept
    # batch requests waiting at the last sample.
    rate: float | None = None
    settled: int = 0
    total: float = 0.0  # the sum of the rates measured at this limit (the window's)
    misses: int = 0  # windows in a row at this limit that missed the gain
    knee: bool = False
    held_at: float = 0.0  # when the limit last stopped growing (probes count from it)
    queued: bool = False

    def as_dict(self) -> dict:
        return {"limit": self.limit, "mode": self.mode.value,
                "baseline_latency": None if self.baseline is None else round(self.baseline, 4),
                "shed": self.shed, "knee": self.knee, "hold_seconds": self.hold}

    @property
    def hold(self) -> float:
        """How long the shared rule outlasts the others' last request (s)."""
        return hold_seconds(self.rhythm)


def hold_seconds(rhythm: float | None) -> float:
    """RHYTHM_FACTOR times the rhythm, within [HOLD_SECONDS, HOLD_CAP]."""
    if rhythm is None:
        return HOLD_SECONDS
    return min(HOLD_CAP, max(HOLD_SECONDS, RHYTHM_FACTOR * rhythm))


def _rhythm(state: Admission, sample: Sample) -> float | None:
    """The rhythm after `sample`: a pause that ends now is kept if it is the longest
    recent one, cleared if it was longer than HOLD_CAP (the others had gone)."""
    if not sample.others or state.present or state.others_seen_at is None:
        return state.rhythm
    pause = sample.at - state.others_seen_at
    if pause > HOLD_CAP:
        return None
    return max(pause, (state.rhythm or 0.0) * RHYTHM_DECAY)


def start(limits: Limits) -> Admission:
    """The state before any sample: the floor (a slow start, as TCP's)."""
    return Admission(limit=limits.floor)


def limit_step(state: Admission, sample: Sample, limits: Limits) -> Admission:
    """The next state after `sample` (the rules of the module's docstring)."""
    baseline = _baseline(state.baseline, sample.latency)
    rhythm = _rhythm(state, sample)
    others_seen_at = sample.at if sample.others else state.others_seen_at
    shared = (others_seen_at is not None
              and sample.at - others_seen_at < hold_seconds(rhythm))
    memory = {"others_seen_at": others_seen_at, "rhythm": rhythm,
              "present": bool(sample.others)}
    if not sample.reports:
        mode = Mode.BLIND
    else:
        mode = Mode.SHARED if shared else Mode.ALONE
    limit = state.limit
    shed = False
    if mode is Mode.ALONE:
        return _alone(state, sample, limits, baseline, memory)
    if mode is Mode.SHARED and state.mode is not Mode.SHARED:
        limit, shed = limits.floor, sample.in_flight > limits.floor
    elif _too_slow(sample, baseline, limits.target) or sample.waiting:
        limit = math.floor(limit * BACKOFF)
    elif sample.in_flight >= BINDING_SHARE * limit:
        limit += 1
    limit = min(max(limit, limits.floor), limits.ceiling)
    return Admission(limit=limit, mode=mode, baseline=baseline, shed=shed, **memory)


def _alone(state: Admission, sample: Sample, limits: Limits, baseline: float | None,
           memory: dict) -> Admission:
    """Rule 1: grow while it pays, never above what the server runs; probe again from
    the knee every PROBE_SECONDS."""
    fresh = state.mode is not Mode.ALONE  # a new alone spell: find the knee again
    s = Admission(limit=state.limit) if fresh else state
    limit, rate, knee, held_at = s.limit, s.rate, s.knee, s.held_at
    settled, total, misses = s.settled, s.total, s.misses
    binds = sample.in_flight >= BINDING_SHARE * limit
    queued = bool(sample.waiting)
    measured = None
    if queued and s.queued and not fresh:
        limit, knee, held_at = min(limit, sample.running), True, sample.at
        settled, total, misses = 0, 0.0, 0
    elif queued or not binds:
        pass
    elif sample.latency is None or sample.latency <= 0:
        if not knee:
            limit, settled, total, misses = math.ceil(limit * GROWTH), 0, 0.0, 0
    else:
        settled += 1
        if settled > 1:  # the first full sample at a limit carries its prefills
            total += min(sample.in_flight, sample.running) / sample.latency
            measured = total / (settled - 1)
    if measured is not None and knee:
        # Held: the rate at the held limit is measured all along, the reference a
        # probe must beat; a probe is one growth step, kept if it pays.
        if sample.at - held_at >= PROBE_SECONDS:
            limit, rate, knee = math.ceil(limit * GROWTH), measured, False
            settled, total, misses = 0, 0.0, 0
    elif measured is not None:
        if rate is None or measured >= rate * (1 + KNEE_GAIN):
            limit, rate = math.ceil(limit * GROWTH), measured
            settled, total, misses = 0, 0.0, 0
        elif settled - 1 >= KNEE_WINDOW:  # a whole window without the gain
            misses += 1
            settled, total = 1, 0.0  # measure a second window (no prefill to skip)
            if misses >= KNEE_MISSES:
                limit, knee, held_at = math.ceil(limit / GROWTH), True, sample.at
                settled, total, misses = 0, 0.0, 0
    limit = min(max(limit, limits.floor), limits.ceiling)
    return Admission(limit=limit, mode=Mode.ALONE, baseline=baseline, rate=rate,
                     settled=settled, total=total, misses=misses, knee=knee,
                     held_at=held_at, queued=queued, **memory)


def _baseline(baseline: float | None, latency: float | None) -> float | None:
    if latency is None or latency <= 0:
        return baseline
    if baseline is None:
        return latency
    return min(baseline * BASELINE_DRIFT, latency)


def _too_slow(sample: Sample, baseline: float | None, target: float) -> bool:
    return (sample.latency is not None and baseline is not None
            and sample.latency > target * baseline)


def signals(sample: Sample | None) -> dict:
    """What the last sample read, as /v1/pool/status and the admin show it."""
    if sample is None:
        return {}
    return {"in_flight": sample.in_flight, "server_running": sample.running,
            "server_waiting": sample.waiting, "others": sample.others,
            "inter_token_latency": _rounded(sample.latency),
            "time_to_first_token": _rounded(sample.ttft)}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
