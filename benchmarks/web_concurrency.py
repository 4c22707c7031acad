"""Honest concurrency against the web server, beside stalled clients (issue 26, item 1).

Starts a real server with `make run`'s web settings (`manage.py serve`, the simulated
engine) and, in this order:

1. 32 clients each upload a 2 MiB JSONL at once (each on its own connection,
   released together by a barrier);
2. 64 clients each create a batch at once, each on a file of its own;
3. 20 clients upload the same 2 MiB file at once;
4. 64 connections send the head of an upload and then nothing; meanwhile 10
   `GET /health` and 10 `GET /v1/pool/status` are timed (4 s timeout), then the
   seconds until the server closed the stalled connections.

Reported: the answers of each burst by status (and error code), the polls' median and
slowest time, the stalls' closing time. `--checkout DIR` runs the same against another
checkout first (e.g. `git archive <commit> | tar -x -C DIR`), for a before/after pair
in one run.

    .venv/bin/python benchmarks/web_concurrency.py
    .venv/bin/python benchmarks/web_concurrency.py --checkout /tmp/before --rounds 3
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import threading
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    MiB,
    Server,
    machine_info,
    mark_start,
    print_table,
    scratch_dir,
    server_env,
    write_results,
)

from tests.faults.stalls import (  # noqa: E402
    close_all,
    open_stalled_uploads,
    time_requests,
    wait_all_closed,
)

UPLOADS, CREATES, SAME_FILE, STALLS = 32, 64, 20, 64
POLLS = ["/health", "/v1/pool/status"] * 5


def jsonl(size: int, tag: str) -> bytes:
    """About `size` bytes of valid chat lines for the simulated model "m"."""
    lines, total, i = [], 0, 0
    while total < size:
        line = (f'{{"custom_id": "{tag}-{i}", "method": "POST", "url": "/v1/chat/completions", '
                f'"body": {{"model": "m", "messages": [{{"role": "user", "content": '
                f'"Say something about the number {i} in a few words."}}]}}}}\n').encode()
        lines.append(line)
        total += len(line)
        i += 1
    return b"".join(lines)


def at_once(count: int, call) -> list:
    """`call(i)` from `count` threads released together; what each returned."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def run(i: int) -> None:
        barrier.wait()
        results[i] = call(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def outcome(response: httpx.Response | Exception) -> str:
    if isinstance(response, Exception):
        return type(response).__name__
    if response.status_code == 200:
        return "200"
    try:
        return f"{response.status_code} {response.json()['error']['code']}"
    except (ValueError, KeyError, TypeError):
        return str(response.status_code)


def request(base_url: str, method: str, path: str, **kwargs) -> httpx.Response | Exception:
    try:
        with httpx.Client(base_url=base_url, timeout=60) as http:
            return http.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        return exc


def upload(base_url: str, content: bytes, name: str):
    return request(base_url, "POST", "/v1/files", data={"purpose": "batch"},
                   files={"file": (name, content, "application/jsonl")})


def probe(server: Server) -> dict:
    base = server.base_url
    files = [jsonl(2 * MiB, f"u{i}") for i in range(UPLOADS)]
    uploads = at_once(UPLOADS, lambda i: upload(base, files[i], f"u{i}.jsonl"))
    # Each create needs a file of its own (a second batch on one file is refused):
    # the uploads that succeeded, and small ones uploaded one after the other.
    file_ids = [r.json()["id"] for r in uploads
                if not isinstance(r, Exception) and r.status_code == 200]
    while len(file_ids) < CREATES:
        answer = upload(base, jsonl(1024, f"s{len(file_ids)}"), "small.jsonl")
        file_ids.append(answer.json()["id"])
    creates = at_once(CREATES, lambda i: request(base, "POST", "/v1/batches", json={
        "input_file_id": file_ids[i], "endpoint": "/v1/chat/completions",
        "completion_window": "24h"}))
    same = jsonl(2 * MiB, "same")
    same_file = at_once(SAME_FILE, lambda i: upload(base, same, "same.jsonl"))

    stalled = open_stalled_uploads(server.port, STALLS)
    try:
        polls = time_requests(base, POLLS, timeout=4.0)
        closed_after = wait_all_closed(stalled, timeout=60)
    finally:
        close_all(stalled)
    return {
        "uploads_32": dict(collections.Counter(map(outcome, uploads))),
        "creates_64": dict(collections.Counter(map(outcome, creates))),
        "same_file_20": dict(collections.Counter(map(outcome, same_file))),
        "polls_answered_within_4s": sum(p.status == 200 for p in polls),
        "polls": len(polls),
        "poll_median_s": round(statistics.median(p.seconds for p in polls), 3),
        "poll_slowest_s": round(max(p.seconds for p in polls), 3),
        "stalls_closed_after_s": None if closed_after is None else round(closed_after, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path,
                        help="another checkout to run first (the code before a change)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--name", default="web_concurrency")
    options = parser.parse_args()
    mark_start()
    plan = [("before", options.checkout)] if options.checkout else []
    plan.append(("after", None))
    runs, rows = [], []
    with scratch_dir("web-concurrency") as scratch:
        for round_ in range(options.rounds):
            for label, checkout in plan:
                storage = scratch / f"{label}-{round_}" / "storage"
                storage.parent.mkdir(parents=True)
                kwargs = {"root": checkout} if checkout else {}
                # web_workers=None: serve's own default, as `make run` starts it.
                server = Server(storage=storage, env=server_env(storage=storage),
                                web_workers=None, **kwargs)
                try:
                    server.start(ready_timeout=180)
                    run = {"label": label, "round": round_, **probe(server)}
                finally:
                    server.stop()
                runs.append(run)
                print(run, flush=True)
                rows.append([label, round_, run["uploads_32"], run["creates_64"],
                             run["same_file_20"],
                             f"{run['polls_answered_within_4s']}/{run['polls']}",
                             run["poll_slowest_s"], run["stalls_closed_after_s"]])
    print_table("honest concurrency beside 64 stalled uploads",
                ["code", "round", "32 uploads", "64 creates", "20 of one file",
                 "polls < 4 s", "slowest poll s", "stalls closed s"], rows)
    write_results(options.name, {"machine": machine_info(), "runs": runs})


if __name__ == "__main__":
    main()
