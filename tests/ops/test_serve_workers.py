"""`manage.py serve --inference-workers N --gpus-per-worker K`: N inference worker
programs, each with its own Celery node name and its own CUDA_VISIBLE_DEVICES slice,
checked without a GPU; and the supervisor stopping them together."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from django.core.management.base import CommandError

from batchgen_site import gpus
from batchgen_site.gpus import GpuSlicingError, gpu_slices, visible_gpus
from batchgen_site.management.commands.serve import Command
from batchgen_site.supervisor import Program, Supervisor
from tests.e2e.harness import wait_until

OPTIONS = {"web_workers": 1, "web_threads": 1, "access_log": "none", "inference_only": False}


def programs(**options):
    return Command()._programs({**OPTIONS, **options})


def inference_programs(**options) -> list[Program]:
    return [p for p in programs(**options) if p.group == "inference"]


def node_name(program: Program) -> str:
    return program.argv[program.argv.index("-n") + 1]


# --- slicing ------------------------------------------------------------------------------


def test_eight_gpus_four_workers_two_each():
    gpus_ = [str(i) for i in range(8)]
    assert gpu_slices(workers=4, per_worker=2, gpus=gpus_) == ["0,1", "2,3", "4,5", "6,7"]


def test_slices_come_from_the_visible_devices_in_order():
    visible = visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 5,GPU-9f2c,7"})
    assert visible == ["3", "5", "GPU-9f2c", "7"]
    assert gpu_slices(workers=2, per_worker=2, gpus=visible) == ["3,5", "GPU-9f2c,7"]
    assert gpu_slices(workers=3, per_worker=1, gpus=visible) == ["3", "5", "GPU-9f2c"]


def test_more_gpus_asked_than_shown_is_refused_with_the_arithmetic():
    with pytest.raises(GpuSlicingError) as error:
        gpu_slices(workers=3, per_worker=2, gpus=["0", "1", "2", "3"])
    assert str(error.value).startswith(
        "3 inference worker(s) x 2 GPU(s) each need 6 GPUs; this host shows 4 (0,1,2,3).")


def test_an_empty_cuda_visible_devices_shows_no_gpu():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_without_cuda_visible_devices_nvidia_smi_counts_them(monkeypatch):
    listed = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)\n"
              "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-b)\n"
              "  MIG 1g.10gb Device 0: (UUID: MIG-c)\n")
    monkeypatch.setattr(gpus.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(gpus.subprocess, "run", lambda *a, **kw: subprocess.CompletedProcess(
        a, 0, stdout=listed, stderr=""))
    assert visible_gpus({}) == ["0", "1"]


def test_no_nvidia_smi_means_no_gpu(monkeypatch):
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    assert visible_gpus({}) == []


# --- the programs serve starts --------------------------------------------------------------


def test_one_inference_worker_by_default():
    found = inference_programs()
    assert [p.name for p in found] == ["inference1"]
    assert node_name(found[0]) == "inference1@%h"
    # It holds the served model and consumes its queue; no slicing of the GPUs
    assert found[0].env["BATCHGEN_WORKER_MODEL"] == "m"
    assert found[0].argv[found[0].argv.index("-Q") + 1] == "inference.m"
    assert found[0].env.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")


def test_each_served_model_gets_its_own_workers_on_its_own_queue(settings):
    from serving.model_info import served_models

    settings.BATCHGEN_MODELS = "chat=/models/chat,embed=/models/embed"
    settings.BATCHGEN_INFERENCE_WORKERS = 2
    served_models.cache_clear()
    try:
        found = inference_programs()
    finally:
        served_models.cache_clear()
    held = [(p.env["BATCHGEN_WORKER_MODEL"], p.argv[p.argv.index("-Q") + 1]) for p in found]
    assert held == [("chat", "inference.chat")] * 2 + [("embed", "inference.embed")] * 2
    assert len({node_name(p) for p in found}) == 4


def test_multiplexing_starts_n_workers_in_all_none_pinned_to_a_model(settings):
    from serving.model_info import served_models

    settings.BATCHGEN_MODELS = "a=/models/a,b=/models/b,c=/models/c"
    settings.BATCHGEN_INFERENCE_WORKERS = 2
    settings.BATCHGEN_MULTIPLEX = True
    served_models.cache_clear()
    try:
        found = inference_programs()
    finally:
        served_models.cache_clear()
    # Two in all (not two per model), each on the bare queue: the residency scheduler
    # gives each its model, and it consumes that model's queue then
    assert [node_name(p) for p in found] == ["inference1@%h", "inference2@%h"]
    assert [p.argv[p.argv.index("-Q") + 1] for p in found] == ["inference", "inference"]
    assert all("BATCHGEN_WORKER_MODEL" not in (p.env or {}) for p in found)


def test_pingworkers_asks_the_multiplexing_workers_once_each(two_models_two_workers, pings,
                                                              settings):
    from celery.utils.nodenames import host_format
    from django.core.management import call_command

    settings.BATCHGEN_MULTIPLEX = True
    asked, answering = pings
    started = [host_format(node_name(p)) for p in inference_programs()]
    answering.update(started)
    call_command("pingworkers")

    assert len(started) == 2 and asked == started


def test_n_workers_each_with_its_own_node_name(settings):
    settings.BATCHGEN_INFERENCE_WORKERS = 4
    found = inference_programs()
    assert [node_name(p) for p in found] == [f"inference{i}@%h" for i in range(1, 5)]
    assert all(p.argv[p.argv.index("-Q") + 1] == "inference.m" for p in found)
    # Workers do not gossip: each would receive every other's heartbeat events
    assert all({"--without-gossip", "--without-mingle"} <= set(p.argv) for p in found)
    names = [p.name for p in programs()]
    assert names[-1] == "flower" and names.index("control") < names.index("inference1")


def test_zero_workers_starts_none(settings):
    settings.BATCHGEN_INFERENCE_WORKERS = 0
    assert inference_programs() == []
    assert {"web", "control"} <= {p.name for p in programs()}


def test_gpus_per_worker_gives_each_worker_its_slice(settings, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    settings.BATCHGEN_INFERENCE_WORKERS = 4
    settings.BATCHGEN_GPUS_PER_WORKER = 2
    found = inference_programs()
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in found] == ["0,1", "2,3", "4,5", "6,7"]
    assert found[0].env["PATH"]  # the rest of the environment is inherited


def test_gpus_per_worker_beyond_the_host_is_refused(settings, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    settings.BATCHGEN_INFERENCE_WORKERS = 2
    settings.BATCHGEN_GPUS_PER_WORKER = 2
    with pytest.raises(CommandError, match="need 4 GPUs; this host shows 3"):
        programs()


def test_workers_sharing_gpus_are_warned_about(settings, monkeypatch, caplog):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    settings.BATCHGEN_INFERENCE_WORKERS = 2
    inference_programs()
    assert "2 inference workers share every GPU of this host" in caplog.text


def test_negative_worker_count_is_refused(settings):
    settings.BATCHGEN_INFERENCE_WORKERS = -1
    with pytest.raises(CommandError, match="must be 0 or more"):
        programs()


def test_inference_only_starts_the_workers_alone(settings):
    settings.BATCHGEN_INFERENCE_WORKERS = 2
    assert [p.name for p in programs(inference_only=True)] == ["inference1", "inference2"]
    settings.BATCHGEN_INFERENCE_WORKERS = 0
    with pytest.raises(CommandError, match="no inference worker"):
        programs(inference_only=True)


def test_no_inference_worker_is_an_alias_of_zero_workers():
    env = Command()._environment({"no_inference_worker": True})
    assert env["BATCHGEN_INFERENCE_WORKERS"] == "0"
    with pytest.raises(CommandError, match="contradict"):
        Command()._environment({"no_inference_worker": True, "inference_workers": "3"})


def test_flags_become_the_environment_every_child_reads():
    env = Command()._environment({"inference_workers": "8", "gpus_per_worker": "1"})
    assert env["BATCHGEN_INFERENCE_WORKERS"] == "8"
    assert env["BATCHGEN_GPUS_PER_WORKER"] == "1"


# --- stopping them together -------------------------------------------------------------------

# Takes a second to stop after SIGTERM, as a worker's warm shutdown does; touches
# its argument once the handler is in place.
SLOW_TO_STOP = ("import pathlib, signal, sys, time\n"
                "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1), sys.exit(0)))\n"
                "pathlib.Path(sys.argv[1]).touch()\n"
                "time.sleep(60)\n")


def test_a_group_of_workers_stops_in_the_time_of_one(tmp_path):
    ready = [tmp_path / f"ready{i}" for i in range(1, 5)]
    workers = [Program(f"inference{i}", [sys.executable, "-c", SLOW_TO_STOP, str(ready[i - 1])],
                       group="inference") for i in range(1, 5)]
    supervisor = Supervisor([Program("web", [sys.executable, "-c", "import time; "
                                             "time.sleep(60)"]), *workers])
    for program in supervisor.programs:
        supervisor._spawn(program)
    wait_until(lambda: all(path.exists() for path in ready), timeout=30,
               message="the workers' SIGTERM handlers")

    started = time.monotonic()
    supervisor.stop_all()

    assert time.monotonic() - started < 3.0  # four one-second stops, not in turn
    assert all(p.process.returncode == 0 for p in workers)
    first, last = supervisor._stop_stages()
    assert [p.name for p in first] == ["inference4", "inference3", "inference2",
                                       "inference1", "web"]
    assert last == []


# --- pingworkers: the inference service's health check ----------------------------------------


@pytest.fixture
def two_models_two_workers(settings):
    from serving.model_info import served_models

    settings.BATCHGEN_MODELS = "chat=/models/chat,embed=/models/embed"
    settings.BATCHGEN_INFERENCE_WORKERS = 2
    served_models.cache_clear()
    yield
    served_models.cache_clear()


@pytest.fixture
def pings(monkeypatch):
    """Answer pings from the node names given; records the names pinged."""
    from core.celery import app

    asked: list[str] = []
    answering: set[str] = set()

    def fake_ping(destination=None, timeout=None, **kwargs):
        asked.extend(destination)
        return [{name: {"ok": "pong"}} for name in destination if name in answering]

    monkeypatch.setattr(app.control, "ping", fake_ping)
    return asked, answering


def test_pingworkers_pings_every_worker_serve_starts_for_every_model(
        two_models_two_workers, pings):
    from celery.utils.nodenames import host_format
    from django.core.management import call_command

    asked, answering = pings
    started = [host_format(node_name(p)) for p in inference_programs()]
    answering.update(started)
    call_command("pingworkers")

    assert len(started) == 4 and asked == started  # 2 per model, not the first 2


def test_pingworkers_fails_naming_the_workers_that_did_not_answer(
        two_models_two_workers, pings):
    from celery.utils.nodenames import host_format
    from django.core.management import call_command

    asked, answering = pings
    started = [host_format(node_name(p)) for p in inference_programs()]
    answering.update(started[:3])

    missing = re.escape(f"1 of 4 inference workers did not answer: {started[3]}")
    with pytest.raises(CommandError, match=f"{missing}$"):
        call_command("pingworkers")
