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
from files.incremental import scan_results


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
        # A redelivery: skip what an earlier attempt already wrote.
        written = scan_results(output, {r["custom_id"] for r in requests})
        return ChunkRequests([r for r in requests if r["custom_id"] not in written], output,
                             reconcile_counts(work, written))
