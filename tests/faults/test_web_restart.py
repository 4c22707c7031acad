"""The web process dies while clients poll: the supervisor restarts it and clients
waiting with BatchGenHttpClient.wait_for_batch ride out the outage."""

from __future__ import annotations

import logging
import threading

from batchgen.batchgen_client import BatchGenHttpClient
from tests.e2e.harness import chat_lines, wait_until
from tests.faults.faults import assert_each_custom_id_once, request_ids, sigkill, wait_restarted

CLIENTS = 20


def test_polling_clients_ride_out_web_restarts(start_server, caplog):
    # Given: a batch that runs for about 30 s, and 20 clients waiting for it
    server, api = start_server(BATCHGEN_SIM_LATENCY_MS="500", BATCHGEN_MAX_POOL_SIZE="200",
                               BATCHGEN_CHUNK_SIZE="50")
    count = 12_000
    input_file = api.upload(chat_lines(count))
    batch = api.create_batch(input_file["id"]).json()
    api.wait_status(batch["id"], {"in_progress"}, timeout=60)

    results: list[dict] = []
    errors: list[BaseException] = []

    def wait_for_it() -> None:
        try:
            client = BatchGenHttpClient(server.base_url, timeout_s=10)
            results.append(client.wait_for_batch(batch["id"], poll_interval=0.2, timeout=300))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    caplog.set_level(logging.WARNING, logger="batchgen")
    clients = [threading.Thread(target=wait_for_it, daemon=True) for _ in range(CLIENTS)]
    for thread in clients:
        thread.start()

    # When: the gunicorn worker is SIGKILLed (its master starts another), then the
    # gunicorn master (the supervisor starts another; its orphaned worker drains)
    for marker in ("gunicorn: worker", "gunicorn: master"):
        assert api.batch(batch["id"])["status"] == "in_progress", "the batch ended too soon"
        killed = sigkill(server, marker)
        wait_restarted(server, marker, killed, timeout=90)
        server.wait_healthy(90)

    # Then: every client gets the completed batch, having polled through the outage
    for thread in clients:
        thread.join(timeout=300)
    assert errors == []
    assert len(results) == CLIENTS
    assert {r["status"] for r in results} == {"completed"}
    done = api.batch(batch["id"])
    assert_each_custom_id_once(api, done, request_ids(count))
    failed_polls = [r for r in caplog.records if "trying again" in r.getMessage()]
    assert failed_polls, "no client saw the web process down"
    assert "web (pid" in server.log(tail=1_000_000)
    wait_until(lambda: len(server.children("gunicorn: master")) == 1, timeout=10,
               message="exactly one gunicorn master")
