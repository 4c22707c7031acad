"""What the server serves, known without loading an engine: the web process reads
it for /v1/models from the model folder's config.json."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from django.conf import settings

SERVER_STARTED = int(time.time())
SIMULATED_CONTEXT = 8192


@dataclass(frozen=True)
class ModelInfo:
    id: str
    max_context_length: int
    engine: str
    path: str


@lru_cache(maxsize=1)
def served_model() -> ModelInfo:
    path = Path(settings.BATCHGEN_MODEL)
    name = path.name or str(path)
    context = None
    config = path / "config.json"
    if config.exists():
        data = json.loads(config.read_text())
        context = data.get("max_position_embeddings") or data.get("max_seq_len")
    if settings.BATCHGEN_ENGINE == "simulated":
        name = f"{name}-simulated"
        context = context or SIMULATED_CONTEXT
    limit = settings.BATCHGEN_MAX_CONTEXT_LENGTH
    if limit and (context is None or limit < context):
        context = limit
    return ModelInfo(id=name, max_context_length=int(context or 0),
                     engine=settings.BATCHGEN_ENGINE, path=str(path))
