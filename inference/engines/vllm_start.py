"""How a vLLM engine starts (inference/engines/vllm_engine.py): its arguments on
this host, the start itself, and a failed start told apart: settings vLLM can never
work with (an EngineConfigError naming the setting to change) from a failure a
restart may mend. The root cause of an engine core that fails is read from that
process's log."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from vllm.config import StructuredOutputsConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM

from serving.engines.base import EngineConfig, EngineConfigError

# KV cache on CPU: about 23k tokens of SmolLM2-135M in float32 (45 KiB a token), so
# one full 8k context plus many short requests. VLLM_CPU_KVCACHE_SPACE (GiB) or
# engine_args["kv_cache_memory_bytes"] override it.
CPU_KV_CACHE_BYTES = 1 << 30


def engine_args(config: EngineConfig) -> AsyncEngineArgs:
    """The vLLM engine's arguments for `config`: BatchGen's defaults on this host,
    then what BATCHGEN_ENGINE_ARGS says."""
    import torch

    kwargs: dict[str, Any] = {
        "model": config.model,
        "served_model_name": config.served_model_name,
        # Server default sampling is greedy (the API contract): vLLM's neutral
        # defaults, not the model folder's generation_config.json, plus
        # temperature 0 where the request and the batch say nothing (vLLM's
        # own default would be 1.0). top_p and top_k stay off.
        "generation_config": "vllm",
        "override_generation_config": {"temperature": 0.0},
        # Batch requests often share a system prompt or few-shot prefix: vLLM's
        # default turns prefix caching on for every model that supports it
        # (generative decoders), and off for embedding models, which cannot.
        # response_format's JSON is compact: measured with SmolLM2, a grammar that
        # lets the model emit whitespace between fields gets newlines until the
        # token limit, so the output never closes. xgrammar is the backend vLLM's
        # "auto" picks first; only it and guidance can forbid the whitespace.
        "structured_outputs_config": StructuredOutputsConfig(
            backend="xgrammar", disable_any_whitespace=True),
    }
    if config.max_context_length is not None:
        kwargs["max_model_len"] = config.max_context_length
    if config.parse_thinking:
        kwargs["reasoning_parser"] = config.reasoning_parser
    if not torch.cuda.is_available():
        # Measured here: bfloat16 is 4x slower than float32 on CPUs without
        # AMX, and torch.compile warm-up costs minutes for a small gain.
        kwargs.update(dtype="float32", enforce_eager=True)
        # Left alone, vLLM reserves gpu_memory_utilization (92%) of the NUMA
        # node's RAM for the KV cache and refuses to start when other processes
        # hold any of it. The CPU, not memory, bounds concurrency here.
        kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    if config.sleep_mode and _sleep_mode_available():
        # Multiplexing on CUDA, ROCm or XPU: a swap puts this engine to sleep at
        # level 1 (weights to host memory, KV cache dropped) and wakes it later.
        kwargs["enable_sleep_mode"] = True
    if config.adapters:
        kwargs.update(
            enable_lora=True, max_loras=config.max_loras, max_lora_rank=config.max_lora_rank,
            # Every registered adapter stays loaded in host memory: a batch naming
            # one beyond max_loras swaps it onto the device, not in from disk.
            max_cpu_loras=max(config.max_loras, len(config.adapters)))
    kwargs.update(config.engine_args)
    return AsyncEngineArgs(**kwargs)


def start_llm(config: EngineConfig, stat_loggers: list) -> tuple[AsyncLLM, AsyncEngineArgs]:
    """Start vLLM's engine (its engine core a child process) for `config`, and say
    with which arguments; raises an EngineConfigError naming the setting to change
    when these settings can never start it, else what vLLM raised. Blocks the calling
    loop until the engine core is up."""
    try:
        args = engine_args(config)  # TypeError: an argument vLLM does not know
        vllm_config = args.create_engine_config(
            usage_context=UsageContext.OPENAI_BATCH_RUNNER
        )
    except Exception as exc:
        failure = _start_failure(type(exc).__name__, str(exc))
        if failure is None:
            raise
        raise failure from exc
    with _engine_core_errors(vllm_config) as root_cause:
        try:
            return AsyncLLM.from_vllm_config(
                vllm_config=vllm_config,
                usage_context=UsageContext.OPENAI_BATCH_RUNNER,
                enable_log_requests=args.enable_log_requests,
                disable_log_stats=args.disable_log_stats,
                stat_loggers=stat_loggers,
            ), args
        except Exception as exc:
            # The engine core process failed: what it raised is only in its log.
            cause = root_cause()
            failure = _start_failure(*cause) if cause else None
            if failure is None:
                raise
            raise failure from exc


async def log_stats(llm: AsyncLLM) -> None:
    """vLLM's stats line (running and waiting requests, KV cache usage, prefix-cache
    hit rate) in the worker's log every VLLM_LOG_STATS_INTERVAL seconds while the
    engine works, as `vllm serve` logs it; AsyncLLM alone never does."""
    from vllm import envs

    while True:
        await asyncio.sleep(envs.VLLM_LOG_STATS_INTERVAL)
        await llm.do_log_stats()


# What vLLM raises for settings it cannot work with, whatever the host does meanwhile
# (its config checks, the engine core's KV cache check, an argument it does not know,
# pydantic's ValidationError); anything else (a device busy, out of memory, a lost
# process) may pass with a restart.
_CONFIG_ERRORS = frozenset({"ValueError", "TypeError", "ValidationError"})
# The settings a message of vLLM's about memory or length points at.
_MEMORY_WORDS = ("KV cache", "max seq len", "max_model_len", "gpu_memory_utilization",
                 "cache blocks")
_ESTIMATED_LENGTH = re.compile(r"estimated maximum model length is (\d+)")
# The last line of a Python traceback: "ValueError: To serve at least one request ...".
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


def _sleep_mode_available() -> bool:
    """vLLM offers sleep mode on CUDA, ROCm and XPU only: not on the CPU build."""
    from vllm.platforms import current_platform

    return current_platform.is_sleep_mode_available()


def _start_failure(kind: str, message: str) -> EngineConfigError | None:
    """The engine's start failed with `kind` (an exception's class name) and
    `message`: an EngineConfigError naming the setting to change when these settings
    can never start it, else None (a restart may help)."""
    if kind.rsplit(".", 1)[-1] not in _CONFIG_ERRORS:
        return None
    if any(word in message for word in _MEMORY_WORDS):
        setting = ("BATCHGEN_ENGINE_ARGS (kv_cache_memory_bytes, gpu_memory_utilization) "
                   "or BATCHGEN_MAX_CONTEXT_LENGTH")
        estimated = _ESTIMATED_LENGTH.search(message)
        if estimated:
            setting += f", e.g. BATCHGEN_MAX_CONTEXT_LENGTH={estimated.group(1)}"
    else:
        setting = "BATCHGEN_ENGINE_ARGS or the model (BATCHGEN_MODEL, BATCHGEN_MODELS)"
    return EngineConfigError(f"vLLM refused them: {kind}: {message}", setting=setting)


@contextlib.contextmanager
def _engine_core_errors(vllm_config: Any) -> Iterator[Any]:
    """While the engine core process starts, keep the errors it logs, and yield a
    function returning the (class name, message) of the exception it failed with.

    The engine core is another process: when it fails to start, AsyncLLM raises only
    "Engine core initialization failed. See root cause above", and the root cause is
    in that process's log. vLLM's own logging setting (LoggingConfig's
    pylogging_config_file, which the engine core applies first thing) adds a file
    handler to its default configuration for ERROR records. Left alone where the
    operator configures vLLM's logging."""
    logging_config = vllm_config.logging_config
    if not logging_config.configure_logging or logging_config.pylogging_config_file:
        yield lambda: None
        return
    from vllm import envs
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    folder = tempfile.mkdtemp(prefix="batchgen-vllm-start-")
    errors = os.path.join(folder, "engine-core-errors.log")
    config = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
    # Its stream as the environment says now (VLLM_LOGGING_STREAM, which
    # VllmEngine.start sets), not as it said when vllm.logger was imported; vLLM
    # refreshes it so when it applies its own default configuration.
    config["handlers"]["vllm"]["stream"] = envs.VLLM_LOGGING_STREAM
    config["formatters"]["batchgen_plain"] = {"format": "%(message)s"}
    config["handlers"]["batchgen_errors"] = {
        "class": "logging.FileHandler", "filename": errors, "level": "ERROR",
        # Opened when the engine core applies the configuration, not at its first
        # error: the folder is gone after the start, and a handler opening its file
        # then would raise out of vLLM's logging call (FileHandler opens outside its
        # error handling), failing the request that logged.
        "formatter": "batchgen_plain", "delay": False}
    config["loggers"]["vllm"]["handlers"].append("batchgen_errors")
    path = os.path.join(folder, "logging.json")
    with open(path, "w") as file:
        json.dump(config, file)
    vllm_config.logging_config = dataclasses.replace(logging_config,
                                                     pylogging_config_file=path)

    def root_cause() -> tuple[str, str] | None:
        try:
            with open(errors, errors="replace") as file:
                lines = file.read().splitlines()
        except OSError:
            return None
        found = [match.groups() for line in lines if (match := _EXCEPTION_LINE.match(line))]
        return found[-1] if found else None

    try:
        yield root_cause
    finally:
        # The running engine core keeps its handler on the unlinked file: a few
        # bytes an error, for a process that has its own log anyway.
        vllm_config.logging_config = logging_config
        shutil.rmtree(folder, ignore_errors=True)
