"""One log line per batch transition and per chunk claim and close, each with the
batch id, in key=value form that log tools can filter on (docs/operations.md)."""

from __future__ import annotations

import logging
import re

import pytest

from tests.ops.conftest import chunks_of

pytestmark = pytest.mark.django_db


def test_transitions_and_chunks_log_one_line_each_with_the_batch_id(make_batch, run_chunk,
                                                                    caplog):
    caplog.set_level(logging.INFO, logger="batchgen")
    batch = make_batch(4)
    for chunk in chunks_of(batch):
        run_chunk(chunk)

    lines = [r.getMessage() for r in caplog.records if batch.id in r.getMessage()]

    transitions = [line for line in lines if line.startswith("batch transition ")]
    assert transitions == [
        f"batch transition batch_id={batch.id} status=in_progress",
        f"batch transition batch_id={batch.id} status=finalizing",
        f"batch transition batch_id={batch.id} status=completed",
    ]
    for verb in ("claimed", "closed"):
        chunk_lines = [line for line in lines if line.startswith(f"chunk {verb} ")]
        assert len(chunk_lines) == 2
        for index, line in enumerate(chunk_lines):
            assert re.match(rf"chunk {verb} batch_id={batch.id} chunk={index} ", line), line


def test_a_failed_transition_logs_its_error_code(make_batch, caplog):
    from batches import services

    caplog.set_level(logging.INFO, logger="batchgen")
    batch = make_batch(2)

    services.batch_fail(batch_id=batch.id, code="batch_failed", message="window passed")

    assert (f"batch transition batch_id={batch.id} status=failed error=batch_failed"
            in caplog.messages)
