"""A small process supervisor for `manage.py serve`: starts BatchGen's processes,
restarts any that dies (with exponential backoff, logged), and stops them all on
Ctrl-C or SIGTERM, as systemd or a container restart policy would in production.
A program that exits with EX_CONFIG (78: its configuration can never work, e.g. an
engine that cannot start with its settings) is not restarted, as systemd's
RestartPreventExitStatus=78 would have it: one line says why, from the termination
log the program wrote (as Kubernetes reads a container's terminationMessagePath).
With a CPU engine it also keeps them off the CPUs vLLM computes on
(batchgen_site/cpu_placement.py).

Stopping is bounded (docs/operations.md, "Stopping"): SIGINT or SIGTERM signals every
program at once but the broker, which stops last, and whatever is left at
BATCHGEN_STOP_TIMEOUT_SECONDS is killed with its whole process group; a second
signal kills everything at once. Nothing outlives the supervisor however it dies:
each child gets its stop signal from the kernel when the supervisor dies
(PR_SET_PDEATHSIG), and the stop guard (batchgen_site/stop_guard.py) ends their
process groups, grandchildren included, by the same deadline."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from batchgen_site import stop_guard
from batchgen_site.cpu_placement import CpuPlacement, program_tree
from batchgen_site.stop_guard import group_alive
from core.termination import TERMINATION_LOG_ENV

logger = logging.getLogger("batchgen.supervisor")

BACKOFF_START = 1.0
BACKOFF_MAX = 60.0
STABLE_AFTER = 60.0  # a process up this long has its backoff reset
STOP_TIMEOUT = 5.0  # BATCHGEN_STOP_TIMEOUT_SECONDS's default (core/config.py)
# Of the stop's deadline, what the programs that stop last (the embedded broker: the
# others hand their chunks back through it) keep for themselves; redis-server stops
# in milliseconds.
LAST_STAGE_SECONDS = 1.0
STOP_POLL = 0.05  # seconds between looks at the process groups while they stop
KILL_WAIT = 2.0  # the longest wait for SIGKILLed processes to be gone (milliseconds, seen)
# How often the CPU placement looks for processes and threads it has not placed yet
# (a restarted program; an engine that came up): a scan of /proc, a few ms.
PLACEMENT_INTERVAL = 5.0
# sysexits' "configuration error": restarting with the same settings fails the same way.
EX_CONFIG = os.EX_CONFIG
# The group of the inference workers: (with a CPU engine) the programs that keep
# their priority beside it (batchgen_site/cpu_placement.py).
INFERENCE_GROUP = "inference"


@dataclass
class Program:
    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    ready: Callable[[], bool] | None = None  # start the next program once this holds
    stop_signal: int = signal.SIGTERM
    # The inference workers' group: what the CPU placement keeps beside the engines.
    group: str | None = None
    # Stopped after every other program (the broker the others hand work back to).
    stops_last: bool = False
    # An inference worker whose vLLM engine may bind CPUs: the CPU placement leaves it
    # alone until its compute workers run, so vLLM binds them from every CPU.
    cpu_engine: bool = False
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    backoff: float = BACKOFF_START
    restart_at: float | None = None
    restarts: int = field(default=0)
    given_up: bool = False  # exited with EX_CONFIG: not restarted


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_libc = ctypes.CDLL(None, use_errno=True)


def die_with(parent: int, death_signal: int) -> Callable[[], None]:
    """Run in the child between fork and exec (Popen's preexec_fn): the kernel sends
    it `death_signal` when the thread that forked it ends, which is the supervisor's
    main thread (every spawn happens there), so when the supervisor dies. The setting
    survives exec. A parent that died before the prctl is caught by getppid()."""
    def setup() -> None:
        _libc.prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
    return setup


class StopGuard:
    """The supervisor's side of batchgen_site/stop_guard.py: starts it and tells it
    each process group. `keep_fds`: what it holds until it exits (the storage lock)."""

    def __init__(self, timeout: float, keep_fds: tuple[int, ...] = ()) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", stop_guard.__file__, str(timeout)],
            stdin=subprocess.PIPE, pass_fds=keep_fds, start_new_session=True)
        self._broken = False

    def say(self, line: str) -> None:
        if self._broken:
            return
        try:
            self.process.stdin.write(f"{line}\n".encode())
            self.process.stdin.flush()
        except OSError:
            # The guard died (killed by hand): the children still die with the
            # supervisor (PR_SET_PDEATHSIG); grandchildren only by its own stop.
            self._broken = True
            logger.error("the stop guard (pid %s) is gone: if this supervisor is killed, "
                         "its programs' children may outlive it", self.process.pid)

    def done(self) -> None:
        self.say("done")
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


class Supervisor:
    def __init__(self, programs: list[Program], placement: CpuPlacement | None = None,
                 run_dir: Path | None = None, stop_timeout: float = STOP_TIMEOUT,
                 keep_fds: tuple[int, ...] = ()) -> None:
        self.programs = programs
        self.placement = placement
        self.run_dir = run_dir  # where programs write their termination logs
        self.stop_timeout = stop_timeout
        self.keep_fds = keep_fds  # handed to the stop guard (the storage lock)
        self.guard: StopGuard | None = None  # started by run()
        self._placed_at = 0.0
        self._stop = threading.Event()
        self._kill_now = False  # a second signal: no more waiting

    def _spawn(self, program: Program) -> None:
        # A session of its own: Ctrl-C reaches the supervisor only, which then stops
        # the children (stop_all); the kernel stops them if the supervisor dies.
        env = program.env
        log = self._termination_log(program)
        if log is not None:
            log.unlink(missing_ok=True)
            env = {**(env if env is not None else os.environ), TERMINATION_LOG_ENV: str(log)}
        program.process = subprocess.Popen(
            program.argv, env=env, start_new_session=True,
            preexec_fn=die_with(os.getpid(), program.stop_signal))
        program.started_at = time.monotonic()
        program.restart_at = None
        if self.guard is not None:
            self.guard.say(f"start {program.process.pid}")
        logger.info("started %s (pid %s)", program.name, program.process.pid)

    def request_stop(self, signum=None, _frame=None) -> None:
        if not self._stop.is_set():
            self._stop.set()
            return
        # A second Ctrl-C (or SIGTERM): the user will not wait for the deadline.
        self._kill_now = True
        name = signal.Signals(signum).name if signum else "stop"
        logger.warning("%s again while stopping: killing every program now", name)
        for program in self.programs:
            if program.process is not None:
                _killpg(program.process.pid, signal.SIGKILL)

    def run(self) -> int:
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGTERM, self.request_stop)
        self.guard = StopGuard(self.stop_timeout, self.keep_fds)
        try:
            for program in self.programs:
                if self._stop.is_set():
                    break
                self._spawn(program)
                if program.ready is not None:
                    deadline = time.monotonic() + 60
                    while not program.ready() and not self._stop.is_set():
                        if program.process.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"{program.name} did not start")
                        self._stop.wait(0.1)
            while not self._stop.wait(0.5):
                self._watch()
                self._place()
        finally:
            self.stop_all()
            self.guard.done()
        return 0

    def _watch(self) -> None:
        now = time.monotonic()
        for program in self.programs:
            process = program.process
            if program.given_up:
                continue
            if program.restart_at is not None:
                if now >= program.restart_at:
                    program.restarts += 1
                    self._spawn(program)
                continue
            if process is None or process.poll() is None:
                if process is not None and now - program.started_at > STABLE_AFTER:
                    program.backoff = BACKOFF_START
                continue
            # Its children (Celery beat, gunicorn's workers) share its process group
            # and must not outlive it: a second beat, or a worker holding the port.
            _killpg(process.pid, signal.SIGKILL)
            if self.guard is not None:
                self.guard.say(f"end {process.pid}")
            if process.returncode == EX_CONFIG:
                program.given_up = True
                logger.error("%s (pid %s) cannot start with this configuration and is not "
                             "restarted: %s", program.name, process.pid,
                             self._last_words(program))
                continue
            delay = program.backoff
            logger.error("%s (pid %s) exited with code %s; restarting in %.0f s",
                         program.name, process.pid, process.returncode, delay)
            program.restart_at = now + delay
            program.backoff = min(program.backoff * 2, BACKOFF_MAX)

    def _termination_log(self, program: Program) -> Path | None:
        if self.run_dir is None:
            return None
        return self.run_dir / f"{program.name}.termination-log"

    def _last_words(self, program: Program) -> str:
        log = self._termination_log(program)
        try:
            text = log.read_text(errors="replace").strip() if log is not None else ""
        except OSError:
            text = ""
        # One line, whatever the program wrote.
        return " ".join(text.split()) or ("it exited with code 78 (EX_CONFIG) and said no "
                                          "more; its own log above tells why")

    def _place(self) -> None:
        now = time.monotonic()
        if self.placement is None or now - self._placed_at < PLACEMENT_INTERVAL:
            return
        self._placed_at = now
        trees = [program_tree(p.process.pid, wait_for_engine=p.cpu_engine,
                              service=p.group != INFERENCE_GROUP)
                 for p in self.programs if p.process is not None and p.process.poll() is None]
        if self.guard is not None and self.guard.process.poll() is None:
            # The stop guard is a process of ours too: off the engines' CPUs like a service.
            trees.append(program_tree(self.guard.process.pid, service=True))
        try:
            self.placement.apply(trees)
        except Exception:  # placement is an optimisation: never stop supervising for it
            logger.exception("placing processes on CPUs failed; they keep the CPUs they have")

    def stop_all(self) -> None:
        """Stop within `stop_timeout` seconds, in two stages: every program but the
        broker at once (the web server stops accepting, the workers hand their chunks
        back, all in the time of the slowest), then the broker they hand back
        through. Whatever still runs at a stage's end is killed with its process
        group (grandchildren too: an engine still starting, a beat)."""
        deadline = time.monotonic() + self.stop_timeout
        if self.guard is not None:
            self.guard.say("stop")
        first, last = self._stop_stages()
        if any(p.process is not None and p.process.poll() is None for p in last):
            self._stop_stage(first, until=deadline - min(LAST_STAGE_SECONDS,
                                                         self.stop_timeout / 2))
        else:
            self._stop_stage(first, until=deadline)
        self._stop_stage(last, until=deadline)

    def _stop_stage(self, programs: list[Program], *, until: float) -> None:
        started = [p for p in programs if p.process is not None]
        for program in started:
            if program.process.poll() is None:
                logger.info("stopping %s (pid %s)", program.name, program.process.pid)
                _killpg(program.process.pid, program.stop_signal)
        began, left = time.monotonic(), started
        while left and not self._kill_now and time.monotonic() < until:
            for program in left:
                program.process.poll()  # reaps it: a zombie leader ends its group
            still = [p for p in left if group_alive(p.process.pid)]
            for program in left:
                if program not in still:
                    logger.info("%s stopped in %.1f s", program.name, time.monotonic() - began)
            left = still
            if left:
                time.sleep(STOP_POLL)
        for program in left:
            if self._kill_now or not group_alive(program.process.pid):
                continue
            logger.warning("%s (pid %s) did not stop within %.1f s; killing it and its "
                           "process group", program.name, program.process.pid,
                           time.monotonic() - began)
            _killpg(program.process.pid, signal.SIGKILL)
        for program in started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                program.process.wait(timeout=KILL_WAIT)  # after SIGKILL: at once
        # SIGKILL lands when the kernel next schedules each process: the stop is over
        # once the groups are empty (their ports closed), not when the signals left.
        killed_by = time.monotonic() + KILL_WAIT
        while (any(group_alive(p.process.pid) for p in started)
               and time.monotonic() < killed_by):
            time.sleep(STOP_POLL)
        for program in started:
            if self.guard is not None and not group_alive(program.process.pid):
                self.guard.say(f"end {program.process.pid}")

    def _stop_stages(self) -> tuple[list[Program], list[Program]]:
        """The programs that stop first (in reverse start order), then those that
        stop last."""
        ordered = list(reversed(self.programs))
        return ([p for p in ordered if not p.stops_last], [p for p in ordered if p.stops_last])


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
