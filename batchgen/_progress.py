"""A tqdm bar that follows a batch's request counts between polls."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import IO

from tqdm import tqdm


def server_eta(batch: dict) -> str:
    """The server's estimated completion as a bar's postfix (", done ~14:05:09"),
    with a window at risk said; empty while the server has none."""
    when = batch.get("estimated_completion_at")
    if not isinstance(when, int | float):
        return ""
    text = f", done ~{datetime.fromtimestamp(when).astimezone():%H:%M:%S}"
    return text + " (window at risk)" if batch.get("at_risk") else text


class BatchProgress:
    """Shows finished (completed + failed) of total requests, the failed count, the
    rate and tqdm's ETA (this batch's own pace), and the server's ETA (the
    scheduler's model: the work ahead and beside it); the description is the batch
    status. Use as a context manager
    and call `update(batch)` with every polled batch object."""

    def __init__(self, *, file: IO[str] | None = None, disable: bool = False):
        self._bar = tqdm(
            total=None, unit="req", desc="validating", dynamic_ncols=True,
            file=file or sys.stderr, disable=disable,
        )
        self._done = 0

    def update(self, batch: dict) -> None:
        counts = batch.get("request_counts") or {}
        total = counts.get("total") or None
        completed = counts.get("completed") or 0
        failed = counts.get("failed") or 0
        if total is not None and self._bar.total != total:
            self._bar.total = total
        self._bar.set_description_str(str(batch.get("status")), refresh=False)
        self._bar.set_postfix_str(f"failed={failed}{server_eta(batch)}", refresh=False)
        done = completed + failed
        shown = False
        if done >= self._done:
            # update() rather than setting n, so tqdm keeps the rate and ETA right.
            shown = self._bar.update(done - self._done)
        else:  # counts never go down; if a server says they did, show its figure
            self._bar.n = done
        self._done = done
        if not shown:
            self._bar.refresh()

    def write(self, line: str, *, file: IO[str] | None = None) -> None:
        """Print a line without tearing the bar."""
        self._bar.write(line, file=file or sys.stdout)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> BatchProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
