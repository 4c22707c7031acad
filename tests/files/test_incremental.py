"""The incremental file: whole lines only, torn tails repaired, failed writes undone,
appenders excluded from each other, results found by scanning."""

from __future__ import annotations

import errno
import fcntl
import json
import multiprocessing
import os
import queue
import threading

import pytest

from files import incremental
from files.incremental import append_lines, enclosing_line, locked, repair_tail, scan_results


def result_line(custom_id: str, *, error: bool = False, pad: int = 0) -> bytes:
    item = {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": None if error else {"status_code": 200, "body": {"text": "y" * pad}},
        "error": {"code": "context_length_exceeded", "message": "too long"} if error else None,
    }
    return json.dumps(item).encode() + b"\n"


@pytest.fixture
def path(tmp_path):
    return tmp_path / "incremental" / "batch_test.jsonl"


def test_append_creates_the_file_and_writes_whole_lines(path):
    lines = [result_line("a"), result_line("b")]

    written = append_lines(path, lines)

    assert written == sum(len(line) for line in lines)
    assert path.read_bytes() == b"".join(lines)


def test_append_of_nothing_writes_nothing(path):
    assert append_lines(path, []) == 0
    assert not path.exists()


def test_appends_accumulate_in_order(path):
    append_lines(path, [result_line("a")])
    append_lines(path, [result_line("b"), result_line("c")])

    assert path.read_bytes() == result_line("a") + result_line("b") + result_line("c")


def test_torn_last_line_is_cut_before_the_next_append(path):
    # Given a writer that crashed half-way through its line
    path.parent.mkdir(parents=True)
    path.write_bytes(result_line("a") + result_line("b")[:17])

    # When the next writer appends
    append_lines(path, [result_line("c")])

    # Then the torn line is gone and every line is whole
    assert path.read_bytes() == result_line("a") + result_line("c")


def test_a_file_that_is_only_a_torn_line_is_emptied_before_the_append(path):
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"custom_id": "half')

    append_lines(path, [result_line("c")])

    assert path.read_bytes() == result_line("c")


def test_a_torn_line_longer_than_one_read_block_is_cut_whole(path):
    path.parent.mkdir(parents=True)
    torn = result_line("big", pad=3 * 64 * 1024)[:-100]
    path.write_bytes(result_line("a") + torn)

    removed = repair_tail(path)

    assert removed == len(torn)
    assert path.read_bytes() == result_line("a")


def test_repair_leaves_a_whole_file_alone(path):
    path.parent.mkdir(parents=True)
    content = result_line("a") + result_line("b")
    path.write_bytes(content)

    assert repair_tail(path) == 0
    assert path.read_bytes() == content


def test_repair_of_a_missing_file_creates_nothing(path):
    assert repair_tail(path) == 0
    assert not path.exists()


