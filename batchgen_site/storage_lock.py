"""One `serve` per storage path: an exclusive flock on a file in it, taken before
anything touches the storage (the embedded broker's socket, the SQLite database, the
beat schedule), so a second server there refuses to start and names the first's pid.
The kernel releases the lock when its last holder dies, however it dies: no stale
pid file to clean up by hand. The supervisor's stop guard inherits it
(batchgen_site/stop_guard.py), so it is free again once the whole tree is gone.

Hosts of a fleet share one storage path (NFS, which carries flock as a POSIX lock):
the API host takes `serve.lock`; a GPU host (`serve --inference-only`) takes a lock of
its own host name, so GPU hosts and the API host run side by side, but not two
`serve`s on one host."""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path


class StorageInUse(Exception):
    """Another `serve` holds the storage path; the message names its pid."""


def lock_name(*, inference_only: bool) -> str:
    return f"serve-inference-only.{socket.gethostname()}.lock" if inference_only else "serve.lock"


def lock_storage(storage: Path, *, inference_only: bool = False) -> int:
    """Take the lock for this process; returns its file descriptor, to be kept open
    (closing it releases the lock). Raises StorageInUse if another process holds it."""
    storage.mkdir(parents=True, exist_ok=True)
    path = storage / lock_name(inference_only=inference_only)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StorageInUse(
            f"storage path {storage} is in use by another BatchGen server (serve, pid "
            f"{holder}; lock {path}): stop it first, or give this one another "
            "--storage-path") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
