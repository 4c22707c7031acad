"""The inference worker's one port for reading its input, as it writes through
inference.database.WorkerDatabase: a claimed chunk's requests, read from the batch's
input file (batches.input_file), less those an earlier attempt already wrote to the
incremental file (a redelivery), and the counts of those not yet accounted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from batches.chunks import ChunkWork, Counts, reconcile_counts
from batches.input_file import read_chunk
from files import backends
from files.incremental import scan_results
from files.segments import Segment, scan_segments


def _counted(work: ChunkWork) -> list[Segment]:
    from django.db import close_old_connections

    from files.selectors import output_segments

    close_old_connections()
    try:
        return output_segments(batch_id=work.batch_id, chunk_id=work.chunk_id)
    finally:
        close_old_connections()


@dataclass(frozen=True)
class ChunkRequests:
    requests: list[dict]  # the lines still to run, in the chunk's order
    output: Path  # the batch's incremental file
    # (completed, failed): written by an earlier attempt that died before accounting them
    unaccounted: Counts = (0, 0)


class ChunkInput:
    def read(self, work: ChunkWork) -> ChunkRequests:
        requests = read_chunk(Path(work.input_path), start=work.start_offset,
                              end=work.end_offset,
                              max_line_bytes=settings.BATCHGEN_MAX_LINE_BYTES,
                              order_path=Path(work.order_path) if work.order_path else None)
        output = Path(work.output_path)
        if work.attempts <= 1:
            return ChunkRequests(requests, output)
        # A redelivery: skip what an earlier attempt already wrote (and counted, on an
        # object store, where an uncounted segment is not part of the output).
        custom_ids = {r["custom_id"] for r in requests}
        store = backends.current()
        if isinstance(store, backends.PathStorage):
            written = scan_results(output, custom_ids)
        else:
            written = scan_segments(store, _counted(work), custom_ids)
        return ChunkRequests([r for r in requests if r["custom_id"] not in written], output,
                             reconcile_counts(work, written))
