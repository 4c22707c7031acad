"""Keeps BatchGen's own processes, and vLLM's scheduler, off the CPUs a CPU engine
computes on.

vLLM's CPU backend binds each compute worker's OpenMP threads to CPUs of its own
(`VLLM_CPU_OMP_THREADS_BIND=auto`; on a 2-core host the model runs on CPU 0) and
leaves the rest, "reserved", for its scheduler process and everything else. It does
not hold the others to that: the kernel runs any thread on a compute CPU when it
likes, where it preempts the forward pass of every request in the engine. vLLM's own
engine-core process (the scheduler, which busy-waits on its workers) is one such
thread; the web server answering a poll, the control worker's tick, the broker and
the inference worker's front end are others. Measured on 2 cores
(docs/benchmarks.md, workloads.py): placement on against off came out at 0.94-1.04x
over three interleaved rounds, within the machine's noise; it follows the layout
vLLM's CPU backend asks for, at 0.1-0.2 CPU-s a minute of the supervisor's.

So `manage.py serve` (the supervisor) pins every process under it, every thread of
each, to the CPUs no compute worker is bound to, and leaves vLLM's compute workers
as vLLM bound them. The supervisor itself is not pinned, so a program it restarts
starts with every CPU; an inference worker is pinned only once its engine's compute
workers run, so vLLM spawns them with every CPU to bind from. Nothing changes where
no compute worker is bound to fewer CPUs than the host allows (a GPU engine, the
openai-http or simulated engine, a one-CPU host), or with
BATCHGEN_ENGINE_CPU_ISOLATION=false. A thread or process started later inherits
its parent thread's CPUs; `apply()` runs every few seconds for what was missed.

On the CPUs they then share, the service programs (web, control, broker, flower) also
give way to vLLM's scheduler: they run at niceness SERVICE_NICENESS. The scheduler
busy-waits on the compute worker with sched_yield, so a service still gets the CPU
whenever the scheduler has nothing to do; but a poll or a tick that holds the CPU
when a step ends delays the next step, and with it every request in the engine. The
inference workers (their front ends feed the engine and take its results, as
run_batch's does) and vLLM's own processes keep the niceness they started with.
Measured on one warm server in 17 interleaved pairs (12 with
benchmarks/service_priority.py, 5 by hand before it): +2.1 %, -1.4 % and +1.1 % by
set of pairs, within the noise on 2 cores.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

logger = logging.getLogger("batchgen.supervisor")

# vLLM titles its compute processes VLLM::Worker, VLLM::Worker_TP1, ... (setproctitle;
# the kernel's name keeps the first 15 characters).
COMPUTE_PROCESS_PREFIX = "VLLM::Worker"
# The niceness of the service programs on a host whose engine computes on its CPUs:
# below the engine's scheduler, still above batch jobs at 19. Only ever raised, so an
# operator's own `nice` of a program is kept.
SERVICE_NICENESS = 10


@dataclass(frozen=True)
class Tree:
    """A supervised program's processes: its own and all their descendants.
    `wait_for_engine`: an inference worker, placed only once its compute workers run;
    `service`: not on an engine's path (web, control, broker), run at SERVICE_NICENESS."""

    processes: list[psutil.Process]
    wait_for_engine: bool = False
    service: bool = False


def is_compute(process: psutil.Process) -> bool:
    try:
        return process.name().startswith(COMPUTE_PROCESS_PREFIX)
    except psutil.Error:
        return False


def threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # gone
        return []


def thread_cpus(tid: int) -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(tid))
    except OSError:  # gone
        return None


def compute_cpus(processes: Iterable[psutil.Process], allowed: frozenset[int]) -> frozenset[int]:
    """The CPUs the compute workers' threads are bound to, where narrower than
    `allowed` (those of a thread on every allowed CPU tell nothing)."""
    bound: set[int] = set()
    for process in processes:
        for tid in threads(process.pid):
            cpus = thread_cpus(tid)
            if cpus is not None and cpus != allowed:
                bound |= cpus & allowed
    return frozenset(bound)


def pin(process: psutil.Process, cpus: frozenset[int]) -> int:
    """Every thread of `process` on `cpus`; how many threads were moved."""
    moved = 0
    for tid in threads(process.pid):
        current = thread_cpus(tid)
        if current is None or current == cpus:
            continue
        try:
            os.sched_setaffinity(tid, cpus)
            moved += 1
        except OSError:  # gone since it was listed
            continue
    return moved


def lower_priority(process: psutil.Process, niceness: int) -> int:
    """Every thread of `process` at `niceness` at least (Linux's niceness is a
    thread's); how many threads were changed."""
    changed = 0
    for tid in threads(process.pid):
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) >= niceness:
                continue
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
            changed += 1
        except OSError:  # gone since it was listed
            continue
    return changed


class CpuPlacement:
    """The supervisor's: `apply(trees)` pins what is not a compute worker to the CPUs
    left by the compute workers, and lowers the service programs' priority there."""

    def __init__(self) -> None:
        self.allowed = frozenset(os.sched_getaffinity(0))
        self.placed: frozenset[int] = frozenset()  # BatchGen's CPUs, once known

    def apply(self, trees: Iterable[Tree]) -> frozenset[int]:
        """Place every process of `trees`; returns the CPUs they were given (empty:
        nothing to keep them from, nothing changed)."""
        trees = list(trees)
        compute = {p.pid: p for tree in trees for p in tree.processes if is_compute(p)}
        engine = compute_cpus(compute.values(), self.allowed)
        rest = self.allowed - engine
        if not engine or not rest:
            return frozenset()
        if rest != self.placed:
            logger.info("vLLM computes on CPU %s: BatchGen's processes and vLLM's scheduler "
                        "run on CPU %s (BATCHGEN_ENGINE_CPU_ISOLATION)", cpu_list(engine),
                        cpu_list(rest))
            self.placed = rest
        for tree in trees:
            if tree.wait_for_engine and not any(p.pid in compute for p in tree.processes):
                continue  # its engine is starting: vLLM binds its workers from every CPU
            for process in tree.processes:
                if process.pid not in compute:
                    pin(process, rest)
                    if tree.service:
                        lower_priority(process, SERVICE_NICENESS)
        return rest


def cpu_list(cpus: Iterable[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))


def program_tree(pid: int, *, wait_for_engine: bool = False, service: bool = False) -> Tree:
    """The processes of the program whose main process is `pid`."""
    try:
        root = psutil.Process(pid)
        return Tree([root, *root.children(recursive=True)], wait_for_engine, service)
    except psutil.Error:  # it exited: the supervisor restarts it
        return Tree([], wait_for_engine, service)
