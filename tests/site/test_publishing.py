"""Publishing after commit through a broker outage (core.publishing): what
the broker does not take is held in the process and published again, in order, as
soon as it does; callers never wait on a broker that is down; a chunk is marked
published only once the broker took its message. And the outage is one WARNING per
process in the log (batchgen_site.log_filters.BrokerOutageOnce). The whole path
under a real RabbitMQ cut is tests/faults/test_broker_outage.py."""

from __future__ import annotations

import logging

import pytest
from celery import Celery
from kombu.exceptions import OperationalError as BrokerError

from batches.dispatch import publish_chunks
from batches.models import Chunk, ChunkStatus
from batchgen_site.log_filters import BrokerOutageOnce
from core import publishing
from core.publishing import Message, Publisher


class Broker:
    """Celery.send_task that records what the broker took, or refuses while down."""

    def __init__(self) -> None:
        self.down = False
        self.taken: list[tuple[str, tuple]] = []
        self.tries = 0

    def send_task(self, app, name, args=None, kwargs=None, **options):
        self.tries += 1
        if self.down:
            raise BrokerError("[Errno 111] Connection refused")
        self.taken.append((name, tuple(args or ())))


@pytest.fixture
def broker(monkeypatch):
    fake = Broker()
    monkeypatch.setattr(Celery, "send_task", lambda app, *a, **kw: fake.send_task(app, *a, **kw))
    return fake


@pytest.fixture
def publisher(monkeypatch):
    fresh = Publisher()
    monkeypatch.setattr(fresh, "_retry_forever", lambda: None)  # the test turns it
    monkeypatch.setattr(publishing, "publisher", fresh)
    monkeypatch.setattr("batches.dispatch.publisher", fresh)
    return fresh


def test_messages_the_broker_refuses_are_published_in_order_once_it_answers(broker, publisher):
    broker.down = True
    assert publisher.publish(Message("batches.validate_batch", ("b1",))) is False
    tries = broker.tries
    # Then: while something is held, later messages queue behind it without a try
    assert publisher.publish(Message("batches.finalize_batch", ("b2",))) is False
    assert broker.tries == tries and publisher.held == 2
    assert publisher.retry_held() == 0 and publisher.held == 2  # still down

    broker.down = False
    assert publisher.retry_held() == 2

    assert broker.taken == [("batches.validate_batch", ("b1",)),
                            ("batches.finalize_batch", ("b2",))]
    assert publisher.held == 0
    assert publisher.publish(Message("batches.validate_batch", ("b3",))) is True


@pytest.mark.django_db
def test_a_chunk_is_marked_published_only_once_the_broker_took_it(broker, publisher,
                                                                    make_batch_with_chunks):
    refs = make_batch_with_chunks(2)
    broker.down = True

    publish_chunks(refs)

    assert set(Chunk.objects.values_list("published_at", flat=True)) == {None}
    broker.down = False
    assert publisher.retry_held() == 2
    assert [args for _, args in broker.taken] == [(b, c) for b, c, _ in refs]
    assert None not in set(Chunk.objects.values_list("published_at", flat=True))


@pytest.fixture
def make_batch_with_chunks(db):
    from django.utils import timezone

    from batches.models import Batch

    def _make(count: int) -> list[tuple[str, int, int]]:
        batch = Batch.objects.create(id="batch_pub", endpoint="/v1/chat/completions", model="m",
                                     input_file_id="file-none",
                                     expires_at=timezone.now(), status="in_progress")
        chunks = [Chunk.objects.create(batch=batch, index=i, start_offset=0, end_offset=1,
                                       first_line=i, count=1, status=ChunkStatus.QUEUED)
                  for i in range(count)]
        return [(batch.id, chunk.id, chunk.index) for chunk in chunks]

    return _make


def record(name: str, level: int, msg: str, *args, exc: BaseException | None = None):
    return logging.LogRecord(name, level, __file__, 1, msg, args,
                             (type(exc), exc, None) if exc else None)


def test_a_broker_outage_is_one_warning_and_the_return_resets_it():
    refused = ConnectionRefusedError(111, "Connection refused")
    outage = BrokerOutageOnce()
    lost = record("celery.worker.consumer.consumer", logging.WARNING, "%s (%r)",
                  "consumer: Connection to broker lost. Trying to re-establish the "
                  "connection...", refused)
    cannot = record("celery.worker.consumer.consumer", logging.ERROR,
                    "consumer: Cannot connect to %s: %s.\n%s\n", "amqp://", refused, "1 s")
    beat = record("celery.beat", logging.ERROR, "Message Error: %s\n%s", "Couldn't apply",
                  "stack", exc=refused)
    held = record("batchgen.broker", logging.WARNING, "the broker did not take a message")
    loop = record("celery.worker.loops", logging.ERROR, "Error cleaning up after event loop: %r",
                  refused, exc=refused)

    assert outage.filter(lost) and lost.levelname == "WARNING"
    for later in (cannot, beat, held, loop):
        assert not outage.filter(later) and later.levelname == "DEBUG"
        assert later.exc_info is None

    back = record("celery.worker.consumer.connection", logging.INFO, "Connected to %s", "amqp")
    assert outage.filter(back)
    again = record("celery.beat", logging.ERROR, "Message Error: %s\n%s", "x", "stack",
                   exc=refused)
    assert outage.filter(again) and again.levelname == "WARNING"
    assert again.getMessage() == "beat: cannot send to the broker: x"


def test_an_error_that_is_not_the_broker_stays_an_error():
    outage = BrokerOutageOnce()
    bug = record("celery.beat", logging.ERROR, "Message Error: %s\n%s", "x", "stack",
                 exc=KeyError("bug"))
    other = record("celery.app.trace", logging.ERROR, "Task %s raised unexpected", "t")
    assert outage.filter(bug) and bug.levelname == "ERROR"
    assert outage.filter(other) and other.levelname == "ERROR"


def test_an_ack_lost_with_the_connection_is_info():
    from amqp.exceptions import RecoverableConnectionError

    ack = record("celery.worker.request", logging.CRITICAL, "Couldn't ack %r, reason:%r", 3,
                 "closed", exc=RecoverableConnectionError("connection already closed"))
    assert BrokerOutageOnce().filter(ack) and ack.levelname == "INFO" and ack.exc_info is None
