"""What the server serves, known without loading an engine: the web process reads
it for /v1/models and validation, from each model folder's config.json.

One BatchGen may serve several models (BATCHGEN_MODELS, `name=path[:engine]`
entries); each has its own inference workers, consuming its own queue. The old
single BATCHGEN_MODEL is the one-model list, served under its folder's name.

A LoRA adapter is an entry of its own kind, `name=lora:path@base`: no workers of its
own; its base model's workers serve it (their engine loads every adapter of their
model), so its lines go into its base's chunks and queue (docs/models.md)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from serving.endpoints import ENDPOINTS
from serving.engines.registry import ENGINES, engine_spec

SERVER_STARTED = int(time.time())
ADAPTER_PREFIX = "lora:"  # name=lora:path@base: a LoRA adapter on the model `base`
ADAPTER_CONFIG = "adapter_config.json"  # what makes a folder a PEFT adapter


class ModelListError(ValueError):
    """BATCHGEN_MODELS cannot be served as written; the message says why."""


@dataclass(frozen=True)
class ModelInfo:
    id: str
    max_context_length: int
    engine: str
    path: str
    endpoints: tuple[str, ...]  # the batch endpoints its engine serves


@dataclass(frozen=True)
class AdapterInfo:
    """A LoRA adapter, served by the workers of its base model."""

    id: str
    path: str
    base: ModelInfo  # the served model it adapts
    rank: int
    endpoints: tuple[str, ...]  # its base's endpoints that generate text


@dataclass(frozen=True)
class ModelEntry:
    """One entry of the list as configured: the id requests name, its folder, its
    engine (None: BATCHGEN_ENGINE), and for an adapter the id of its base model."""

    name: str
    path: str
    engine: str | None = None
    base: str | None = None


def parse_models(value: str) -> list[ModelEntry]:
    """BATCHGEN_MODELS' entries, separated by commas: `name=path[:engine]` for a
    model, `name=lora:path@base` for a LoRA adapter on the model named `base`. The
    `:engine` suffix is read only when it names a registered engine, so a path
    holding a colon stays whole."""
    entries: list[ModelEntry] = []
    for raw in filter(None, (part.strip() for part in value.split(","))):
        name, sep, path = (part.strip() for part in raw.partition("="))
        if not sep or not name or not path:
            raise ModelListError(f"BATCHGEN_MODELS entry {raw!r} is not name=path[:engine] "
                                 "or name=lora:path@base")
        if path.startswith(ADAPTER_PREFIX):
            path, at, base = path.removeprefix(ADAPTER_PREFIX).rpartition("@")
            if not at or not path.strip() or not base.strip():
                raise ModelListError(f"BATCHGEN_MODELS entry {raw!r}: an adapter is "
                                     "name=lora:path@base (base: a served model's name)")
            entries.append(ModelEntry(name=name, path=path.strip(), base=base.strip()))
            continue
        engine = None
        head, colon, tail = path.rpartition(":")
        if colon and tail in ENGINES:
            path, engine = head, tail
        entries.append(ModelEntry(name=name, path=path.strip(), engine=engine))
    names = [entry.name for entry in entries]
    if len(set(names)) != len(names):
        raise ModelListError(f"BATCHGEN_MODELS names a model twice: {names}")
    return entries


def _model_info(*, name: str | None, path: Path, engine_name: str) -> tuple[ModelInfo, bool]:
    """The model's info, and whether it is settled: False when its engine's remote
    server was asked for the model's context and did not answer."""
    engine = engine_spec(engine_name)
    context = engine.model_context(path)  # a remote server's word, else the folder's
    settled = engine.describe_model is None or context is not None
    config = path / "config.json"
    if context is None and config.exists():
        data = json.loads(config.read_text())
        context = data.get("max_position_embeddings") or data.get("max_seq_len")
    # A sentence-transformers model embeds at most its max_seq_length tokens, and
    # vLLM takes that as the model's length (all-MiniLM-L6-v2: 256 of 512 positions).
    sentence = path / "sentence_bert_config.json"
    if sentence.exists():
        context = json.loads(sentence.read_text()).get("max_seq_length") or context
    if name is None:  # the one-model form: the folder's name, as the engine shows it
        name = f"{path.name or str(path)}{engine.model_suffix}"
    context = context or engine.default_context
    limit = settings.BATCHGEN_MAX_CONTEXT_LENGTH
    if limit and (context is None or limit < context):
        context = limit
    return ModelInfo(id=name, max_context_length=int(context or 0), engine=engine.name,
                     path=str(path), endpoints=engine.endpoints_for(path)), settled


@dataclass(frozen=True)
class _Catalog:
    models: tuple[ModelInfo, ...]
    adapters: tuple[AdapterInfo, ...]


# A remote engine's server may not answer yet when a process first asks (`serve`
# starts BatchGen and, often, the server at the same time, and /health asks at once): a
# catalogue without such a model's context is read again after this many seconds
# rather than kept, with a context of 0, for the life of the process.
UNSETTLED_SECONDS = 5.0
_cached: tuple[_Catalog, float] | None = None  # the catalogue, and until when it holds


