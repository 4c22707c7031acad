"""Stopping is as dependable as starting (issue 35): nothing of `serve`'s tree outlives
it however it ends, a stop takes at most BATCHGEN_STOP_TIMEOUT_SECONDS, and one
storage path runs one server. After each, a new `serve` on the same storage path
starts cleanly and the batch the stop interrupted completes exactly once.

Before: a supervisor killed with `kill -9` left the broker, gunicorn and its workers,
the control worker with beat and the inference workers running under init, /health
still answering; a supervisor stopping while an engine started waited for it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from tests.e2e.harness import ROOT, Api, Server, chat_lines, wait_until
from tests.faults.faults import assert_each_custom_id_once, request_ids

TERMINAL = {"completed", "failed", "cancelled", "expired"}
STOP_TIMEOUT = 5.0  # BATCHGEN_STOP_TIMEOUT_SECONDS's default


def tree(server: Server) -> list[psutil.Process]:
    """Every process of the server: its descendants, and whatever holds its log or a
    file under its storage path (found wherever it was reparented)."""
    found = {p.pid: p for p in psutil.Process(server.process.pid).children(recursive=True)}
    found.update({p.pid: p for p in server.processes()})
    return list(found.values())


def running(processes: list[psutil.Process]) -> list[str]:
    left = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{process.pid} {' '.join(process.cmdline())[:100]}")
    return left


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def gone_within(server: Server, before: list[psutil.Process], seconds: float) -> float:
    """Waits until nothing of the server runs, at most `seconds`; returns how long."""
    started = time.monotonic()
    try:
        wait_until(lambda: not running(before) and not running(server.processes()),
                   timeout=seconds, interval=0.05, message="the server's processes to end")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; still running: "
                             f"{running(before) + running(server.processes())}") from None
    return time.monotonic() - started


@pytest.fixture
def serve_again():
    """Start `serve` again on a stopped server's storage path, port and settings."""
    servers: list[Server] = []

    def _start(old: Server, **env: str) -> tuple[Server, Api]:
        server = Server(storage=old.storage, env={**old.env, **env}, args=old.args,
                        port=old.port)
        servers.append(server)
        server.start()
        return server, Api(server.base_url)

    yield _start
    for server in servers:
        server.stop()


def slow_batch(api: Api, count: int) -> str:
    return api.create_batch(api.upload(chat_lines(count))["id"]).json()["id"]


# Slow enough that the batch is mid-way when the supervisor ends; leases short so a
# chunk not handed back is requeued within the test.
SLOW = {"BATCHGEN_SIM_LATENCY_MS": "500", "BATCHGEN_MAX_POOL_SIZE": "40",
        "BATCHGEN_CHUNK_SIZE": "20", "BATCHGEN_CHUNK_LEASE_SECONDS": "15"}


def test_killed_supervisor_leaves_no_process_and_no_port_and_its_batch_completes_once(
        start_server, serve_again):
    # Given: a healthy server with a batch running
    server, api = start_server(**SLOW)
    batch_id = slow_batch(api, 400)
    wait_until(lambda: api.batch(batch_id)["request_counts"]["completed"] >= 60,
               timeout=120, message="the batch to be under way")
    wait_until(lambda: server.children("celery beat"), timeout=30, message="the beat")
    before = tree(server)
    assert len(running(before)) >= 7, running(before)  # broker, web x2, control, beat, ...

    # When: the supervisor alone is SIGKILLed, as the OOM killer would
    server.process.kill()
    server.process.wait()

    # Then: its whole tree ends within 5 s, and nothing listens on its port
    took = gone_within(server, before, 5)
    assert not listening(server.port)
    print(f"tree gone {took:.2f} s after the supervisor's SIGKILL")
    log = server.log(tail=100_000)
    assert "stop guard: the supervisor is gone" in log
    # The inference worker stopped as on SIGTERM: it handed its chunks back
    assert re.search(r"draining: handing [1-9]\d* chunk", log), log[-3000:]
    assert "chunk released" in log

    # And: a new serve there starts cleanly (the same port, the storage lock free) and
    # the interrupted batch completes exactly once
    again, api = serve_again(server)
    done = api.wait_status(batch_id, TERMINAL, timeout=240)
    assert_each_custom_id_once(api, done, request_ids(400))


def test_sigterm_while_an_engine_starts_ends_everything_within_the_deadline(
        start_server, serve_again, monkeypatch):
    # /health stays 503 while the engine starts: the server is up once it listens.
    monkeypatch.setattr(Server, "wait_healthy", lambda self, timeout: wait_until(
        lambda: self.log(tail=10_000).count("Listening at:"), timeout=timeout,
        message="the web server to listen"))
    # Given: an engine that takes ten minutes to start, and a batch waiting for it
    server, api = start_server(BATCHGEN_ENGINE_ARGS='{"start_seconds": 600}')
    batch_id = slow_batch(api, 50)
    wait_until(lambda: "starting engine=simulated" in server.log(tail=10_000), timeout=60,
               message="the inference worker to start its engine")
    before = tree(server)

    # When: SIGTERM, as docker stop sends
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    code = server.process.wait(timeout=STOP_TIMEOUT + 5)
    stopped = time.monotonic() - started

    # Then: serve ended within its deadline, its whole tree with it
    gone_within(server, before, 1)
    print(f"serve stopped {stopped:.2f} s after SIGTERM during an engine start")
    assert code == 0
    assert stopped < STOP_TIMEOUT + 1.5
    assert not listening(server.port)

    # And: started again with an engine that starts, the batch completes exactly once
    monkeypatch.undo()  # now /health turns 200
    again, api = serve_again(server, BATCHGEN_ENGINE_ARGS="{}")
    done = api.wait_status(batch_id, TERMINAL, timeout=120)
    assert_each_custom_id_once(api, done, request_ids(50))


def test_a_second_serve_on_the_same_storage_refuses_naming_the_first(start_server):
    # Given: a server with a batch running
    server, api = start_server(**SLOW)
    batch_id = slow_batch(api, 200)
    api.wait_status(batch_id, {"in_progress"}, timeout=60)

    # When: a second serve starts on the same storage path (another port)
    second = subprocess.run(
        [sys.executable, "manage.py", "serve", "--listen-ip", "127.0.0.1",
         "--listen-port", str(server.port + 1), "--storage-path", str(server.storage),
         "--flower-port", "0"],
        cwd=ROOT, env=server.env, capture_output=True, text=True, timeout=120)

    # Then: it exits non-zero, naming the first's pid, and disturbs nothing
    assert second.returncode != 0
    assert f"in use by another BatchGen server (serve, pid {server.process.pid}" in \
        second.stderr, second.stderr
    assert server.process.poll() is None
    done = api.wait_status(batch_id, TERMINAL, timeout=180)
    assert_each_custom_id_once(api, done, request_ids(200))
    assert os.path.exists(server.storage / "run" / "broker.sock")