@pytest.fixture
def filling_disk(monkeypatch, path):
    """os.write on the incremental file as on a volume filling up: the first write
    takes half the bytes, then returns short (`short`) or fails with ENOSPC; every
    later write fails with ENOSPC, unless there is `room` again. Other descriptors
    are left alone."""
    real_write = os.write

    def install(*, short: bool, room: bool = False):
        calls = []

        def write(fd, data):
            if os.path.realpath(f"/proc/self/fd/{fd}") != str(path.resolve()):
                return real_write(fd, data)
            calls.append(len(data))
            if len(calls) == 1:
                written = real_write(fd, bytes(data[: len(data) // 2]))
                if short:
                    return written
            elif room:
                return real_write(fd, data)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(incremental.os, "write", write)
        return calls

    return install


@pytest.mark.parametrize("short", [False, True], ids=["enospc", "short-write-then-enospc"])
def test_full_disk_raises_enospc_and_leaves_the_file_as_it_was(path, filling_disk, short):
    append_lines(path, [result_line("a")])
    before = path.read_bytes()
    filling_disk(short=short)

    # A short write is continued, so the kernel's own error is what surfaces
    with pytest.raises(OSError) as raised:
        append_lines(path, [result_line("b"), result_line("c")])

    assert raised.value.errno == errno.ENOSPC
    assert path.read_bytes() == before


def test_short_write_is_continued_to_the_whole_lines(path, filling_disk):
    append_lines(path, [result_line("a")])
    before = path.read_bytes()
    calls = filling_disk(short=True, room=True)

    append_lines(path, [result_line("b"), result_line("c")])

    new = result_line("b") + result_line("c")
    assert path.read_bytes() == before + new
    assert calls == [len(new), len(new) - len(new) // 2]


def test_failed_write_after_a_torn_tail_keeps_the_repair_and_nothing_else(
        path, filling_disk):
    path.parent.mkdir(parents=True)
    path.write_bytes(result_line("a") + b'{"custom_id": "to')
    filling_disk(short=False)

    with pytest.raises(OSError):
        append_lines(path, [result_line("b")])

    assert path.read_bytes() == result_line("a")


# --- concurrent appenders -----------------------------------------------------------------


def _try_lock(path_str: str, answer) -> None:
    fd = os.open(path_str, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        answer.put("blocked")
    else:
        answer.put("acquired")
    finally:
        os.close(fd)


def test_lock_is_exclusive_between_threads_of_one_process(path):
    answer = queue.SimpleQueue()
    with locked(path):
        thread = threading.Thread(target=_try_lock, args=(str(path), answer))
        thread.start()
        thread.join()
    assert answer.get() == "blocked"


def test_lock_is_exclusive_across_processes(path):
    context = multiprocessing.get_context("fork")
    answer = context.SimpleQueue()

    with locked(path):
        holder = context.Process(target=_try_lock, args=(str(path), answer))
        holder.start()
        holder.join()
        while_held = answer.get()
    after = context.Process(target=_try_lock, args=(str(path), answer))
    after.start()
    after.join()

    assert while_held == "blocked"
    assert answer.get() == "acquired"


def _append_many(path_str: str, writer: int, count: int, pad: int) -> None:
    from pathlib import Path

    for i in range(count):
        append_lines(Path(path_str), [result_line(f"w{writer}-{i}", pad=pad),
                                      result_line(f"w{writer}-{i}-err", error=True)])


def assert_every_line_whole_and_once(path, expected_ids: set[str]) -> None:
    content = path.read_bytes()
    assert content.endswith(b"\n")
    ids = [json.loads(raw)["custom_id"] for raw in content.splitlines()]
    assert len(ids) == len(set(ids))
    assert set(ids) == expected_ids


def test_concurrent_processes_append_without_interleaving(path):
    writers, count, pad = 6, 150, 20_000  # lines of ~20 KB, several pages per write
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"custom_id": "torn')  # a crashed writer's leftover
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_append_many, args=(str(path), w, count, pad))
                 for w in range(writers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()

    assert all(p.exitcode == 0 for p in processes)
    assert_every_line_whole_and_once(path, {
        f"w{w}-{i}{suffix}" for w in range(writers) for i in range(count)
        for suffix in ("", "-err")
    })


def test_concurrent_threads_of_one_process_append_without_losing_lines(path, monkeypatch):
    # A worker runs several chunks of one batch on threads of one process, and
    # POSIX record locks do not exclude threads of the same process. Split every
    # write in two with a yield between, as the kernel may expose a large write
    # in pieces: a writer that is not excluded then sees a "torn" tail and cuts
    # another thread's line.
    real_write = os.write

    def split_write(fd, data):
        half = len(data) // 2
        first = real_write(fd, bytes(data[:half]))
        os.sched_yield()
        return first + real_write(fd, bytes(data[half:]))

    monkeypatch.setattr(incremental.os, "write", split_write)
    writers, count = 8, 200
    start = threading.Barrier(writers)
    errors: list[BaseException] = []

    def run(writer: int) -> None:
        try:
            start.wait()
            _append_many(str(path), writer, count, pad=100)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert_every_line_whole_and_once(path, {
        f"w{w}-{i}{suffix}" for w in range(writers) for i in range(count)
        for suffix in ("", "-err")
    })


# --- scan_results ---------------------------------------------------------------------


def test_scan_finds_successes_and_errors_of_the_asked_ids(path):
    append_lines(path, [result_line("ok"), result_line("bad", error=True),
                        result_line("other")])

    found = scan_results(path, {"ok", "bad", "missing"})

    assert found == {"ok": True, "bad": False}


def test_scan_ignores_a_torn_tail(path):
    append_lines(path, [result_line("ok")])
    with path.open("ab") as fh:
        fh.write(result_line("torn")[:-1])  # the whole JSON, but no newline yet

    assert scan_results(path, {"ok", "torn"}) == {"ok": True}


def test_scan_skips_lines_that_are_not_json(path):
    path.parent.mkdir(parents=True)
    path.write_bytes(b"garbage\n" + result_line("ok"))

    assert scan_results(path, {"ok"}) == {"ok": True}


def test_scan_of_a_missing_file_or_no_ids_finds_nothing(path):
    assert scan_results(path, {"a"}) == {}
    append_lines(path, [result_line("a")])
    assert scan_results(path, set()) == {}


def test_enclosing_line_is_none_at_a_line_start_and_the_line_around_any_other_offset(tmp_path):
    path = tmp_path / "out.jsonl"
    long_line = b"x" * (3 * 64 * 1024) + b"\n"  # longer than a read block both ways
    path.write_bytes(b"a\n" + long_line + b"torn")

    assert [enclosing_line(path, at) for at in (0, 2, 2 + len(long_line))] == [None] * 3
    assert enclosing_line(path, 1) == (0, 2)
    assert enclosing_line(path, 100_000) == (2, 2 + len(long_line))
    assert enclosing_line(path, 2 + len(long_line) + 2) == (2 + len(long_line), path.stat().st_size)