def _catalog() -> _Catalog:
    global _cached
    cached = _cached
    if cached is not None and time.monotonic() < cached[1]:
        return cached[0]
    catalog, settled = _read_catalog()
    _cached = (catalog, math.inf if settled else time.monotonic() + UNSETTLED_SECONDS)
    return catalog


def _clear_catalog() -> None:
    global _cached
    _cached = None


def _read_catalog() -> tuple[_Catalog, bool]:
    entries = parse_models(settings.BATCHGEN_MODELS)
    if not entries:
        model, settled = _model_info(name=None, path=Path(settings.BATCHGEN_MODEL),
                                     engine_name=settings.BATCHGEN_ENGINE)
        return _Catalog(models=(model,), adapters=()), settled
    described = [_model_info(name=entry.name, path=Path(entry.path),
                             engine_name=entry.engine or settings.BATCHGEN_ENGINE)
                 for entry in entries if entry.base is None]
    models = tuple(model for model, _ in described)
    if not models:
        raise ModelListError("BATCHGEN_MODELS has adapters but no model to serve them")
    by_id = {model.id: model for model in models}
    adapters = tuple(_adapter_info(entry, by_id) for entry in entries if entry.base)
    return (_Catalog(models=models, adapters=adapters),
            all(settled for _, settled in described))


def _adapter_info(entry: ModelEntry, models: dict[str, ModelInfo]) -> AdapterInfo:
    """The adapter of `entry`, checked now (at start-up, in every process) rather
    than when its base's engine fails to load it."""
    where = f"adapter {entry.name!r} (BATCHGEN_MODELS)"
    base = models.get(entry.base or "")
    if base is None:
        raise ModelListError(f"{where}: its base {entry.base!r} is not a served model "
                             f"(the models: {', '.join(map(repr, models))})")
    engine = engine_spec(base.engine)
    if not engine.serves_adapters:
        raise ModelListError(f"{where}: the {engine.name} engine of {base.id!r} serves no "
                             "LoRA adapters")
    endpoints = tuple(url for url in base.endpoints if ENDPOINTS[url].generates)
    if not endpoints:
        raise ModelListError(f"{where}: its base {base.id!r} is an embedding model; an "
                             "adapter needs a model that generates text")
    config_path = Path(entry.path) / ADAPTER_CONFIG
    if not config_path.is_file():
        raise ModelListError(f"{where}: {entry.path} has no {ADAPTER_CONFIG}; an adapter "
                             "is a PEFT LoRA folder (adapter_config.json and "
                             "adapter_model.safetensors)")
    try:
        config = json.loads(config_path.read_text())
        rank = max([int(config["r"]), *map(int, (config.get("rank_pattern") or {}).values())])
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelListError(f"{where}: {config_path} gives no LoRA rank `r` ({exc})") from None
    limit = settings.BATCHGEN_MAX_LORA_RANK
    if engine.adapter_ranks is not None and limit not in engine.adapter_ranks:
        raise ModelListError(f"BATCHGEN_MAX_LORA_RANK={limit} is not a rank the "
                             f"{engine.name} engine takes: one of {engine.adapter_ranks}")
    if rank > limit:
        raise ModelListError(f"{where}: its rank {rank} is above BATCHGEN_MAX_LORA_RANK="
                             f"{limit}; raise that setting (--max-lora-rank) to serve it")
    return AdapterInfo(id=entry.name, path=entry.path, base=base, rank=rank,
                       endpoints=endpoints)


def served_models() -> tuple[ModelInfo, ...]:
    """Every served model (each with its own workers), in the order configured; the
    first is the default (the one a batch is recorded under when its lines name
    several). Adapters are apart: served_adapters()."""
    return _catalog().models


def served_adapters() -> tuple[AdapterInfo, ...]:
    """Every LoRA adapter, in the order configured."""
    return _catalog().adapters


def adapters_of(model_id: str) -> tuple[AdapterInfo, ...]:
    """The adapters the workers of `model_id` serve."""
    return tuple(adapter for adapter in served_adapters() if adapter.base.id == model_id)


def served_model() -> ModelInfo:
    """The default served model: the first of the list."""
    return served_models()[0]


# Tests and `serve` (after preparing the folders) read the list again.
served_models.cache_clear = _clear_catalog  # type: ignore[attr-defined]
served_model.cache_clear = _clear_catalog  # type: ignore[attr-defined]


def model_by_id(model_id: str) -> ModelInfo | None:
    """The served model named `model_id`, or None when the server does not serve it."""
    return next((model for model in served_models() if model.id == model_id), None)


def model_routes(endpoint: str) -> dict[str, str]:
    """Every name a line of an `endpoint` batch may give in body.model (the models
    and adapters serving it), each to the served model whose workers run it: itself,
    or an adapter's base."""
    routes = {model.id: model.id for model in served_models() if endpoint in model.endpoints}
    routes.update((adapter.id, adapter.base.id) for adapter in served_adapters()
                  if endpoint in adapter.endpoints)
    return routes
