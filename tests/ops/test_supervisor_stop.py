"""The supervisor's stop, with stand-in programs (tests/faults/test_supervisor_stop.py
has the real server): bounded by its deadline whatever a program does, a second
signal kills at once, the broker stops after the programs that hand work back
through it, and a supervisor killed with SIGKILL takes its whole tree with it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from batchgen_site.storage_lock import StorageInUse, lock_storage
from batchgen_site.supervisor import Program, Supervisor
from tests.e2e.harness import ROOT, wait_until

# Ignores SIGTERM, as a program stuck in its stop would, and so does the child it
# starts (a grandchild of the supervisor); writes both pids to its argument.
STUBBORN = textwrap.dedent("""
    import os, pathlib, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = os.fork()
    if child == 0:
        time.sleep(600)
        os._exit(0)
    pathlib.Path(sys.argv[1]).write_text(f"{os.getpid()} {child}")
    time.sleep(600)
""")
# Stops a second after SIGTERM, writing the time it exits to its argument.
SLOW_TO_STOP = textwrap.dedent("""
    import pathlib, signal, sys, time
    path = pathlib.Path(sys.argv[1])
    def stop(*_):
        time.sleep(1)
        path.write_text(repr(time.time()))
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    path.write_text("ready")
    time.sleep(600)
""")
# Writes the time SIGTERM reached it to its argument, then exits.
NOTES_ITS_SIGTERM = textwrap.dedent("""
    import pathlib, signal, sys, time
    path = pathlib.Path(sys.argv[1])
    def stop(*_):
        path.write_text(repr(time.time()))
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    path.write_text("ready")
    time.sleep(600)
""")


def alive(pids: list[int]) -> list[int]:
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


def stubborn(tmp_path: Path, name: str = "stubborn") -> tuple[Program, Path]:
    pids = tmp_path / f"{name}.pids"
    return Program(name, [sys.executable, "-c", STUBBORN, str(pids)]), pids


def read_pids(path: Path) -> list[int]:
    text = wait_until(lambda: path.exists() and path.read_text(), timeout=30,
                      message=f"{path.name} to start")
    return [int(pid) for pid in text.split()]


def test_a_program_that_ignores_sigterm_is_killed_with_its_children_at_the_deadline(tmp_path):
    program, pids_file = stubborn(tmp_path)
    supervisor = Supervisor([program], stop_timeout=1.5)
    supervisor._spawn(program)
    pids = read_pids(pids_file)

    started = time.monotonic()
    supervisor.stop_all()
    took = time.monotonic() - started

    assert 1.4 < took < 3.0
    assert alive(pids) == []  # the program and its child


def test_a_second_signal_kills_at_once(tmp_path):
    program, pids_file = stubborn(tmp_path)
    supervisor = Supervisor([program], stop_timeout=60)
    supervisor._spawn(program)
    pids = read_pids(pids_file)

    supervisor.request_stop(signal.SIGINT)  # the first Ctrl-C: a stop of up to 60 s
    threading.Timer(0.5, supervisor.request_stop, args=(signal.SIGINT,)).start()
    started = time.monotonic()
    supervisor.stop_all()

    assert time.monotonic() - started < 3.0
    assert alive(pids) == []


def test_the_broker_stops_after_the_programs_that_hand_work_back_through_it(tmp_path):
    worker_exit, broker_term = tmp_path / "worker", tmp_path / "broker"
    broker = Program("broker", [sys.executable, "-c", NOTES_ITS_SIGTERM, str(broker_term)],
                     stops_last=True)
    worker = Program("inference1", [sys.executable, "-c", SLOW_TO_STOP, str(worker_exit)])
    supervisor = Supervisor([broker, worker], stop_timeout=10)
    for program in supervisor.programs:
        supervisor._spawn(program)
    wait_until(lambda: worker_exit.exists() and broker_term.exists(), timeout=30,
               message="both programs")

    supervisor.stop_all()

    assert float(broker_term.read_text()) >= float(worker_exit.read_text())
    assert worker.process.returncode == 0 and broker.process.returncode == 0


# A supervisor of two programs (one stuck in its stop, with a child) in a process of
# its own, so the test can SIGKILL it. Its stop deadline: 2 s.
SUPERVISOR = textwrap.dedent("""
    import sys
    from batchgen_site.supervisor import Program, Supervisor
    stuck = Program("stuck", [sys.executable, "-c", sys.argv[1], sys.argv[2]])
    idle = Program("idle", [sys.executable, "-c", "import time; time.sleep(600)"])
    Supervisor([stuck, idle], stop_timeout=2).run()
""")


def test_a_killed_supervisor_takes_its_whole_tree_with_it_by_the_deadline(tmp_path):
    pids_file, tree = tmp_path / "stuck.pids", []
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR, STUBBORN, str(pids_file)],
                                  cwd=ROOT, start_new_session=True)
    try:
        stuck, grandchild = read_pids(pids_file)
        tree = [p.pid for p in psutil.Process(supervisor.pid).children(recursive=True)]
        assert {stuck, grandchild} <= set(tree) and len(tree) >= 4  # + idle, the guard

        supervisor.kill()
        supervisor.wait()
        killed_at = time.monotonic()

        # The idle program goes at once (its death signal), the stuck one and its
        # child at the deadline (the stop guard), then the guard itself.
        wait_until(lambda: not alive(tree), timeout=4, interval=0.05,
                   message="the supervisor's tree to end")
        assert time.monotonic() - killed_at > 1.5  # the stuck one had its deadline
    finally:  # on a failure, what was left
        for pid in alive([supervisor.pid, *tree]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        supervisor.wait()


# Takes the lock and says so, then waits to be killed.
HOLDS_THE_LOCK = textwrap.dedent("""
    import pathlib, sys, time
    from batchgen_site.storage_lock import lock_storage
    lock_storage(pathlib.Path(sys.argv[1]))
    print("locked", flush=True)
    time.sleep(600)
""")


def test_one_serve_per_storage_path_until_its_holder_dies(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDS_THE_LOCK, str(tmp_path)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StorageInUse, match=rf"in use by .* \(serve, pid {holder.pid};"):
            lock_storage(tmp_path)
        # A GPU host's lock is its own: it runs beside the API host's serve.
        os.close(lock_storage(tmp_path, inference_only=True))
    finally:
        holder.kill()
        holder.wait()
    # The kernel released it with its holder: no stale lock to remove by hand.
    os.close(lock_storage(tmp_path))
