"""A chunk's finished results waiting to go up to an object store as one segment.

On an object store each write is a new object (files/segments.py): a PUT, a ledger
row, a GET when the output is composed and a DELETE after it. Written at every drain
of the result queue, a chunk on a fast engine, or one whose results trickle in over
minutes, makes a small object every half second. Held here, its results go up as one
segment per SEGMENT_SECONDS (or sooner once SEGMENT_BYTES wait), and the rest when the
chunk's loop ends. What waits here is neither written nor counted, so a worker that
dies meanwhile loses nothing the next attempt does not run again; the incremental view
shows a result at most SEGMENT_SECONDS (plus a drain) later than on a path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# The longest a finished result waits before it is written (the incremental view's lag).
SEGMENT_SECONDS = 2.0
# Written sooner once this many bytes of lines wait: a segment stays a part-sized object.
SEGMENT_BYTES = 8 * 1024 * 1024


@dataclass
class HeldResults:
    finished: list = field(default_factory=list)  # (custom_id, EngineResult)
    lines: list[bytes] = field(default_factory=list)  # their output lines
    size: int = 0
    since: float = 0.0  # when the oldest one came

    def add(self, finished: list, lines: list[bytes]) -> None:
        if finished and not self.finished:
            self.since = time.monotonic()
        self.finished += finished
        self.lines += lines
        self.size += sum(map(len, lines))

    def due(self) -> bool:
        return bool(self.finished) and (self.size >= SEGMENT_BYTES or
                                        time.monotonic() - self.since >= SEGMENT_SECONDS)

    def take(self) -> tuple[list, list[bytes]]:
        taken = self.finished, self.lines
        self.finished, self.lines, self.size = [], [], 0
        return taken
