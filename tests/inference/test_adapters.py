"""LoRA adapters as entries of BATCHGEN_MODELS (`name=lora:path@base`): checked at
start-up, listed by /v1/models with their base, run by their base model's workers
(whose engine config carries them) and answered under their own name."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from inference.engines import EngineRequest, LoraAdapter, load_engine
from serving.engines.base import EngineConfig
from serving.model_info import (
    ModelEntry,
    ModelListError,
    adapters_of,
    model_routes,
    parse_models,
    served_adapters,
    served_models,
)

CHAT, EMBEDDINGS = "/v1/chat/completions", "/v1/embeddings"


def adapter_folder(path: Path, *, rank: int = 8, **config) -> Path:
    """A folder that passes for a PEFT LoRA adapter at start-up (its weights are
    read only by vLLM, when the engine loads it)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "target_modules": ["q_proj"], **config}))
    return path


def embedding_folder(path: Path) -> Path:
    """A sentence-transformers folder: the vLLM engine serves it for embeddings only."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "modules.json").write_text("[]")
    return path


@pytest.fixture
def serve(settings):
    """Serve the BATCHGEN_MODELS list given (engine: vLLM unless said), read afresh."""

    def _serve(models: str, *, engine: str = "vllm") -> None:
        settings.BATCHGEN_ENGINE = engine
        settings.BATCHGEN_MODELS = models
        served_models.cache_clear()

    yield _serve
    served_models.cache_clear()


def test_an_adapter_entry_names_its_folder_and_its_base():
    assert parse_models("m=/models/m,sql=lora:/adapters/sql@m") == [
        ModelEntry(name="m", path="/models/m"),
        ModelEntry(name="sql", path="/adapters/sql", base="m")]
    # The last @ separates the base: a folder may hold one
    assert parse_models("a=lora:/x@y/sql@m")[0] == ModelEntry(name="a", path="/x@y/sql",
                                                               base="m")


@pytest.mark.parametrize("entry", ["sql=lora:/adapters/sql", "sql=lora:@m", "sql=lora:/a@"])
def test_an_adapter_entry_without_folder_or_base_is_refused_with_its_syntax(entry):
    with pytest.raises(ModelListError, match=r"name=lora:path@base"):
        parse_models(f"m=/models/m,{entry}")


def test_an_adapter_is_served_by_its_base_models_workers(serve, tmp_path):
    sql = adapter_folder(tmp_path / "sql", rank=16)
    embed = embedding_folder(tmp_path / "embed")
    serve(f"m={tmp_path / 'm'},e={embed},sql=lora:{sql}@m")

    assert [model.id for model in served_models()] == ["m", "e"]  # each with workers
    (adapter,) = served_adapters()
    assert (adapter.id, adapter.base.id, adapter.rank) == ("sql", "m", 16)
    assert adapters_of("m") == (adapter,) and adapters_of("e") == ()
    # A line may name it wherever its base serves; its lines go to its base's workers
    assert model_routes(CHAT) == {"m": "m", "sql": "m"}
    assert model_routes(EMBEDDINGS) == {"e": "e"}


@pytest.mark.parametrize(("models", "message"), [
    ("m={m},sql=lora:{sql}@gpt-4o", r"its base 'gpt-4o' is not a served model \(the models: 'm'\)"),
    ("m={m},sql=lora:{sql}@m,two=lora:{sql}@sql", r"its base 'sql' is not a served model"),
    ("e={embed},sql=lora:{sql}@e", r"its base 'e' is an embedding model"),
    ("m={m},sql=lora:{empty}@m", r"has no adapter_config.json"),
    ("m={m},big=lora:{big}@m", r"its rank 64 is above BATCHGEN_MAX_LORA_RANK=16"),
    ("sql=lora:{sql}@m", r"adapters but no model"),
])
def test_an_adapter_that_cannot_be_served_is_refused_at_start_up_saying_why(
        serve, tmp_path, models, message):
    folders = {"m": tmp_path / "m", "sql": adapter_folder(tmp_path / "sql"),
               "big": adapter_folder(tmp_path / "big", rank=8, rank_pattern={"q_proj": 64}),
               "embed": embedding_folder(tmp_path / "embed"), "empty": tmp_path / "empty"}
    serve(models.format(**folders))

    with pytest.raises(ModelListError, match=message):
        served_models()


def test_a_max_lora_rank_vllm_does_not_take_is_refused(serve, settings, tmp_path):
    settings.BATCHGEN_MAX_LORA_RANK = 20
    serve(f"m={tmp_path / 'm'},sql=lora:{adapter_folder(tmp_path / 'sql')}@m")

    with pytest.raises(ModelListError, match=r"BATCHGEN_MAX_LORA_RANK=20 is not a rank"):
        served_models()


def test_serve_refuses_to_start_on_a_model_list_it_cannot_serve(serve, tmp_path):
    from django.core.management.base import CommandError

    from batchgen_site.management.commands.serve import Command

    serve(f"m={tmp_path / 'm'},sql=lora:{tmp_path / 'missing'}@m")
    with pytest.raises(CommandError, match=r"adapter 'sql'.*no adapter_config.json"):
        Command()._programs({"inference_only": True})


def test_the_base_models_workers_get_its_adapters_and_the_lora_settings(
        serve, settings, tmp_path):
    from inference.runtime import engine_config_from_settings

    sql = adapter_folder(tmp_path / "sql")
    serve(f"m={tmp_path / 'm'},e={embedding_folder(tmp_path / 'e')},sql=lora:{sql}@m")
    settings.BATCHGEN_MAX_LORAS, settings.BATCHGEN_MAX_LORA_RANK = 2, 32

    settings.BATCHGEN_WORKER_MODEL = "m"
    config = engine_config_from_settings()
    assert config.adapters == (LoraAdapter(name="sql", path=str(sql)),)
    assert (config.max_loras, config.max_lora_rank) == (2, 32)
    settings.BATCHGEN_WORKER_MODEL = "e"
    assert engine_config_from_settings().adapters == ()


def test_only_models_get_inference_workers_not_adapters(serve, settings, tmp_path):
    from batchgen_site.management.commands.serve import Command

    serve(f"m={tmp_path / 'm'},sql=lora:{adapter_folder(tmp_path / 'sql')}@m")
    settings.BATCHGEN_INFERENCE_WORKERS = 2
    programs = Command()._programs({"inference_only": True})

    assert [p.env["BATCHGEN_WORKER_MODEL"] for p in programs] == ["m", "m"]


# --- the simulated engine answers an adapter's name ------------------------------------------


def generate(engine, model: str, content: str = "Hello there"):
    request = EngineRequest(request_id="r1", custom_id="c1", endpoint=CHAT, body={
        "model": model, "messages": [{"role": "user", "content": content}]})
    return asyncio.run(engine.generate(request))


def test_the_simulated_engine_answers_its_adapters_under_their_own_name():
    engine = load_engine(EngineConfig(engine="simulated", model="/m", served_model_name="m",
                                      adapters=(LoraAdapter(name="sql", path="/sql"),)))

    base, adapted = generate(engine, "m"), generate(engine, "sql")

    assert base.body["model"] == "m" and adapted.body["model"] == "sql"
    # Another text for the same prompt, as a real adapter gives
    assert (adapted.body["choices"][0]["message"]["content"]
            != base.body["choices"][0]["message"]["content"])
    assert generate(engine, "other-adapter").error["code"] == "model_not_found"


# --- /v1/models ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_models_lists_an_adapter_with_its_base_and_its_bases_endpoints(serve, api, tmp_path):
    sql = adapter_folder(tmp_path / "sql")
    serve(f"m={tmp_path / 'm'},sql=lora:{sql}@m", engine="simulated")

    data = api.get("/v1/models").json()["data"]

    assert [(m["id"], m["root"], m["parent"]) for m in data] == [
        ("m", "m", None), ("sql", "m", "m")]
    model, adapter = data
    # The simulated base answers every endpoint; its adapter, those that generate text
    assert model["endpoints"] == [CHAT, "/v1/completions", EMBEDDINGS, "/v1/score", "/score",
                                  "/v1/rerank", "/rerank", "/v1/responses"]
    assert adapter["endpoints"] == [CHAT, "/v1/completions", "/v1/responses"]
    assert adapter["max_context_length"] == model["max_context_length"]
    assert api.get("/v1/models/sql").json() == adapter
