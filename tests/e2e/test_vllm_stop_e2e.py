"""SIGTERM to `serve` while the real vLLM engine starts (issue 35): vLLM starts its
engine core in a process of its own, which loads the model for tens of seconds here;
the stop ends it with the rest within BATCHGEN_STOP_TIMEOUT_SECONDS, rather than
waiting for the start to finish. tests/faults/test_supervisor_stop.py has the rest
(kill -9, the storage lock, the batch completing once after a restart) on the
simulated engine."""

from __future__ import annotations

import contextlib
import signal
import time

import psutil
import pytest

from tests.e2e.harness import Server, wait_until
from tests.faults.test_supervisor_stop import STOP_TIMEOUT, gone_within, listening, tree

pytestmark = pytest.mark.vllm


def engine_processes(server: Server) -> list[psutil.Process]:
    found = []
    for process in tree(server):
        with contextlib.suppress(psutil.NoSuchProcess):
            if "VLLM" in process.name() or "EngineCore" in " ".join(process.cmdline()):
                found.append(process)
    return found


def test_sigterm_while_a_vllm_engine_starts_ends_its_engine_processes_too(
        start_server, model_dir, monkeypatch):
    # /health stays 503 while the engine starts: the server is up once it listens.
    monkeypatch.setattr(Server, "wait_healthy", lambda self, timeout: wait_until(
        lambda: self.log(tail=10_000).count("Listening at:"), timeout=timeout,
        message="the web server to listen"))
    server, api = start_server(engine="vllm", BATCHGEN_MODEL=str(model_dir),
                               BATCHGEN_MAX_CONTEXT_LENGTH="512")
    engine = wait_until(lambda: engine_processes(server), timeout=120,
                        message="vLLM's engine core process")
    before = tree(server)
    assert "engine ready" not in server.log(tail=100_000)

    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    code = server.process.wait(timeout=STOP_TIMEOUT + 5)
    stopped = time.monotonic() - started

    gone_within(server, before, 1)
    print(f"serve stopped {stopped:.2f} s after SIGTERM during a vLLM engine start "
          f"(engine processes {[p.pid for p in engine]})")
    assert code == 0
    assert stopped < STOP_TIMEOUT + 1.5
    assert not listening(server.port)
    # The worker held nothing to hand back: its engine never became ready
    assert "draining: handing 0 chunk(s) back" in server.log(tail=100_000)
