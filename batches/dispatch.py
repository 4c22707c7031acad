"""The dispatcher: moves chunks from the IntakePool (pending rows in the database)
to the inference queue, a few at a time, fairly across batches.

Why not publish a whole batch at once: a broker queue is first in, first out, so a
50-request batch submitted behind a million-request one would wait for all of it.
Instead the broker holds only a short window (enough chunks to keep every worker's
chunk threads busy) and each time a chunk closes the next one is chosen by stride
scheduling: every in-progress batch with pending chunks has a pass value that grows
by requests/priority as it is served, and the lowest pass goes next. Equal
priorities give round-robin by requests; priority 3 gets three times the share of
priority 1. A batch joining the race starts at the lowest pass of those already
running, so it neither starves them nor waits behind them.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from django.conf import settings
from django.db import transaction
from django.db.models import Min

from batches import intake
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from inference.selectors import live_workers

MIN_WINDOW = 4


def dispatch_window() -> int:
    """Chunks to keep dispatched but unclaimed: what the live workers' chunk threads
    can hold (see inference.signals.inference_concurrency), plus a little slack."""
    window = 0
    for capacity in live_workers().values_list("slots_capacity", flat=True):
        window += math.ceil(capacity / settings.BATCHGEN_CHUNK_SIZE) + 2
    return max(MIN_WINDOW, window + 2)


def starting_pass() -> float:
    """The pass a batch starts at: the lowest of the batches still being dispatched."""
    low = (Batch.objects.filter(status=BatchStatus.IN_PROGRESS, chunks__status=ChunkStatus.PENDING)
           .aggregate(low=Min("dispatch_pass"))["low"])
    return low or 0.0


def dispatch() -> int:
    """Dispatch chunks until the window is full; returns how many. Safe to call from
    any process at any time: concurrent calls serialise on the intake pool's lock."""
    from batches.services import publish_chunks

    refs: list[tuple[str, int, int]] = []
    with transaction.atomic():
        intake._locked_pool()
        room = dispatch_window() - Chunk.objects.filter(status=ChunkStatus.QUEUED).count()
        if room <= 0:
            return 0
        candidates = (Batch.objects.filter(status=BatchStatus.IN_PROGRESS,
                                           chunks__status=ChunkStatus.PENDING)
                      .distinct().values_list("dispatch_pass", "id", "priority"))
        heap = [(passed, batch_id, priority) for passed, batch_id, priority in candidates]
        heapq.heapify(heap)
        pending: dict[str, deque] = {}
        advanced: dict[str, float] = {}
        while heap and len(refs) < room:
            passed, batch_id, priority = heapq.heappop(heap)
            if batch_id not in pending:
                pending[batch_id] = deque(
                    Chunk.objects.filter(batch_id=batch_id, status=ChunkStatus.PENDING)
                    .order_by("index").values_list("id", "index", "count")[:room])
            if not pending[batch_id]:
                continue
            chunk_id, index, count = pending[batch_id].popleft()
            refs.append((batch_id, chunk_id, index))
            passed += count / max(priority, 1)
            advanced[batch_id] = passed
            heapq.heappush(heap, (passed, batch_id, priority))
        if not refs:
            return 0
        Chunk.objects.filter(id__in=[r[1] for r in refs], status=ChunkStatus.PENDING).update(
            status=ChunkStatus.QUEUED, published_at=None)
        for batch_id, passed in advanced.items():
            Batch.objects.filter(id=batch_id).update(dispatch_pass=passed)
        transaction.on_commit(lambda: publish_chunks(refs))
    return len(refs)


