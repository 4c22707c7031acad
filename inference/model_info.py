"""What the server serves, known without loading an engine: the web process reads
it for /v1/models and validation, from each model folder's config.json.

One BatchGen may serve several models (BATCHGEN_MODELS, `name=path[:engine]`
entries); each has its own inference workers, consuming its own queue. The old
single BATCHGEN_MODEL is the one-model list, served under its folder's name."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from django.conf import settings

from inference.engines.registry import ENGINES, engine_spec

SERVER_STARTED = int(time.time())


@dataclass(frozen=True)
class ModelInfo:
    id: str
    max_context_length: int
    engine: str
    path: str
    endpoints: tuple[str, ...]  # the batch endpoints its engine serves


@dataclass(frozen=True)
class ModelEntry:
    """One served model as configured: the id requests name, its folder, its engine
    (None: BATCHGEN_ENGINE)."""

    name: str
    path: str
    engine: str | None = None


def parse_models(value: str) -> list[ModelEntry]:
    """BATCHGEN_MODELS' entries, `name=path[:engine]` separated by commas. The
    `:engine` suffix is read only when it names a registered engine, so a path
    holding a colon stays whole."""
    entries: list[ModelEntry] = []
    for raw in filter(None, (part.strip() for part in value.split(","))):
        name, sep, path = raw.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"BATCHGEN_MODELS entry {raw!r} is not name=path[:engine]")
        engine = None
        head, colon, tail = path.rpartition(":")
        if colon and tail in ENGINES:
            path, engine = head, tail
        entries.append(ModelEntry(name=name.strip(), path=path.strip(), engine=engine))
    names = [entry.name for entry in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"BATCHGEN_MODELS names a model twice: {names}")
    return entries


def _model_info(*, name: str | None, path: Path, engine_name: str) -> ModelInfo:
    engine = engine_spec(engine_name)
    context = engine.model_context(path)  # a remote server's word, else the folder's
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
                     path=str(path), endpoints=engine.endpoints_for(path))


@lru_cache(maxsize=1)
def served_models() -> tuple[ModelInfo, ...]:
    """Every served model, in the order configured; the first is the default (the
    one a batch is recorded under when its lines name several)."""
    entries = parse_models(settings.BATCHGEN_MODELS)
    if not entries:
        return (_model_info(name=None, path=Path(settings.BATCHGEN_MODEL),
                            engine_name=settings.BATCHGEN_ENGINE),)
    return tuple(_model_info(name=entry.name, path=Path(entry.path),
                             engine_name=entry.engine or settings.BATCHGEN_ENGINE)
                 for entry in entries)


def served_model() -> ModelInfo:
    """The default served model: the first of the list."""
    return served_models()[0]


served_model.cache_clear = served_models.cache_clear  # type: ignore[attr-defined]


def model_by_id(model_id: str) -> ModelInfo | None:
    """The served model named `model_id`, or None when the server does not serve it."""
    return next((model for model in served_models() if model.id == model_id), None)
