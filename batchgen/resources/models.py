"""`client.models` (/v1/models) and `client.pool` (/v1/pool/status)."""

from __future__ import annotations

from batchgen.pagination import CursorPage
from batchgen.resources._base import Resource
from batchgen.types import Model, PoolStatus


class Models(Resource):
    def list(self) -> CursorPage[Model]:
        """Every served model and LoRA adapter (one page: the server lists all)."""
        return CursorPage.build(self._client.list_models(), Model, None)

    def retrieve(self, model_id: str) -> Model:
        return Model.construct(self._client.get_model(model_id))


class Pool(Resource):
    def status(self) -> PoolStatus:
        """The intake queue, scheduling slots and active batches, per model too."""
        return PoolStatus.construct(self._client.pool_status())
