"""Inference engines. One engine per inference worker process.

`load_engine(config)` returns the engine named by `config.engine`; the import of
vLLM happens only when the `vllm` engine is asked for, so the web process and the
control worker never pay for it.
"""

from __future__ import annotations

from inference.engines.base import (
    Engine,
    EngineConfig,
    EngineRequest,
    EngineResult,
    EngineUnavailable,
)


def load_engine(config: EngineConfig) -> Engine:
    if config.engine == "simulated":
        from inference.engines.simulated import SimulatedEngine

        return SimulatedEngine(config)
    if config.engine == "vllm":
        from inference.engines.vllm_engine import VllmEngine

        return VllmEngine(config)
    raise ValueError(f"unknown engine {config.engine!r} (expected 'vllm' or 'simulated')")


__all__ = [
    "Engine", "EngineConfig", "EngineRequest", "EngineResult", "EngineUnavailable", "load_engine",
]
