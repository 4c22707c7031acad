"""The real vLLM engine given a KV cache too small for the model's 8,192-token context
(issue 26, item 5): vLLM's engine core refuses to start, the worker says which setting
to change and exits with EX_CONFIG, and serve does not start it again.
tests/faults/test_engine_start_failure.py has the rest (the batch, its bound) on the
simulated engine."""

from __future__ import annotations

import pytest

from tests.e2e.harness import Server, wait_until

pytestmark = pytest.mark.vllm


def test_a_kv_cache_too_small_for_the_context_stops_the_worker_for_good(
        start_server, model_dir, monkeypatch):
    # /health never turns 200 here: the server is up once the web server listens.
    monkeypatch.setattr(Server, "wait_healthy", lambda self, timeout: wait_until(
        lambda: "Listening at:" in self.log(tail=10_000), timeout=timeout,
        message="the web server to listen"))
    server, api = start_server(engine="vllm", ready_timeout=300, BATCHGEN_MODEL=str(model_dir),
                               BATCHGEN_ENGINE_ARGS='{"kv_cache_memory_bytes": 268435456}')

    log = wait_until(lambda: (text := server.log(tail=100_000)) and "is not restarted" in text
                     and text, timeout=900, interval=1, message="the supervisor to give up")

    given_up = [line for line in log.splitlines() if "is not restarted" in line]
    assert len(given_up) == 1, given_up
    line = given_up[0]
    # vLLM's own reason, and the settings to change, in the one line
    assert "KV cache is needed, which is larger than the available KV cache memory" in line
    assert "BATCHGEN_ENGINE_ARGS (kv_cache_memory_bytes" in line
    assert "BATCHGEN_MAX_CONTEXT_LENGTH=" in line
    assert log.count("started inference1 (pid") == 1
    health = api.http.get("/health")
    assert health.status_code == 503
    assert "SmolLM2-135M-Instruct" in health.json()["reason"]
