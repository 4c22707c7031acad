from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batchgen.batchgen_client import BatchGenHttpClient


class Resource:
    def __init__(self, client: BatchGenHttpClient):
        self._client = client
