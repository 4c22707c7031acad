"""A torn last line in the incremental file, as a writer that died mid-write leaves
it: the next append cuts it back to the last whole line before writing, so the
output holds whole lines only, each custom_id exactly once."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from tests.e2e.harness import chat_lines, output_ids, wait_until
from tests.faults.faults import assert_each_custom_id_once, request_ids


def whole_lines(path: Path) -> bytes:
    data = path.read_bytes()
    return data[:data.rfind(b"\n") + 1]


def tear_a_line(path: Path, make_fragment) -> tuple[int, bytes, bytes]:
    """Under the file's lock, as a writer holds it: append `make_fragment(content)`
    (no newline), as that writer's last write() before it died. Returns where the
    fragment starts, the content before it, and the fragment."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        torn_at = os.fstat(fd).st_size
        before = os.pread(fd, torn_at, 0)
        fragment = make_fragment(before)
        assert os.write(fd, fragment) == len(fragment)
        return torn_at, before, fragment
    finally:
        os.close(fd)


def test_torn_last_line_is_cut_by_the_next_append(start_server):
    # Given: a batch running for about 10 s, with results in its incremental file
    server, api = start_server(BATCHGEN_SIM_LATENCY_MS="200", BATCHGEN_MAX_POOL_SIZE="100",
                               BATCHGEN_CHUNK_SIZE="50")
    count = 5_000
    input_file = api.upload(chat_lines(count))
    batch = api.create_batch(input_file["id"]).json()
    output = server.storage / "incremental" / f"{batch['id']}.jsonl"
    wait_until(lambda: output.exists() and whole_lines(output).count(b"\n") >= 200,
               timeout=60, message="200 results in the incremental file")

    for cut in ("half a line", "a whole line without its newline"):
        # When: a result for a request not written yet is torn: the first half of its
        # line, or all of it but the newline (valid JSON, yet not a finished line)
        def torn_result(written: bytes, cut: str = cut) -> bytes:
            missing = sorted(request_ids(count) - set(output_ids(written)))[0]
            line = json.loads(written.splitlines()[-1])
            line["custom_id"] = missing
            line["id"] = "batch_req_torn"
            whole = json.dumps(line).encode()
            return whole[:len(whole) // 2] if cut == "half a line" else whole

        torn_at, written, fragment = tear_a_line(output, torn_result)

        # Then: the next append cuts the fragment and writes whole lines in its place;
        # nothing before it changes
        def repaired(torn_at: int = torn_at, fragment: bytes = fragment) -> bool:
            data = output.read_bytes()
            return (len(data) > torn_at and not data[torn_at:].startswith(fragment)
                    and b"\n" in data[torn_at:])

        wait_until(repaired, timeout=30, interval=0.05, message=f"{cut} to be repaired")
        data = output.read_bytes()
        assert data[:torn_at] == written
        for raw in whole_lines(output).splitlines():
            json.loads(raw)
        assert api.batch(batch["id"])["status"] == "in_progress", "the batch ended too soon"

    done = api.wait_status(batch["id"], {"completed", "failed", "cancelled"}, timeout=180)
    assert_each_custom_id_once(api, done, request_ids(count))
    assert b"batch_req_torn" not in api.content(done["output_file_id"])
