"""Stalled uploads against polls (issue 13, item 2).

Starts a real server (`manage.py serve`, the web settings `make run` uses unless
`--web-workers`/`--args` say otherwise), opens N connections that each send the head
of a `POST /v1/files` announcing 100,000 bytes and then nothing, and meanwhile times
10 `GET /health` and 10 `GET /v1/pool/status` (each on a new connection, 4 s timeout).
Then it waits for the server to close the stalled connections.

Reported per N: polls answered within 4 s, their median and slowest time, and the
seconds until the server had closed every stalled connection (or "open" after
`--close-timeout`).

    .venv/bin/python benchmarks/slow_clients.py                 # N = 16 and 64
    .venv/bin/python benchmarks/slow_clients.py --stalls 8 16 --args --client-timeout 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    machine_info,
    mark_start,
    print_table,
    running_server,
    scratch_dir,
    write_results,
)

from batchgen_site.management.commands.serve import DEFAULT_WEB_WORKERS  # noqa: E402
from tests.faults.stalls import (  # noqa: E402
    close_all,
    open_stalled_uploads,
    time_requests,
    wait_all_closed,
)

POLL_TIMEOUT = 4.0
POLLS = ["/health", "/v1/pool/status"] * 10


def measure(server, stalls: int, close_timeout: float) -> dict:
    sockets = open_stalled_uploads(server.port, stalls)
    try:
        timed = time_requests(server.base_url, POLLS, timeout=POLL_TIMEOUT)
        closed_after = wait_all_closed(sockets, timeout=close_timeout)
    finally:
        close_all(sockets)
    answered = [t.seconds for t in timed if t.status == 200]
    return {
        "stalled_connections": stalls,
        "polls": len(timed),
        "answered_within_4s": len(answered),
        "median_s": round(statistics.median(t.seconds for t in timed), 3),
        "slowest_s": round(max(t.seconds for t in timed), 3),
        "stalled_closed_after_s": None if closed_after is None else round(closed_after, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stalls", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--close-timeout", type=float, default=60.0)
    parser.add_argument("--web-workers", type=int, default=DEFAULT_WEB_WORKERS,
                        help="default: serve's own (twice the cores, 2 to 8)")
    parser.add_argument("--label", default="after")
    parser.add_argument("--args", nargs=argparse.REMAINDER, default=[],
                        help="further arguments for manage.py serve")
    options = parser.parse_args()
    mark_start()
    rows, runs = [], []
    with scratch_dir("slow-clients") as scratch:
        for stalls in options.stalls:
            # A fresh server per N: closed connections of the previous run do not linger.
            args = ["--web-workers", str(options.web_workers), *options.args]
            with running_server(scratch / f"storage-{stalls}", args=args) as server:
                run = measure(server, stalls, options.close_timeout)
            runs.append(run)
            closed = run["stalled_closed_after_s"] or f"open after {options.close_timeout:.0f}"
            rows.append([stalls, f"{run['answered_within_4s']}/{run['polls']}",
                         run["median_s"], run["slowest_s"], closed])
    print_table(f"stalled uploads ({options.label})",
                ["stalled", "polls answered < 4 s", "median s", "slowest s", "stalls closed s"],
                rows)
    write_results(f"slow_clients-{options.label}",
                  {"machine": machine_info(), "web_workers": options.web_workers,
                   "serve_args": options.args, "runs": runs})


if __name__ == "__main__":
    main()
