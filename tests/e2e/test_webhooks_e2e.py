"""Webhooks through real processes (`manage.py serve`: web, control worker with its
beat, inference worker, embedded broker) to a real local receiver that is down for
the first attempts, then refuses with 503, then takes them; every process of the
server is restarted in between. Nothing is lost, nothing answered 2xx is sent twice,
and every signature verifies with the openai SDK and BatchGen's client.

The batches run on the simulated engine: this tests delivery, not inference (the
real engine would add two minute-long engine starts and prove nothing more here)."""

from __future__ import annotations

import json

import openai

from batchgen.webhooks import verify
from tests.e2e.harness import chat_lines, wait_until
from tests.faults.faults import query
from tests.webhooks.receiver import Receiver

TERMINAL = {"completed", "failed", "cancelled"}
SWEEP = "Task webhooks.sweep_deliveries["


def sweeps_done(server) -> int:
    """The sweeps the control worker has run: Celery's line for each success, a DEBUG
    line (batchgen_site.log_filters.RoutineTicksAtDebug), so this server logs DEBUG."""
    return sum(1 for line in server.log(tail=1_000_000).splitlines()
               if SWEEP in line and " succeeded in " in line)


def deliveries(server) -> list[tuple]:
    return query(server, "SELECT id, batch_id, event_type, status, attempts "
                         "FROM webhooks_webhookdelivery ORDER BY id")


def test_webhooks_survive_a_receiver_outage_and_a_restart_of_every_process(start_server):
    # Given: a receiver that is down (its port refuses connections), retries due
    # within a second or two, and an endpoint registered with the openai SDK; the
    # receiver's address allowed as an operator would (webhooks go to public https
    # URLs only by default: anything else of this host stays refused)
    # 8 slots at 50 ms a request: the 400-line batch cancelled below takes at least
    # 2.5 s, so the cancel finds it running (with the default slots it completed in a
    # quarter of a second, before the cancel arrived: a CI run saw it).
    receiver = Receiver(answers=[503, 503])
    server, api = start_server(
        BATCHGEN_WEBHOOK_RETRY_FIRST_SECONDS="0.3", BATCHGEN_WEBHOOK_RETRY_MAX_SECONDS="1",
        BATCHGEN_WEBHOOK_SWEEP_SECONDS="0.5", BATCHGEN_SIM_LATENCY_MS="50",
        BATCHGEN_MAX_POOL_SIZE="8",
        BATCHGEN_LOG_LEVEL="DEBUG", BATCHGEN_WEBHOOK_ALLOWED_HOSTS="127.0.0.1")
    sdk = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    for inside in ("http://127.0.0.2:5432/", "https://169.254.169.254/latest/meta-data/"):
        refused = api.http.post("/v1/webhook_endpoints", json={"url": inside})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "webhook_url_not_allowed"
    endpoint = sdk.webhooks.create(url=receiver.url, name="e2e",
                                   event_types=["batch.completed", "batch.failed",
                                                "batch.cancelled"])
    secret = endpoint.signing_secret
    assert secret.startswith("whsec_")
    assert sdk.webhooks.retrieve(endpoint.id).url == receiver.url

    # When: one batch completes, one is cancelled and one fails (a bad input line)
    completed = api.create_batch(api.upload(chat_lines(5, prefix="ok"))["id"]).json()
    cancelled = api.create_batch(api.upload(chat_lines(400, prefix="cx"))["id"]).json()
    assert api.http.post(f"/v1/batches/{cancelled['id']}/cancel").status_code == 200
    failed = api.create_batch(api.upload(chat_lines(2, prefix="bad") + b"{oops\n")["id"]).json()
    expected = {completed["id"]: "completed", cancelled["id"]: "cancelled",
                failed["id"]: "failed"}
    for batch_id, status in expected.items():
        assert api.wait_status(batch_id, TERMINAL, timeout=120)["status"] == status

    # ...their first attempts and some retries fail against the dead receiver...
    wait_until(lambda: len(rows := deliveries(server)) == 3 and all(r[4] >= 2 for r in rows),
               timeout=60, message="every delivery to have failed twice")
    assert {r[3] for r in deliveries(server)} == {"pending"}

    # ...every process of the server stops and starts again, and then the receiver
    # comes up, refusing the first two deliveries with 503
    server.stop()
    attempts_before_restart = {r[0]: r[4] for r in deliveries(server)}
    server.start()
    receiver.start()
    try:
        wait_until(lambda: {r[3] for r in deliveries(server)} == {"delivered"}, timeout=90,
                   message="every delivery to be delivered")
        # A few more sweeps pass: none of them sends anything again.
        sweeps = sweeps_done(server)
        wait_until(lambda: sweeps_done(server) >= sweeps + 3, timeout=30,
                   message="three more sweeps")
    finally:
        receiver.stop()

    # Then: each event was delivered exactly once, after the refusals, signed
    rows = deliveries(server)
    assert all(r[4] > attempts_before_restart[r[0]] for r in rows)  # retried after restart
    assert [r.answered for r in receiver.received].count(503) == 2
    assert receiver.delivered_twice() == []
    delivered = receiver.delivered()
    assert sorted(r.webhook_id for r in delivered) == sorted(r[0] for r in rows)
    events = {}
    for request in delivered:
        event = verify(request.body, request.headers, secret)
        unwrapped = sdk.webhooks.unwrap(request.body, request.headers, secret=secret)
        assert unwrapped.id == event["id"] and unwrapped.type == event["type"]
        events[event["data"]["id"]] = event
    assert {batch_id: e["type"] for batch_id, e in events.items()} == {
        batch_id: f"batch.{status}" for batch_id, status in expected.items()}
    assert {batch_id: e["data"]["status"] for batch_id, e in events.items()} == expected
    assert events[completed["id"]]["data"]["output_file_id"]
    assert events[completed["id"]]["data"]["request_counts"]["completed"] == 5
    assert events[failed["id"]]["data"]["error"]["code"] == "invalid_input"
    assert json.loads(delivered[0].body)["object"] == "event"
