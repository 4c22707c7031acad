"""The supervisor keeps BatchGen's processes off the CPUs a vLLM CPU engine computes
on (batchgen_site/cpu_placement.py), with real processes: a stand-in for vLLM's
compute worker titles itself VLLM::Worker and binds itself to one CPU, as vLLM's
OpenMP binding does."""

from __future__ import annotations

import os
import sys

import psutil
import pytest

from batchgen_site.cpu_placement import SERVICE_NICENESS, CpuPlacement, program_tree
from batchgen_site.supervisor import INFERENCE_GROUP, Program, Supervisor
from tests.e2e.harness import wait_until

ALLOWED = frozenset(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(
    len(ALLOWED) < 2, reason="CPU placement needs two CPUs or more: one to compute on, one "
                             "for the rest")
COMPUTE_CPU = min(ALLOWED)
REST = ALLOWED - {COMPUTE_CPU}

# A process with two threads besides its main one; touches argv[1] once they run.
SERVICE = ("import pathlib, sys, threading, time\n"
           "for _ in range(2):\n"
           "    threading.Thread(target=time.sleep, args=(120,), daemon=True).start()\n"
           "pathlib.Path(sys.argv[1]).touch()\n"
           "time.sleep(120)\n")
# vLLM's compute worker: titled as vLLM titles it, bound to one CPU, with a thread.
COMPUTE = ("import os, pathlib, sys, threading, time, setproctitle\n"
           "setproctitle.setproctitle('VLLM::Worker')\n"
           f"os.sched_setaffinity(0, {{{COMPUTE_CPU}}})\n"
           "threading.Thread(target=time.sleep, args=(120,), daemon=True).start()\n"
           "pathlib.Path(sys.argv[1]).touch()\n"
           "time.sleep(120)\n")
# An inference worker: a front end with a thread, which starts the compute worker when
# given a second argument (else its engine is still starting).
INFERENCE = ("import pathlib, subprocess, sys, threading, time\n"
             "threading.Thread(target=time.sleep, args=(120,), daemon=True).start()\n"
             "if len(sys.argv) > 2:\n"
             f"    subprocess.Popen([sys.executable, '-c', {COMPUTE!r}, sys.argv[2]])\n"
             "pathlib.Path(sys.argv[1]).touch()\n"
             "time.sleep(120)\n")


def thread_cpus(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}


def thread_niceness(pid: int) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def processes(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def compute_process(pid: int) -> psutil.Process:
    return next(p for p in processes(pid) if p.name() == "VLLM::Worker")


@pytest.fixture
def supervisor(tmp_path):
    """A supervisor of a web stand-in and two inference workers, one whose engine
    computes and one whose engine is still starting; they are stopped after the test."""
    ready = {name: tmp_path / name for name in ("web", "engine", "worker1", "worker2")}
    programs = [
        Program("web", [sys.executable, "-c", SERVICE, str(ready["web"])]),
        Program("inference1", [sys.executable, "-c", INFERENCE, str(ready["worker1"]),
                               str(ready["engine"])], group=INFERENCE_GROUP, cpu_engine=True),
        Program("inference2", [sys.executable, "-c", INFERENCE, str(ready["worker2"])],
                group=INFERENCE_GROUP, cpu_engine=True),
    ]
    supervisor = Supervisor(programs, placement=CpuPlacement())
    for program in programs:
        supervisor._spawn(program)
    wait_until(lambda: all(path.exists() for path in ready.values()), timeout=30,
               message="the programs and the compute worker")
    yield supervisor
    supervisor.stop_all()


def by_name(supervisor: Supervisor, name: str) -> int:
    return next(p.process.pid for p in supervisor.programs if p.name == name)


def test_every_thread_but_the_compute_workers_leaves_the_engines_cpu(supervisor):
    supervisor._place()

    web, worker = by_name(supervisor, "web"), by_name(supervisor, "inference1")
    compute = compute_process(worker)
    assert thread_cpus(web) == {REST}  # all three threads
    assert thread_cpus(worker) == {REST}  # the front end
    assert thread_cpus(compute.pid) == {frozenset({COMPUTE_CPU})}  # as vLLM bound it
    assert supervisor.placement.placed == REST


def test_the_services_give_way_to_the_engine_on_the_cpus_they_share(supervisor):
    """A poll or a tick holding the CPU vLLM's scheduler shares with it delays the
    next engine step: the services run below the scheduler's priority there, the
    inference worker's front end and vLLM's processes keep theirs."""
    worker = by_name(supervisor, "inference1")
    started = os.getpriority(os.PRIO_PROCESS, 0)  # what every program inherited
    assert started < SERVICE_NICENESS

    supervisor._place()

    assert thread_niceness(by_name(supervisor, "web")) == {SERVICE_NICENESS}  # all threads
    assert thread_niceness(worker) == {started}
    assert thread_niceness(compute_process(worker).pid) == {started}
    assert thread_niceness(by_name(supervisor, "inference2")) == {started}


def test_a_service_an_operator_made_nicer_stays_as_nice(supervisor):
    web = by_name(supervisor, "web")
    for tid in os.listdir(f"/proc/{web}/task"):
        os.setpriority(os.PRIO_PROCESS, int(tid), 15)

    supervisor._place()

    assert thread_niceness(web) == {15}


def test_a_worker_whose_engine_is_starting_keeps_every_cpu_for_it(supervisor):
    """vLLM binds its compute workers from the CPUs their process may use: a front end
    pinned before its engine came up would leave the engine the reserved CPUs only."""
    supervisor._place()

    assert thread_cpus(by_name(supervisor, "inference2")) == {ALLOWED}
    assert thread_cpus(by_name(supervisor, "web")) == {REST}


def test_the_supervisor_stays_unpinned_so_a_restarted_program_gets_every_cpu(
        supervisor, tmp_path):
    supervisor._place()
    ready = tmp_path / "restarted"
    restarted = Program("control", [sys.executable, "-c", SERVICE, str(ready)])
    supervisor.programs.append(restarted)
    supervisor._spawn(restarted)
    wait_until(ready.exists, timeout=30, message="the restarted program")

    assert os.sched_getaffinity(0) == ALLOWED
    assert thread_cpus(restarted.process.pid) == {ALLOWED}
    supervisor._placed_at = 0.0  # the next placement is due
    supervisor._place()
    assert thread_cpus(restarted.process.pid) == {REST}


def test_without_a_compute_worker_nothing_moves(tmp_path):
    ready = tmp_path / "web"
    program = Program("web", [sys.executable, "-c", SERVICE, str(ready)])
    supervisor = Supervisor([program], placement=CpuPlacement())
    supervisor._spawn(program)
    try:
        wait_until(ready.exists, timeout=30, message="the program")
        placed = supervisor.placement.apply([program_tree(program.process.pid, service=True)])
        assert placed == frozenset()
        assert thread_cpus(program.process.pid) == {ALLOWED}
        assert thread_niceness(program.process.pid) == {os.getpriority(os.PRIO_PROCESS, 0)}
    finally:
        supervisor.stop_all()


def test_serve_places_processes_only_on_a_host_without_gpus(settings, monkeypatch):
    from batchgen_site.management.commands import serve

    engine = [Program("inference1", ["true"], group=INFERENCE_GROUP, cpu_engine=True)]
    monkeypatch.setattr(serve, "visible_gpus", lambda environ: [])
    assert isinstance(serve.cpu_placement(engine), CpuPlacement)
    assert serve.cpu_placement([Program("inference1", ["true"], group="inference")]) is None
    settings.BATCHGEN_ENGINE_CPU_ISOLATION = False
    assert serve.cpu_placement(engine) is None
    settings.BATCHGEN_ENGINE_CPU_ISOLATION = True
    monkeypatch.setattr(serve, "visible_gpus", lambda environ: ["0"])
    assert serve.cpu_placement(engine) is None


def test_only_workers_of_an_engine_computing_on_the_host_cpu_wait_for_it(settings):
    from batchgen_site.management.commands.serve import Command
    from serving.model_info import served_models

    settings.BATCHGEN_MODELS = "chat=/models/chat:vllm,remote=m:openai-http"
    settings.BATCHGEN_ENGINE_URL = "http://127.0.0.1:1/v1"
    served_models.cache_clear()
    try:
        programs = Command()._programs({"web_workers": 1, "web_threads": 1,
                                        "access_log": "none", "inference_only": True})
    finally:
        served_models.cache_clear()
    assert {p.name: p.cpu_engine for p in programs} == {"inference1": True,
                                                         "inference2": False}
