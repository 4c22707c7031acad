"""What the server serves, known without loading an engine: the web process reads
it for /v1/models from the model folder's config.json."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from django.conf import settings

from inference.engines.registry import engine_spec

SERVER_STARTED = int(time.time())


@dataclass(frozen=True)
class ModelInfo:
    id: str
    max_context_length: int
    engine: str
    path: str
    endpoints: tuple[str, ...]  # the batch endpoints its engine serves


@lru_cache(maxsize=1)
def served_model() -> ModelInfo:
    """The model as the configured engine serves it (its spec names the id and the
    context when the model folder does not)."""
    engine = engine_spec(settings.BATCHGEN_ENGINE)
    path = Path(settings.BATCHGEN_MODEL)
    name = path.name or str(path)
    context = None
    config = path / "config.json"
    if config.exists():
        data = json.loads(config.read_text())
        context = data.get("max_position_embeddings") or data.get("max_seq_len")
    name = f"{name}{engine.model_suffix}"
    context = context or engine.default_context
    limit = settings.BATCHGEN_MAX_CONTEXT_LENGTH
    if limit and (context is None or limit < context):
        context = limit
    return ModelInfo(id=name, max_context_length=int(context or 0), engine=engine.name,
                     path=str(path), endpoints=engine.endpoints_for(path))
