"""Inference engines. One engine per inference worker process.

`load_engine(config)` returns the engine named by `config.engine`, as the engine
registry (serving/engines/registry.py) declares it; the import of vLLM happens
only when the `vllm` engine is loaded, so the web process and the control worker
never pay for it.
"""

from __future__ import annotations

from serving.engines.base import (
    Engine,
    EngineConfig,
    EngineConfigError,
    EngineLoad,
    EngineRequest,
    EngineResult,
    EngineUnavailable,
    LoraAdapter,
)
from serving.engines.registry import ENGINES, EngineSpec, engine_spec


def load_engine(config: EngineConfig) -> Engine:
    return engine_spec(config.engine).engine(config)


__all__ = [
    "ENGINES", "Engine", "EngineConfig", "EngineConfigError", "EngineLoad", "EngineRequest",
    "EngineResult", "EngineSpec", "EngineUnavailable", "LoraAdapter", "engine_spec", "load_engine",
]
