"""Which GPUs each inference worker of `manage.py serve --inference-workers N
--gpus-per-worker K` gets: worker i sees GPUs i*K .. i*K+K-1 of the host's visible
GPUs, through its own CUDA_VISIBLE_DEVICES, so one engine never shares a GPU with
another and an 8-GPU host is one command."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping


class GpuSlicingError(ValueError):
    """The workers asked for more GPUs than the host shows."""


def visible_gpus(environ: Mapping[str, str]) -> list[str]:
    """The GPUs this process may hand out: CUDA_VISIBLE_DEVICES when it is set (its
    entries, indices or UUIDs, in order; empty means none), else every GPU that
    `nvidia-smi -L` lists, else none."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [d.strip() for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    return [str(i) for i in range(_nvidia_smi_count())]


def _nvidia_smi_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if listed.returncode != 0:
        return 0
    return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))


def gpu_slices(*, workers: int, per_worker: int, gpus: list[str]) -> list[str]:
    """CUDA_VISIBLE_DEVICES for each of `workers` workers, `per_worker` GPUs each,
    taken in order from `gpus`. Raises GpuSlicingError when they do not fit."""
    if workers < 0 or per_worker < 1:
        raise GpuSlicingError("the number of workers must be at least 0 and the GPUs per "
                              "worker at least 1")
    needed = workers * per_worker
    if needed > len(gpus):
        shown = ",".join(gpus) if gpus else "none"
        raise GpuSlicingError(
            f"{workers} inference worker(s) x {per_worker} GPU(s) each need {needed} GPUs; "
            f"this host shows {len(gpus)} ({shown}). Lower --inference-workers or "
            "--gpus-per-worker, or set CUDA_VISIBLE_DEVICES to the GPUs to use.")
    return [",".join(gpus[i * per_worker:(i + 1) * per_worker]) for i in range(workers)]
