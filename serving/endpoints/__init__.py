"""The batch endpoints BatchGen serves: one spec module each (serving/endpoints/base.py
says what a spec holds). Adding an endpoint: a module here, its import below, and the
engines' serve_<name> method (docs/architecture.md, "Adding an endpoint")."""

from serving.endpoints import (  # noqa: F401 - each registers
    chat,
    completions,
    embeddings,
    rerank,
    responses,
    score,
)
from serving.endpoints.base import ENDPOINTS, NOT_BATCHED, EndpointSpec, endpoint_spec

__all__ = ["ENDPOINTS", "NOT_BATCHED", "EndpointSpec", "endpoint_spec"]
