"""The engine registry: engines are declared once and asked, never named in code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from inference.engines import ENGINES, EngineConfig, engine_spec, load_engine
from inference.engines.simulated import SimulatedEngine
from serving.endpoints import ENDPOINTS

ROOT = Path(__file__).resolve().parents[2]


def test_load_engine_builds_the_class_its_spec_names():
    engine = load_engine(EngineConfig(engine="simulated", model="m", served_model_name="m"))
    assert isinstance(engine, SimulatedEngine)


def test_an_unknown_engine_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="'tgi'.*'vllm', 'simulated'"):
        load_engine(EngineConfig(engine="tgi", model="m", served_model_name="m"))


def test_every_engine_serves_only_registered_endpoints():
    for spec in ENGINES.values():
        assert spec.endpoints and set(spec.endpoints) <= set(ENDPOINTS)


def test_the_engine_config_takes_the_settings_its_spec_names(settings):
    from inference.runtime import engine_config_from_settings
    from serving.model_info import served_model

    settings.BATCHGEN_ENGINE = "simulated"
    settings.BATCHGEN_SIM_LATENCY_MS = 12.5
    settings.BATCHGEN_MODELS = ""  # the one-model form: the folder's name, suffixed
    served_model.cache_clear()
    try:
        config = engine_config_from_settings()
    finally:
        served_model.cache_clear()
    assert config.engine == "simulated"
    assert config.sim_latency_ms == 12.5
    assert config.served_model_name.endswith(engine_spec("simulated").model_suffix)


def test_every_engine_setting_has_a_default_in_the_one_table():
    from core.config import SERVER_SETTINGS

    table = {setting.env for setting in SERVER_SETTINGS}
    for spec in ENGINES.values():
        assert set(spec.settings.values()) <= table


def test_reading_the_registry_never_imports_vllm():
    """The web process and the control worker read the specs (for /v1/models and at
    start-up) and must not pay vLLM's import."""
    code = ("import sys; from inference.engines import ENGINES; "
            "[spec.endpoints for spec in ENGINES.values()]; print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "False"


def test_no_module_branches_on_an_engine_name():
    named = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("serving", "inference", "batches", "batchgen_site", "core")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "registry.py"
        for number, text in enumerate(path.read_text().splitlines(), 1)
        if any(f'== "{name}"' in text or f"== '{name}'" in text for name in ENGINES)
    ]
    assert named == []


@pytest.mark.vllm
def test_the_vllm_engine_has_a_method_for_every_endpoint_it_serves():
    from inference.engines.vllm_engine import VllmEngine

    for url in engine_spec("vllm").endpoints:
        assert callable(getattr(VllmEngine, f"serve_{ENDPOINTS[url].name}", None)), url


@pytest.mark.vllm
def test_the_lora_ranks_the_vllm_spec_accepts_are_vllms_own():
    # The spec spells them so that start-up checks need no vLLM import.
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    assert engine_spec("vllm").adapter_ranks == get_args(MaxLoRARanks)
