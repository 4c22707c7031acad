"""The worker's chunk ledger (inference.ledger): what chunk threads record goes out in
one flush; a failed flush loses nothing and counts nothing twice."""

from __future__ import annotations

import pytest

from batches.chunks import FlushResult
from inference.ledger import ChunkLedger


class FakeDatabase:
    def __init__(self):
        self.flushes: list[dict] = []
        self.fail_next = False
        self.result = FlushResult()

    def flush(self, **said):
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("database gone")
        self.flushes.append(said)
        return self.result


@pytest.fixture
def database():
    return FakeDatabase()


@pytest.fixture
def ledger(database):
    return ChunkLedger(database.flush)


def test_progress_of_every_chunk_goes_out_in_one_flush(ledger, database):
    for chunk_id in (1, 2, 3):
        ledger.hold(chunk_id)
        ledger.add(chunk_id, 2, 1)
    ledger.add(1, 1, 0)

    ledger.flush()

    assert len(database.flushes) == 1
    assert database.flushes[0]["progress"] == {1: (3, 1), 2: (2, 1), 3: (2, 1)}
    assert set(database.flushes[0]["holding"]) == {1, 2, 3}


def test_a_failed_flush_keeps_its_figures_for_the_next_and_counts_them_once(ledger,
                                                                           database):
    ledger.hold(7)
    ledger.add(7, 5, 0)
    database.fail_next = True

    with pytest.raises(ConnectionError):
        ledger.flush()
    ledger.add(7, 1, 1)
    ledger.flush()

    assert [f["progress"] for f in database.flushes] == [{7: (6, 1)}]


def test_closing_a_chunk_resolves_after_the_flush_with_its_status(ledger, database):
    ledger.hold(4)
    database.result = FlushResult(closed={4: "done"})

    closing = ledger.close(4, 3, 0)
    assert ledger.urgent.is_set() and not closing.done()
    ledger.flush()

    assert closing.result(timeout=1) == "done"
    assert database.flushes[0]["closing"] == {4: (3, 0)}
    assert ledger.held == 0 and ledger.wait_until_empty(0)


def test_a_lost_chunk_is_reported_to_its_thread_and_no_longer_renewed(ledger, database):
    ledger.hold(9)
    database.result = FlushResult(lost={9})

    ledger.flush()

    assert ledger.is_lost(9)
    assert ledger.held == 0


def test_a_dropped_chunk_is_no_longer_renewed_but_its_results_are_still_sent(ledger,
                                                                            database):
    ledger.hold(5)
    ledger.add(5, 2, 0)

    ledger.drop(5)
    ledger.flush()

    assert database.flushes[0]["progress"] == {5: (2, 0)}
    assert list(database.flushes[0]["holding"]) == []


def test_usage_goes_out_with_its_chunk_and_survives_a_failed_flush(ledger, database):
    from batches.usage import Usage

    ledger.hold(1)
    ledger.add(1, 1, 0, Usage(input_tokens=5, output_tokens=2, output_limit=16))
    database.fail_next = True
    with pytest.raises(ConnectionError):
        ledger.flush()
    ledger.add(1, 1, 0, Usage(input_tokens=1, output_tokens=1, output_limit=8))

    ledger.flush()

    assert database.flushes[-1]["usage"] == {1: Usage(input_tokens=6, output_tokens=3,
                                                      output_limit=24)}
