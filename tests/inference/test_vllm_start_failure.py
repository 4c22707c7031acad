"""How the vLLM engine tells a start it can never make (EngineConfigError, naming the
setting) from one a restart may cure, and how it reads the root cause that vLLM's
engine core process logged (inference/engines/vllm_engine.py). The real engine's
refusal end to end: tests/e2e/test_vllm_start_failure_e2e.py."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from serving.engines.base import EngineConfigError

vllm_engine = pytest.importorskip("inference.engines.vllm_engine")

KV_TOO_SMALL = (
    "To serve at least one request with the model's max seq len (8192), (0.35 GiB KV cache "
    "is needed, which is larger than the available KV cache memory (0.24 GiB). Based on the "
    "available memory, the estimated maximum model length is 5632. Try increasing "
    "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
    "decreasing `max_model_len` when initializing the engine.")

# What vLLM's engine core does when it fails to start (vllm/v1/engine/core.py,
# run_engine_core): apply the logging configuration, then log the exception.
ENGINE_CORE = """
import logging, sys
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging
configure_logging(LoggingConfig(pylogging_config_file=sys.argv[1]))
try:
    raise ValueError(sys.argv[2])
except ValueError:
    logging.getLogger("vllm.v1.engine.core").exception("EngineCore failed to start.")
"""


def test_a_kv_cache_too_small_is_permanent_and_names_the_settings():
    failure = vllm_engine._start_failure("ValueError", KV_TOO_SMALL)

    assert isinstance(failure, EngineConfigError)
    assert failure.setting == (
        "BATCHGEN_ENGINE_ARGS (kv_cache_memory_bytes, gpu_memory_utilization) or "
        "BATCHGEN_MAX_CONTEXT_LENGTH, e.g. BATCHGEN_MAX_CONTEXT_LENGTH=5632")
    assert KV_TOO_SMALL in str(failure)


def test_an_argument_vllm_does_not_know_is_permanent():
    failure = vllm_engine._start_failure(
        "TypeError", "AsyncEngineArgs.__init__() got an unexpected keyword argument 'kv'")

    assert isinstance(failure, EngineConfigError)
    assert failure.setting.startswith("BATCHGEN_ENGINE_ARGS")


@pytest.mark.parametrize("kind", ["RuntimeError", "torch.OutOfMemoryError", "OSError"])
def test_other_start_failures_may_pass_with_a_restart(kind):
    assert vllm_engine._start_failure(kind, "CUDA out of memory; device busy") is None


def test_the_engine_core_processes_root_cause_is_read_from_its_log():
    from vllm.config.logging import LoggingConfig

    vllm_config = SimpleNamespace(logging_config=LoggingConfig())
    with vllm_engine._engine_core_errors(vllm_config) as root_cause:
        path = vllm_config.logging_config.pylogging_config_file
        assert path  # the engine core applies it first thing
        assert root_cause() is None  # nothing logged yet
        subprocess.run([sys.executable, "-c", ENGINE_CORE, path, KV_TOO_SMALL], check=True,
                       capture_output=True, timeout=120)

        assert root_cause() == ("ValueError", KV_TOO_SMALL)
    # Afterwards the configuration is the operator's again.
    assert vllm_config.logging_config.pylogging_config_file is None


def test_an_operators_own_vllm_logging_is_left_alone(tmp_path):
    from vllm.config.logging import LoggingConfig

    theirs = LoggingConfig(pylogging_config_file=str(tmp_path / "theirs.json"))
    vllm_config = SimpleNamespace(logging_config=theirs)
    with vllm_engine._engine_core_errors(vllm_config) as root_cause:
        assert vllm_config.logging_config is theirs
        assert root_cause() is None
