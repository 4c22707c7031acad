"""Honest concurrency against the real web server with `make run`'s web settings, beside
stalled uploads (issue 26, item 1): every request is answered 200, none 503. A cap
on the threads reading request bodies refused about half of them; the worker now
reads each request whole in its event loop before a thread serves it."""

from __future__ import annotations

import collections
import threading

import httpx

from batchgen_site.management.commands.serve import DEFAULT_WEB_WORKERS
from tests.faults.stalls import close_all, open_stalled_uploads, time_requests

MiB = 1024 * 1024
STALLS = 64
PROMPT = 2.0  # seconds a poll may take on this loaded two-core machine


def jsonl(size: int, tag: str) -> bytes:
    lines, total, i = [], 0, 0
    while total < size:
        line = (f'{{"custom_id": "{tag}-{i}", "method": "POST", "url": "/v1/chat/completions", '
                f'"body": {{"model": "m", "messages": [{{"role": "user", '
                f'"content": "Say something about {i}."}}]}}}}\n').encode()
        lines.append(line)
        total += len(line)
        i += 1
    return b"".join(lines)


def at_once(count: int, call) -> list:
    """`call(i)` on `count` threads released together (each its own connection)."""
    barrier = threading.Barrier(count)
    answers: list = [None] * count

    def run(i: int) -> None:
        barrier.wait()
        try:
            with httpx.Client(timeout=60) as http:
                answers[i] = call(http, i)
        except httpx.HTTPError as exc:
            answers[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def statuses(answers: list) -> dict:
    return dict(collections.Counter(
        a.status_code if isinstance(a, httpx.Response) else type(a).__name__
        for a in answers))


def test_concurrent_uploads_and_creates_all_succeed_beside_64_stalled_uploads(start_server):
    # Given: the server as `make run` starts it (its web processes, threads and
    # client deadlines), and 64 connections that sent an upload's head and stall
    server, _ = start_server(args=["--web-workers", str(DEFAULT_WEB_WORKERS)])
    url = server.base_url
    stalled = open_stalled_uploads(server.port, STALLS)
    try:
        # When: 32 clients upload a 2 MiB JSONL at once
        files = [jsonl(2 * MiB, f"u{i}") for i in range(32)]
        uploads = at_once(32, lambda http, i: http.post(
            f"{url}/v1/files", data={"purpose": "batch"},
            files={"file": (f"u{i}.jsonl", files[i])}))
        # then 64 clients create a batch at once, each on a file of its own (the
        # uploads' files, and small ones uploaded at once too)
        file_ids = [a.json()["id"] for a in uploads if isinstance(a, httpx.Response)
                    and a.status_code == 200]
        small = at_once(64 - len(file_ids), lambda http, i: http.post(
            f"{url}/v1/files", data={"purpose": "batch"},
            files={"file": ("small.jsonl", jsonl(1024, f"s{i}"))}))
        file_ids += [a.json()["id"] for a in small if isinstance(a, httpx.Response)
                     and a.status_code == 200]
        creates = at_once(64, lambda http, i: http.post(f"{url}/v1/batches", json={
            "input_file_id": file_ids[i], "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}))
        # and 20 clients upload the same file at once
        same = jsonl(2 * MiB, "same")
        same_file = at_once(20, lambda http, i: http.post(
            f"{url}/v1/files", data={"purpose": "batch"}, files={"file": ("same.jsonl", same)}))
        polls = time_requests(url, ["/health", "/v1/pool/status"] * 3, timeout=10)

        # Then: every one of them is answered 200, and polls stay prompt, while the
        # stalled uploads still hold their connections
        assert statuses(uploads) == {200: 32}
        assert statuses(small) == {200: 32}
        assert statuses(creates) == {200: 64}
        assert statuses(same_file) == {200: 20}
        assert [p.status for p in polls] == [200] * 6
        assert max(p.seconds for p in polls) < PROMPT, polls
        assert {a.json()["bytes"] for a in same_file} == {len(same)}
    finally:
        close_all(stalled)
    assert "Traceback" not in server.log(tail=100_000)
