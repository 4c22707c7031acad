"""An engine that can never start with its settings (issue 26, item 5): the worker is
not restarted in a loop, serve says so in one line naming the setting, /health names
the model, and a batch for it says it waits, then fails with `model_unavailable`
after BATCHGEN_MODEL_UNAVAILABLE_SECONDS instead of sitting out its 24 h window.

The simulated engine is told to refuse its settings (`fail_start`), as vLLM refuses a
KV cache too small for the model's context; tests/e2e/test_vllm_e2e.py has the real one.
"""

from __future__ import annotations

import time

from tests.e2e.harness import chat_lines, wait_until

# What the supervisor says, once, about a program it will not start again.
GIVEN_UP = "inference1 (pid {}) cannot start with this configuration and is not restarted"
BOUND_SECONDS = 6


def test_an_engine_that_cannot_start_is_not_restarted_and_its_batch_fails_in_bounded_time(
        start_server, monkeypatch):
    from tests.e2e.harness import Server

    # /health never turns 200 here: the server is up once it answers at all.
    monkeypatch.setattr(Server, "wait_healthy", lambda self, timeout: wait_until(
        lambda: self.log(tail=10_000).count("Listening at:"), timeout=timeout,
        message="the web server to listen"))
    started = time.monotonic()
    server, api = start_server(
        BATCHGEN_ENGINE_ARGS='{"fail_start": "config"}',
        BATCHGEN_MODEL_UNAVAILABLE_SECONDS=str(BOUND_SECONDS))
    file_id = api.upload(chat_lines(20))["id"]
    batch_id = api.create_batch(file_id).json()["id"]

    # Then: the supervisor gives the worker up at its first failure, in one line that
    # names the setting to change
    log = wait_until(lambda: (text := server.log(tail=100_000)) and "is not restarted" in text
                     and text, timeout=120, message="the supervisor to give the worker up")
    clear_after = time.monotonic() - started
    given_up = [line for line in log.splitlines() if "is not restarted" in line]
    assert len(given_up) == 1, given_up
    assert "BATCHGEN_ENGINE_ARGS (fail_start)" in given_up[0]
    assert "ERROR batchgen.supervisor inference1" in given_up[0]

    # /health is unhealthy and names the model
    health = api.http.get("/health")
    assert health.status_code == 503
    assert health.json()["reason"] == ("no inference worker is alive: nothing runs the "
                                       "requests of model m")

    # The batch shows why it waits ...
    waiting = wait_until(lambda: (b := api.batch(batch_id)) and b["error"] and b,
                         timeout=60, message="the batch to show its wait")
    assert waiting["status"] == "in_progress"
    assert waiting["error"]["code"] == "model_unavailable"
    assert "model m" in waiting["error"]["message"]

    # ... and fails with model_unavailable once the bound has passed, its capacity back
    failed = api.wait_status(batch_id, {"failed", "completed"}, timeout=90)
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "model_unavailable"
    assert failed["request_counts"] == {"total": 20, "completed": 0, "failed": 0}
    # The output is registered just after the move to failed (batch_fail, as at expiry).
    output_id = wait_until(lambda: api.batch(batch_id)["output_file_id"], timeout=30,
                           message="the failed batch's output file")
    assert api.content(output_id) == b""
    assert api.pool()["intake_pool_size"] == 0

    # No restart loop: by now (well past the 1 s first backoff) the worker was started
    # once, and nothing restarted it.
    log = server.log(tail=100_000)
    assert log.count("started inference1 (pid") == 1
    assert not [line for line in log.splitlines()
                if "inference1" in line and "restarting in" in line]
    assert server.children("-Q inference.m") == []
    print(f"\nclear failure {clear_after:.1f} s after serve started; batch failed with "
          f"model_unavailable {time.monotonic() - started:.1f} s after")


def test_a_model_that_cannot_start_leaves_the_multiplexing_worker_serving_the_others(
        start_server):
    """One multiplexing worker, models m and e, e's engine refusing its settings: the
    worker is not stopped (nor restarted), m's batch completes on it, e's fails with
    model_unavailable at the bound, and /health and /v1/models say e cannot start."""
    server, api = start_server(
        args=["--inference-workers", "1", "--multiplex"],
        BATCHGEN_MODELS=",".join(f"{name}={server_models(name)}" for name in ("m", "e")),
        BATCHGEN_ENGINE_ARGS='{"fail_start": {"e": "config"}}',
        BATCHGEN_MODEL_UNAVAILABLE_SECONDS=str(BOUND_SECONDS))
    of_e = api.create_batch(api.upload(chat_lines(10, prefix="e", model="e"))["id"]).json()
    of_m = api.create_batch(api.upload(chat_lines(10, prefix="m"))["id"]).json()

    failed = api.wait_status(of_e["id"], {"failed", "completed"}, timeout=120)
    done = api.wait_status(of_m["id"], {"failed", "completed"}, timeout=120)

    assert (failed["status"], failed["error"]["code"]) == ("failed", "model_unavailable")
    assert failed["request_counts"] == {"total": 10, "completed": 0, "failed": 0}
    assert (done["status"], done["request_counts"]["completed"]) == ("completed", 10)
    models = {m["id"]: m for m in api.http.get("/v1/models").json()["data"]}
    assert "BATCHGEN_ENGINE_ARGS (fail_start)" in models["e"]["cannot_start"]
    assert (models["e"]["live"], models["m"]["cannot_start"]) == (False, None)
    health = api.http.get("/health")
    assert health.status_code == 503 and "model e cannot start" in health.json()["reason"]
    log = server.log(tail=100_000)
    assert log.count("started inference1 (pid") == 1
    assert "model e cannot start on this worker" in log
    assert "is not restarted" not in log and "stopping this worker" not in log
    # Flower shows the failed swap and the one made as residency.swap tasks
    shown = [line for line in log.splitlines() if "Task residency.swap[" in line]
    assert any("'to': 'e', 'reason': 'idle', 'outcome': 'failed'" in line for line in shown)
    assert any("'to': 'm', 'reason': 'idle', 'outcome': 'done'" in line for line in shown)


def server_models(name: str) -> str:
    # The simulated engine reads no weights: any path names a model.
    return f"/models/{name}"
