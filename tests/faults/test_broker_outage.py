"""RabbitMQ cut off under a running fleet batch (issue 26, items 2 and 7), on the
production path: PostgreSQL, RabbitMQ, three inference workers, the simulated engine.

The machine's shared RabbitMQ keeps running for other tests: BatchGen reaches it
through a TCP proxy this test controls, and the outage is the proxy cutting every
connection and refusing new ones for a few seconds.

What must hold: the running batch completes with each custom_id exactly once; a
batch created during the outage is `in_progress` within 10 s of the broker's return
(its validation was published into a dead connection: without publisher confirms
and a prompt re-publish it waited for recovery's 600 s validation timeout); no 5xx
but a 503 with Retry-After on any call; no ERROR line in any process's log (the
outage is a WARNING, the return an INFO)."""

from __future__ import annotations

import time
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from tests import services
from tests.e2e.harness import chat_lines, wait_until
from tests.faults.faults import assert_each_custom_id_once, request_ids
from tests.faults.tcp_proxy import TcpProxy
from tests.fleet.conftest import fleet_backends, start_fleet  # noqa: F401 - fixtures
from tests.fleet.fleet import error_lines

# Real processes on PostgreSQL + RabbitMQ: `-m "not e2e"` skips it with the fleet tests.
pytestmark = [pytest.mark.e2e, pytest.mark.fleet]

RUNNING, CREATED = 2_000, 100
OUTAGE_SECONDS = 6
START_WITHIN = 10  # seconds after the broker's return (issue 26)
# 300 ms a request, 16 slots, chunks of 40 on three workers: about 160 requests/s, so
# the running batch is still running when the broker goes and comes back.
SETTINGS = {"BATCHGEN_SIM_LATENCY_MS": "300", "BATCHGEN_MAX_POOL_SIZE": "16",
            "BATCHGEN_CHUNK_SIZE": "40"}


def through(proxy: TcpProxy, url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2
                                     else host))


def test_batch_created_during_a_broker_outage_starts_within_seconds_of_its_return(
        fleet_backends, start_fleet):  # noqa: F811 - the fixtures imported above
    database_url, broker_url = fleet_backends
    target = urlsplit(services.RABBITMQ_URL)
    with TcpProxy(target.hostname or "127.0.0.1", target.port or 5672, lifetime=600) as proxy:
        fleet = start_fleet(workers=3, database_url=database_url,
                            broker_url=through(proxy, broker_url), **SETTINGS)
        api = fleet.api
        bad_answers: list[str] = []

        def record(response: httpx.Response) -> None:
            if response.status_code >= 500 and not (
                    response.status_code == 503 and response.headers.get("Retry-After")):
                response.read()
                bad_answers.append(f"{response.request.method} {response.request.url.path} -> "
                                   f"{response.status_code} {response.text[:300]}")

        api.http.event_hooks["response"].append(record)

        # Given: a batch running on three workers, and the next one's file uploaded
        running = api.create_batch(api.upload(chat_lines(RUNNING, prefix="run"))["id"]).json()
        later_file = api.upload(chat_lines(CREATED, prefix="new"))
        wait_until(lambda: api.batch(running["id"])["request_counts"]["completed"] >= 200,
                   timeout=120, interval=0.2, message="the running batch under way")

        # When: the broker is cut off, a batch is created meanwhile, and it returns
        proxy.cut()
        cut_at = time.monotonic()
        created = api.create_batch(later_file["id"])
        assert created.status_code == 200, created.text
        created = created.json()
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - cut_at)))  # the outage
        assert api.batch(created["id"])["status"] == "validating"
        proxy.restore()
        restored_at = time.monotonic()

        # Then: the new batch starts within seconds of the broker's return
        started = wait_until(
            lambda: (b := api.batch(created["id"]))["status"] != "validating" and b,
            timeout=90, interval=0.2, message="the batch created during the outage to start")
        waited = time.monotonic() - restored_at
        print(f"\nbroker outage {OUTAGE_SECONDS} s: the batch created during it left "
              f"validating {waited:.1f} s after the broker's return")
        assert started["status"] in {"in_progress", "finalizing", "completed"}, started
        assert waited <= START_WITHIN, f"in_progress {waited:.1f} s after the broker's return"

        # Then: both batches complete, each custom_id exactly once
        done = api.wait_status(running["id"], {"completed", "failed", "cancelled"}, timeout=240)
        assert_each_custom_id_once(api, done, request_ids(RUNNING, "run"))
        done = api.wait_status(created["id"], {"completed", "failed", "cancelled"}, timeout=120)
        assert_each_custom_id_once(api, done, request_ids(CREATED, "new"))

        assert bad_answers == []
        assert error_lines(fleet.logs) == []
