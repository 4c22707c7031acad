"""Records the size of every batch vLLM's scheduler hands its model (requests and
tokens per engine step), for benchmarks/embeddings.py. Python imports this module
at start-up in every process whose PYTHONPATH holds this folder (the engine core
too: it is spawned), and it only acts in the one that imports vLLM's scheduler.

Each step appends "requests tokens" to $BENCH_ENGINE_STEPS_DIR/steps-<pid>.txt
(one small write per step, unbuffered, so nothing is lost when the core is killed).
"""

import importlib.abc
import importlib.util
import os
import sys

TARGET = "vllm.v1.core.sched.scheduler"
OUT_DIR = os.environ.get("BENCH_ENGINE_STEPS_DIR")


def _wrap(module) -> None:
    scheduler = module.Scheduler
    original = scheduler.schedule
    out = open(os.path.join(OUT_DIR, f"steps-{os.getpid()}.txt"), "a", buffering=1)  # noqa: SIM115

    def schedule(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if result.total_num_scheduled_tokens:
            out.write(f"{len(result.num_scheduled_tokens)} {result.total_num_scheduled_tokens}\n")
        return result

    scheduler.schedule = schedule


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap(module)

        loader.exec_module = exec_and_wrap
        return spec


if OUT_DIR:
    sys.meta_path.insert(0, _Finder())
