"""A small process supervisor for `manage.py serve`: starts BatchGen's processes,
restarts any that dies (with exponential backoff, logged), and stops them all on
Ctrl-C or SIGTERM, as systemd or a container restart policy would in production.
A program that exits with EX_CONFIG (78: its configuration can never work, e.g. an
engine that cannot start with its settings) is not restarted, as systemd's
RestartPreventExitStatus=78 would have it: one line says why, from the termination
log the program wrote (as Kubernetes reads a container's terminationMessagePath).
With a CPU engine it also keeps them off the CPUs vLLM computes on
(batchgen_site/cpu_placement.py)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from batchgen_site.cpu_placement import CpuPlacement, program_tree
from core.termination import TERMINATION_LOG_ENV

logger = logging.getLogger("batchgen.supervisor")

BACKOFF_START = 1.0
BACKOFF_MAX = 60.0
STABLE_AFTER = 60.0  # a process up this long has its backoff reset
STOP_TIMEOUT = 30.0
# How often the CPU placement looks for processes and threads it has not placed yet
# (a restarted program; an engine that came up): a scan of /proc, a few ms.
PLACEMENT_INTERVAL = 5.0
# sysexits' "configuration error": restarting with the same settings fails the same way.
EX_CONFIG = os.EX_CONFIG
# The group of the inference workers: stopped together, and (with a CPU engine) the
# programs that keep their priority beside it (batchgen_site/cpu_placement.py).
INFERENCE_GROUP = "inference"


@dataclass
class Program:
    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    ready: Callable[[], bool] | None = None  # start the next program once this holds
    stop_signal: int = signal.SIGTERM
    # Programs of one group (the inference workers) are stopped together.
    group: str | None = None
    # An inference worker whose vLLM engine may bind CPUs: the CPU placement leaves it
    # alone until its compute workers run, so vLLM binds them from every CPU.
    cpu_engine: bool = False
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    backoff: float = BACKOFF_START
    restart_at: float | None = None
    restarts: int = field(default=0)
    given_up: bool = False  # exited with EX_CONFIG: not restarted


class Supervisor:
    def __init__(self, programs: list[Program], placement: CpuPlacement | None = None,
                 run_dir: Path | None = None) -> None:
        self.programs = programs
        self.placement = placement
        self.run_dir = run_dir  # where programs write their termination logs
        self._placed_at = 0.0
        self._stop = threading.Event()

    def _spawn(self, program: Program) -> None:
        # A session of its own: Ctrl-C reaches the supervisor only, which then stops
        # the children in order.
        env = program.env
        log = self._termination_log(program)
        if log is not None:
            log.unlink(missing_ok=True)
            env = {**(env if env is not None else os.environ), TERMINATION_LOG_ENV: str(log)}
        program.process = subprocess.Popen(program.argv, env=env, start_new_session=True)
        program.started_at = time.monotonic()
        program.restart_at = None
        logger.info("started %s (pid %s)", program.name, program.process.pid)

    def request_stop(self, *_args) -> None:
        self._stop.set()

    def run(self) -> int:
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGTERM, self.request_stop)
        try:
            for program in self.programs:
                self._spawn(program)
                if program.ready is not None:
                    deadline = time.monotonic() + 60
                    while not program.ready() and not self._stop.is_set():
                        if program.process.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"{program.name} did not start")
                        self._stop.wait(0.1)
                if self._stop.is_set():
                    break
            while not self._stop.wait(0.5):
                self._watch()
                self._place()
        finally:
            self.stop_all()
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
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
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
        try:
            self.placement.apply(program_tree(p.process.pid, wait_for_engine=p.cpu_engine,
                                              service=p.group != INFERENCE_GROUP)
                                 for p in self.programs
                                 if p.process is not None and p.process.poll() is None)
        except Exception:  # placement is an optimisation: never stop supervising for it
            logger.exception("placing processes on CPUs failed; they keep the CPUs they have")

    def stop_all(self) -> None:
        """Stop in reverse order, each group before the next: workers finish their warm
        shutdown while the broker they acknowledge to is still up. The programs of one
        group are signalled at once and awaited together, so N inference workers stop
        in the time of one."""
        for group in self._stop_groups():
            running = [p for p in group if p.process is not None and p.process.poll() is None]
            for program in running:
                logger.info("stopping %s (pid %s)", program.name, program.process.pid)
                try:
                    os.killpg(program.process.pid, program.stop_signal)
                except ProcessLookupError:
                    continue
            deadline = time.monotonic() + STOP_TIMEOUT
            for program in running:
                try:
                    program.process.wait(timeout=max(deadline - time.monotonic(), 0))
                except subprocess.TimeoutExpired:
                    logger.warning("%s did not stop in %.0f s; killing it", program.name,
                                   STOP_TIMEOUT)
                    try:
                        os.killpg(program.process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    program.process.wait()

    def _stop_groups(self) -> list[list[Program]]:
        """The programs in reverse start order, neighbours of one group together."""
        groups: list[list[Program]] = []
        for program in reversed(self.programs):
            if groups and program.group is not None and groups[-1][0].group == program.group:
                groups[-1].append(program)
            else:
                groups.append([program])
        return groups
