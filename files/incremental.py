"""The incremental file: `{storage}/incremental/{batch_id}.jsonl`, shared by every
worker that runs a chunk of the batch, on any host that mounts the storage path.

Each append takes an exclusive flock() on its own open file description (so it
excludes other threads of the same worker as well as other processes, and closing
an unrelated reader's handle cannot drop it; Linux maps flock on NFS to a lock the
server's lock manager enforces across hosts), repairs a torn last line a crashed
writer may have left, and writes the new complete lines with a single write() to an
O_APPEND descriptor. A
reader (`tail -f`, the download) therefore only ever sees whole lines, except for
a torn tail between a crash and the next append, which nothing counts.
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

_BLOCK = 64 * 1024


@contextmanager
def locked(path: Path) -> Iterator[int]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd  # closing the descriptor releases the lock
    finally:
        os.close(fd)


def _repair(fd: int) -> int:
    """Cut a torn last line (no trailing newline) back to the last whole line.
    Returns the number of bytes removed. The caller holds the lock."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return 0
    end = size
    while end > 0:
        start = max(0, end - _BLOCK)
        block = os.pread(fd, end - start, start)
        cut = block.rfind(b"\n")
        if cut >= 0:
            keep = start + cut + 1
            os.ftruncate(fd, keep)
            return size - keep
        end = start
    os.ftruncate(fd, 0)
    return size


def repair_tail(path: Path) -> int:
    """Repair a torn last line of an incremental file (no-op when it is whole)."""
    if not path.exists():
        return 0
    with locked(path) as fd:
        return _repair(fd)


def append_lines(path: Path, lines: Iterable[bytes]) -> int:
    """Append whole lines (each ending in a newline) with one write under the lock.

    A write that comes back short (a volume with a few bytes left) is continued, so
    a full disk surfaces as the kernel's own error (ENOSPC, EDQUOT), not as a
    mystery; on any failure the file is cut back to where it was, so nothing
    half-written stays, and the error propagates."""
    data = memoryview(b"".join(lines))
    if not data:
        return 0
    with locked(path) as fd:
        _repair(fd)
        before = os.fstat(fd).st_size
        try:
            done = 0
            while done < len(data):
                written = os.write(fd, data[done:])
                if written == 0:  # not seen on Linux; never loop forever on it
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                done += written
        except OSError:
            os.ftruncate(fd, before)
            raise
    return len(data)


PROBE_BYTES = 64 * 1024  # a few results' worth: room for this much, and a paused worker resumes


def probe_room(directory: Path, size: int = PROBE_BYTES) -> None:
    """Write `size` bytes to a scratch file in `directory`, sync and remove it. Raises
    the volume's own error (ENOSPC, EDQUOT; some network file systems say so only at
    the sync) while there is no room for them."""
    fd, name = tempfile.mkstemp(prefix=".room-", dir=directory)
    try:
        data = memoryview(bytes(size))
        done = 0
        while done < size:
            written = os.write(fd, data[done:])
            if written == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)
            done += written
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(name)


def scan_results(path: Path, custom_ids: set[str]) -> dict[str, bool]:
    """Which of `custom_ids` already have a whole line in the file, and whether that
    line is a success (True) or an error (False). Reads the file once, streaming."""
    found: dict[str, bool] = {}
    if not path.exists() or not custom_ids:
        return found
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break  # a torn tail is not a result
            try:
                item = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            custom_id = item.get("custom_id")
            if custom_id in custom_ids:
                found[custom_id] = item.get("error") is None
    return found


def whole_lines_end(path: Path) -> int:
    """The byte length of the file's whole lines (a torn or in-flight tail excluded)."""
    if not path.exists():
        return 0
    with path.open("rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        while end > 0:
            start = max(0, end - _BLOCK)
            fh.seek(start)
            block = fh.read(end - start)
            cut = block.rfind(b"\n")
            if cut >= 0:
                return start + cut + 1
            end = start
    return 0


def enclosing_line(path: Path, offset: int) -> tuple[int, int] | None:
    """None when `offset` starts a line of the file; else where the line that holds
    it starts and where the next one starts (its end, when it is the torn tail).
    Reads only that line, in bounded blocks."""
    if offset == 0:
        return None
    with path.open("rb") as fh:
        fh.seek(offset - 1)
        if fh.read(1) in (b"\n", b""):
            return None
        start = offset
        while start > 0:
            block_start = max(0, start - _BLOCK)
            fh.seek(block_start)
            cut = fh.read(start - block_start).rfind(b"\n")
            if cut >= 0:
                start = block_start + cut + 1
                break
            start = block_start
        fh.seek(offset)
        end = offset
        while block := fh.read(_BLOCK):
            cut = block.find(b"\n")
            if cut >= 0:
                return start, end + cut + 1
            end += len(block)
        return start, end


def read_range(path: Path, start: int, end: int) -> Iterator[bytes]:
    """Stream [start, end) of a file in bounded blocks."""
    with path.open("rb") as fh:
        fh.seek(start)
        remaining = end - start
        while remaining > 0:
            block = fh.read(min(remaining, 1024 * 1024))
            if not block:
                return
            remaining -= len(block)
            yield block
