"""What the supervisor leaves behind when one of its programs is SIGKILLed: nothing.

Every program runs in a session of its own, so its children (Celery beat under the
control worker, gunicorn's workers under its master) share its process group. When
the program itself dies they are orphaned: the beat keeps sending periodic tasks
beside the new worker's beat, and gunicorn's old worker keeps the listening socket,
so the new master cannot bind until it has drained."""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import psutil

from tests.e2e.harness import wait_until
from tests.faults.faults import sigkill, wait_restarted


def alive(processes: list[psutil.Process]) -> list[int]:
    return [p.pid for p in processes
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_killed_control_worker_leaves_no_beat_behind(start_server):
    # Given: the control worker runs Celery beat (-B) in a child process
    server, api = start_server()
    beat = wait_until(lambda: server.children("celery beat"), timeout=30,
                      message="the beat process")

    # When: the control worker is SIGKILLed and the supervisor restarts it
    killed = sigkill(server, "-Q control")
    wait_restarted(server, "-Q control", killed)
    wait_until(lambda: [p for p in server.children("celery beat") if p not in beat],
               timeout=60, message="the new beat process")

    # Then: the old beat is gone too; two beats would send every periodic task twice
    assert alive(beat) == [], "the killed worker's beat still runs"

    def beats() -> list[psutil.Process]:
        found = []
        for process in server.processes():
            with contextlib.suppress(psutil.Error):
                if "celery beat" in " ".join(process.cmdline()):
                    found.append(process)
        return found

    # processes() knows a process by the server files it holds open; the new beat
    # holds its schedule file only once it has started (seen late under load), so
    # its turn is awaited. The old one is dead (above): more than one is a failure.
    running = wait_until(beats, timeout=60, message="the new beat among the server's processes")
    assert len(running) == 1


def test_killed_web_master_is_replaced_within_seconds(start_server):
    # Given: a web server with clients polling it over keep-alive connections
    server, api = start_server()
    master = server.children("gunicorn: master")
    workers = server.children("gunicorn: worker")
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=server.base_url, timeout=5) as client:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    client.get("/v1/pool/status")

    pollers = [threading.Thread(target=poll, daemon=True) for _ in range(5)]
    for thread in pollers:
        thread.start()
    try:
        # When: the master is SIGKILLed
        sigkill(server, "gunicorn: master")
        killed_at = time.monotonic()

        # Then: its worker goes with it and a new master listens within seconds
        # (the supervisor waits 1 s, gunicorn boots in about 2 s)
        def new_master_listening() -> bool:
            log = server.log(tail=1_000_000)
            return any(f"Listening at: {server.base_url} ({p.pid})" in log
                       for p in server.children("gunicorn: master") if p not in master)

        wait_until(new_master_listening, timeout=120, interval=0.2,
                   message="a new gunicorn master to listen")
        outage = time.monotonic() - killed_at
    finally:
        stop.set()
        for thread in pollers:
            thread.join(10)
    assert alive(workers) == [], "the killed master's worker still runs"
    assert outage < 10, f"no master listened for {outage:.0f} s"
