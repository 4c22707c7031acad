"""The chunk play's inputs, recorded for replay (BATCHGEN_ETA_RECORD).

Each refresh plays each model's open work (batches/estimates.play). With the setting
naming a file, the control worker appends one JSON line per model and refresh: when,
the model, one worker's rate and the model's, the swap delay, whether the deadline
policy decided the shares, the batches' loads (eta.Load), where their chunks were
(eta.Dispatch) and what the play made of it. `Recorded.replay` plays the same
inputs again with the eta module imported here, so a change to the play can be
measured against real runs' refreshes in seconds, not in a run of the engine each
(benchmarks/eta_replay.py). A diagnostic: off by default, one line of a few
kilobytes per model every refresh while it is on.

This module and eta/deadlines are plain Python: the replay needs no Django.
"""

from __future__ import annotations

import dataclasses
import gzip
import logging
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import orjson

from batches import deadlines, eta

logger = logging.getLogger(__name__)
_WRITING = threading.Lock()
_FAILED: set[str] = set()  # the paths said to fail, once each


@dataclass(frozen=True)
class Recorded:
    """One model's play at one refresh, as written."""

    at: float  # Unix seconds
    model: str
    one: float  # one worker's rate, cost units a second
    rate: float  # the model's
    delay: float  # seconds before any work starts (a swap)
    policy: bool  # the deadline policy's shares, else fair share
    loads: tuple[eta.Load, ...]
    state: eta.Dispatch
    played: dict[str, float]  # batch -> seconds until its work is done, delay included
    # What the rate and the costs came from: a prompt token's worth in output tokens,
    # and the model's recent intervals with work (estimates.Progress.spans: start,
    # end, decode units, prompt tokens computed, worker-seconds busy).
    prompt_weight: float = 0.0
    spans: tuple[tuple[float, float, float, float, float], ...] = ()

    def replay(self) -> dict[str, float]:
        """The play of the same inputs by this checkout's eta module."""
        shares = partial(deadlines.deadline_shares, rate=self.rate) if self.policy \
            else eta.fair_shares
        played = eta.chunk_finish_times(list(self.loads), self.state, self.one, shares)
        return {batch: seconds + self.delay for batch, seconds in played.items()}


def write(path: str | Path, recorded: Recorded) -> None:
    """Append `recorded` to the file at `path` as one JSON line. A file that cannot
    be written is said once, at WARNING, and the refresh goes on without it: a
    diagnostic never costs the ETAs."""
    line = orjson.dumps(dataclasses.asdict(recorded),
                        option=orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE)
    with _WRITING:
        try:
            with open(path, "ab") as out:
                out.write(line)
        except OSError as error:
            if str(path) not in _FAILED:
                _FAILED.add(str(path))
                logger.warning("cannot record the ETA's plays to %s (BATCHGEN_ETA_RECORD): "
                               "%s", path, error)


def read(path: str | Path) -> list[Recorded]:
    """Every play recorded in the file at `path` (gzip'd where it ends in .gz),
    oldest first. Fields a load or a worker of another version had and this one has
    not are left out; those this one has and the recording has not take their
    defaults."""
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rb") as recording:
        return [_parse(orjson.loads(line)) for line in recording if line.strip()]


def _parse(row: dict) -> Recorded:
    state = row["state"]
    workers = tuple(eta.Held(**_known(eta.Held, held | {
        "chunks": tuple(tuple(chunk) for chunk in held.get("chunks", ())),
        "left_steps": {int(place): steps for place, steps in held.get("left_steps", {}).items()},
        "started": None if held.get("started") is None else
        {int(place): count for place, count in held["started"].items()},
    })) for held in state["workers"])
    dispatch = eta.Dispatch(**_known(eta.Dispatch, state | {
        "workers": workers,
        "queued": tuple(tuple(chunk) for chunk in state.get("queued", ())),
        "pending": {batch: tuple(left) for batch, left in state.get("pending", {}).items()},
    }))
    return Recorded(at=row["at"], model=row["model"], one=row["one"], rate=row["rate"],
                    delay=row["delay"], policy=row["policy"],
                    loads=tuple(eta.Load(**_known(eta.Load, load)) for load in row["loads"]),
                    state=dispatch, played=row["played"],
                    prompt_weight=row.get("prompt_weight", 0.0),
                    spans=tuple(tuple(span) for span in row.get("spans", ())))


def _known(kind: type, fields: dict) -> dict:
    names = {field.name for field in dataclasses.fields(kind)}
    return {name: value for name, value in fields.items() if name in names}
