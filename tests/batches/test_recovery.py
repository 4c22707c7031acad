"""Recovery tells a chunk a busy worker holds (prefetched: taken from the broker, not
yet started) from one the broker lost (issue 26): the worker's heartbeat names the
chunks it holds (Worker.held_chunks), and only the others are published again."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from batches import recovery
from batches.models import Chunk
from fleet import services as worker_services
from tests.batches.test_services import run_chunks

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued_long_ago(running_batch, published):
    """A batch of four queued chunks published a minute ago (past LOST_AFTER)."""
    batch = running_batch(4, chunk_size=1)
    Chunk.objects.filter(batch=batch).update(published_at=timezone.now() - timedelta(minutes=1))
    published.clear()
    return batch, list(Chunk.objects.filter(batch=batch).order_by("index")
                       .values_list("id", flat=True))


@pytest.fixture
def broker_holds(monkeypatch):
    """Make the broker's queue of the chunks' model hold `count` messages."""
    def _holds(count: int) -> None:
        monkeypatch.setattr(recovery, "inference_queue_length", lambda model: count)
    return _holds


def heartbeat(name: str, held: list[int], *, ago: float = 0) -> None:
    worker_services.worker_heartbeat(
        name=name, hostname="gpu1", engine="simulated", model="test-model", capacity=16,
        active=16, tokens_active=0, token_budget=None, ready=True, completed=0, failed=0,
        tokens=0, held_chunks=held)
    if ago:
        from fleet.models import Worker

        Worker.objects.filter(name=name).update(
            heartbeat_at=timezone.now() - timedelta(seconds=ago))


def test_chunks_a_busy_worker_prefetched_are_not_published_again(
        queued_long_ago, broker_holds, published, caplog):
    # Given: the broker holds one of four queued chunks; a busy worker's heartbeat
    # says it holds the other three (prefetched, waiting for a chunk thread)
    batch, chunk_ids = queued_long_ago
    broker_holds(1)
    heartbeat("busy", chunk_ids[1:])

    # When
    with caplog.at_level(logging.WARNING, logger="batchgen.batches"):
        report = recovery.recover()

    # Then: nothing is lost, so nothing is published again and nothing is said
    assert report.chunks_requeued == 0
    assert run_chunks(published) == []
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_chunks_no_worker_holds_and_the_broker_lacks_are_published_again(
        queued_long_ago, broker_holds, published, caplog):
    # Given: the broker holds one of four queued chunks and no worker holds any
    batch, chunk_ids = queued_long_ago
    broker_holds(1)
    heartbeat("idle", [])

    # When
    with caplog.at_level(logging.WARNING, logger="batchgen.batches"):
        report = recovery.recover()

    # Then: they are published again, with one warning
    assert report.chunks_requeued == 4
    assert sorted(run_chunks(published)) == sorted((batch.id, c) for c in chunk_ids)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "holds 1 message(s) for 4 queued chunk(s)" in messages[0]


def test_only_the_chunks_no_worker_holds_are_counted_as_lost(
        queued_long_ago, broker_holds, published, caplog):
    # Given: a worker holds two; the broker holds none of the other two
    batch, chunk_ids = queued_long_ago
    broker_holds(0)
    heartbeat("busy", chunk_ids[:2])

    # When
    with caplog.at_level(logging.WARNING, logger="batchgen.batches"):
        recovery.recover()

    # Then: the warning counts the two really lost, and only they go out again
    assert sorted(run_chunks(published)) == sorted((batch.id, c) for c in chunk_ids[2:])
    assert "for 2 queued chunk(s)" in caplog.records[0].getMessage()


def test_a_dead_workers_held_chunks_count_as_lost(queued_long_ago, broker_holds, published,
                                                  settings):
    # Given: the worker that said it held every chunk stopped heartbeating
    batch, chunk_ids = queued_long_ago
    broker_holds(0)
    heartbeat("gone", chunk_ids, ago=settings.BATCHGEN_WORKER_TTL_SECONDS + 5)

    # When
    report = recovery.recover()

    # Then
    assert report.chunks_requeued == 4
