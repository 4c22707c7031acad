"""The broker restarts while chunks are queued in it and running on a worker: the
embedded broker (the supervisor restarts its redis-server), a private Redis and a
private RabbitMQ node (started by the test, so the shared services are not
disturbed). The database is the source of truth: whatever the broker keeps or
loses, the batch completes with each custom_id exactly once."""

from __future__ import annotations

import pytest
from kombu import Connection

from tests.e2e.harness import Server, chat_lines, wait_until
from tests.faults.faults import (
    PrivateRabbitMQ,
    PrivateRedis,
    assert_each_custom_id_once,
    chunk_counts,
    request_ids,
    sigkill,
    wait_restarted,
)

FINISHED = {"completed", "failed", "cancelled"}
COUNT = 6_000
# 200 slots, chunks of 50: the worker runs 6 chunks (4 fill the slots) and the
# dispatcher keeps about 8 more waiting in the broker. 200 ms a request: ~8 s of work.
SETTINGS = {"BATCHGEN_SIM_LATENCY_MS": "200", "BATCHGEN_MAX_POOL_SIZE": "200",
            "BATCHGEN_CHUNK_SIZE": "50", "BATCHGEN_CHUNK_LEASE_SECONDS": "10"}


def broker_queue_length(url: str, queue: str = "inference.m") -> int:
    with Connection(url, connect_timeout=5) as connection:
        return connection.default_channel.queue_declare(queue=queue, passive=True).message_count


def start_batch_with_chunks_queued_and_running(server: Server, api, broker_url: str) -> dict:
    input_file = api.upload(chat_lines(COUNT))
    batch = api.create_batch(input_file["id"]).json()
    api.wait_status(batch["id"], {"in_progress"}, timeout=60)

    def queued_and_running() -> bool:
        counts = chunk_counts(server, batch["id"])
        return counts["queued"] > 0 and counts["running"] > 0 and counts["done"] > 0 \
            and broker_queue_length(broker_url) > 0

    wait_until(queued_and_running, timeout=60, interval=0.1,
               message="chunks waiting in the broker and running on the worker")
    return batch


def broker_lost(server: Server) -> bool:
    return "Connection to broker lost" in server.log(tail=1_000_000)


def test_embedded_broker_killed_keeps_its_queue(start_server):
    # Given: the embedded broker holds queued chunks while others run
    server, api = start_server(**SETTINGS)
    broker_url = f"redis+socket://{server.storage / 'run' / 'broker.sock'}"
    batch = start_batch_with_chunks_queued_and_running(server, api, broker_url)

    # When: its redis-server is SIGKILLed; the supervisor restarts it from its
    # append-only file
    killed = sigkill(server, "redis-server")
    wait_restarted(server, "redis-server", killed)

    # Then
    done = api.wait_status(batch["id"], FINISHED, timeout=180)
    assert_each_custom_id_once(api, done, request_ids(COUNT))
    assert "broker (pid" in server.log(tail=1_000_000)


@pytest.fixture
def private_redis(tmp_path):
    brokers: list[PrivateRedis] = []

    def _start(*, persistent: bool) -> PrivateRedis:
        brokers.append(PrivateRedis(tmp_path / "redis", persistent=persistent).start())
        return brokers[-1]

    yield _start
    for broker in brokers:
        broker.kill()


@pytest.mark.parametrize("persistent", [
    pytest.param(True, id="append-only-file"),
    pytest.param(False, id="no-persistence"),
])
def test_redis_restart_with_chunks_queued_and_running(private_redis, start_server, persistent):
    # Given: a Redis broker of our own, holding queued chunks while others run
    redis = private_redis(persistent=persistent)
    server, api = start_server(broker_url=redis.url, **SETTINGS)
    batch = start_batch_with_chunks_queued_and_running(server, api, redis.url)

    # When: Redis is SIGKILLed and, once the workers have noticed, started again on
    # the same port: with its append-only file it comes back with the queue, without
    # it, empty (as after a crash of a Redis that only snapshots)
    redis.kill()
    wait_until(lambda: broker_lost(server), timeout=60, message="the workers to notice")
    redis.start()

    # Then: what the broker lost is published again (recovery runs every 15 s)
    done = api.wait_status(batch["id"], FINISHED, timeout=75)
    assert_each_custom_id_once(api, done, request_ids(COUNT))


def test_batch_created_while_the_broker_is_down_is_not_lost(private_redis, start_server):
    # Given: an uploaded input, and a broker that is down
    redis = private_redis(persistent=True)
    server, api = start_server(broker_url=redis.url, BATCHGEN_VALIDATION_TIMEOUT_SECONDS="5")
    input_file = api.upload(chat_lines(100))
    redis.kill()

    # When: a client creates a batch, and the broker comes back
    created = api.create_batch(input_file["id"])
    redis.start()

    # Then: the batch is either refused with a retryable error and nothing left
    # behind (a retry succeeds), or accepted and run once the broker is back
    assert created.status_code in (200, 503), created.text
    if created.status_code == 503:
        created = api.create_batch(input_file["id"])
        assert created.status_code == 200, created.text
    done = api.wait_status(created.json()["id"], FINISHED, timeout=60)
    assert_each_custom_id_once(api, done, request_ids(100))


@pytest.fixture
def private_rabbitmq(tmp_path):
    PrivateRabbitMQ.require()
    node = PrivateRabbitMQ(tmp_path / "rabbitmq")
    yield node.start()
    node.kill()


def test_rabbitmq_restart_with_chunks_queued_and_running(private_rabbitmq, start_server):
    # Given: a RabbitMQ node of our own, holding queued chunks while others run
    node = private_rabbitmq
    server, api = start_server(broker_url=node.url, **SETTINGS)
    batch = start_batch_with_chunks_queued_and_running(server, api, node.url)

    # When: the node is stopped and, once the workers have noticed, started again:
    # its durable queues keep the persistent messages, and the messages delivered
    # but not acknowledged go back to the queue
    node.stop()
    wait_until(lambda: broker_lost(server), timeout=60, message="the workers to notice")
    node.start()

    # Then
    done = api.wait_status(batch["id"], FINISHED, timeout=180)
    assert_each_custom_id_once(api, done, request_ids(COUNT))
