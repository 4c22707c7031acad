"""The supervisor's stop guard: a tiny process of its own session that ends what the
supervisor started when the supervisor cannot, because it died (`kill -9`, the OOM
killer, a container runtime's SIGKILL after its grace period).

Why a process and not only PR_SET_PDEATHSIG: the death signal reaches the
supervisor's children alone (the kernel clears it in their own children: gunicorn's
workers, Celery beat and pool, vLLM's engine core and compute workers), and nothing
bounds how long a child then takes to stop. The guard knows every program's process
group and a deadline, and the kernel tells it when the supervisor is gone: the write
end of its stdin closes with the supervisor, however it died.

Protocol on stdin, one line each, written by batchgen_site/supervisor.py:
`start PGID` (a program started in a process group of its own), `end PGID` (its
group is gone: that number may be reused), `stop` (the supervisor began its own
bounded stop: the deadline counts from here), `done` (every group is gone: exit
without acting). End of file without `done`: SIGTERM every group left (a program
stops as on the supervisor's own stop: an inference worker hands its chunks back),
SIGKILL what is left at the deadline, and exit.

It also holds the storage lock (batchgen_site/storage_lock.py), inherited from the
supervisor, so a new `serve` cannot start on the storage path until the old tree is
gone. Standard library only, run with `python -I`: it starts in milliseconds and
imports nothing of BatchGen's that could fail."""

from __future__ import annotations

import os
import signal
import sys
import time

POLL = 0.05  # seconds between looks at the groups while they stop


def group_alive(pgid: int) -> bool:
    """Whether process group `pgid` still runs anything. A zombie runs nothing and
    holds no port or file, but counts for kill(0): waiting on one would wait for
    whoever reaps it (init, which here may never)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                text = stat.read()
        except OSError:
            continue
        # After the command, which may hold spaces and parentheses: state ppid pgrp ...
        state, _ppid, pgrp = text[text.rindex(b")") + 2:].split()[:3]
        if state != b"Z" and int(pgrp) == pgid:
            return True
    return False


def signal_groups(groups, sig: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_groups(groups: set[int], deadline: float) -> None:
    """SIGTERM the groups, wait for them until `deadline`, SIGKILL what is left."""
    signal_groups(groups, signal.SIGTERM)
    while groups and time.monotonic() < deadline:
        groups = {pgid for pgid in groups if group_alive(pgid)}
        time.sleep(POLL)
    groups = {pgid for pgid in groups if group_alive(pgid)}
    if groups:
        print(f"stop guard: killing process group(s) {sorted(groups)} left at the "
              "deadline", file=sys.stderr, flush=True)
        signal_groups(groups, signal.SIGKILL)


def main(timeout: float) -> int:
    # Ctrl-C and a terminal's hang-up are for the supervisor, which tells the guard.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    groups: set[int] = set()
    stopping_since: float | None = None
    for line in sys.stdin.buffer:
        word, _, arg = line.decode(errors="replace").strip().partition(" ")
        if word == "start":
            groups.add(int(arg))
        elif word == "end":
            groups.discard(int(arg))
        elif word == "stop":
            stopping_since = time.monotonic()
        elif word == "done":
            return 0
    # The supervisor is gone with its work undone.
    now = time.monotonic()
    print(f"stop guard: the supervisor is gone; stopping {len(groups)} process group(s)",
          file=sys.stderr, flush=True)
    end_groups(groups, (stopping_since if stopping_since is not None else now) + timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1])))
