"""The fleet: BatchGen on PostgreSQL and RabbitMQ with several inference workers, as
real processes. What the fleet tests need beside tests/e2e/harness.py: a RabbitMQ
virtual host of their own per test, the database read as an operator would (also
used by benchmarks/fleet.py), extra inference workers started beside `serve` (a GPU
host joining), an API client that records every 5xx, and the scan of every process
log for errors."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil

from tests.e2e.harness import ROOT, Api, purge_broker, wait_until

# --- a RabbitMQ virtual host per run -------------------------------------------------------


@dataclass
class RabbitVhost:
    """A fresh virtual host on the local RabbitMQ (`rabbitmqctl add_vhost`), so runs
    never share queues; without rabbitmqctl, the default vhost, purged first."""

    base_url: str
    name: str = field(default_factory=lambda: f"batchgen_fleet_{uuid.uuid4().hex[:10]}")
    created: bool = False

    @property
    def url(self) -> str:
        if not self.created:
            return self.base_url
        parts = urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.netloc}/{self.name}"

    @staticmethod
    def _ctl(*args: str) -> subprocess.CompletedProcess | None:
        ctl = shutil.which("rabbitmqctl")
        if ctl is None:
            return None
        try:
            return subprocess.run([ctl, *args], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None

    def create(self, env: dict[str, str]) -> RabbitVhost:
        user = urlsplit(self.base_url).username or "guest"
        added = self._ctl("add_vhost", self.name)
        if added is not None and added.returncode == 0:
            permitted = self._ctl("set_permissions", "-p", self.name, user, ".*", ".*", ".*")
            self.created = permitted is not None and permitted.returncode == 0
            if not self.created:
                self._ctl("delete_vhost", self.name)
        if not self.created:
            purge_broker({**env, "BATCHGEN_BROKER_URL": self.base_url})
        return self

    def delete(self) -> None:
        if self.created:
            self._ctl("delete_vhost", self.name)


# --- PostgreSQL, read as an operator would ----------------------------------------------------


def pg_query(database_url: str, sql: str, params: tuple = ()) -> list[tuple]:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def chunks_held(database_url: str, pid: int, batch_ids: Iterable[str] | None = None) -> int:
    """Running chunks whose lease the worker process `pid` holds (a worker's name is
    HOST:PID:STARTED, inference/runtime.py)."""
    sql = "SELECT count(*) FROM batches_chunk WHERE status = 'running' AND worker LIKE %s"
    params: tuple = (f"%:{pid}:%",)
    if batch_ids is not None:
        sql += " AND batch_id = ANY(%s)"
        params += (list(batch_ids),)
    return pg_query(database_url, sql, params)[0][0]


# --- the API, with every 5xx recorded ----------------------------------------------------------


class RecordingApi(Api):
    """The harness's Api, remembering every 5xx answer (a deadlock reaching a client
    shows up here as 500 internal_error)."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        self.server_errors: list[str] = []
        self.http.event_hooks["response"].append(self._record)

    def _record(self, response: httpx.Response) -> None:
        if response.status_code >= 500:
            response.read()
            self.server_errors.append(f"{response.request.method} {response.request.url.path}"
                                      f" -> {response.status_code} {response.text[:300]}")


# --- extra inference workers: a GPU host joining ------------------------------------------------


@dataclass
class ExtraWorker:
    """`celery -A batchgen_site worker -Q inference -n NAME@%h`, started beside
    `serve` with the same settings, as a GPU host joining the fleet would be."""

    name: str
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen | None = None

    def start(self) -> ExtraWorker:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "batchgen_site", "worker", "-Q", "inference",
             "-n", f"{self.name}@%h", "--without-gossip", "--without-mingle",
             "--loglevel", "INFO"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        return self

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def worker_processes(server, number: int) -> list[psutil.Process]:
    """The live inference worker `inference<number>@` that `serve` started."""
    return server.children(f"-n inference{number}@")


def one_worker(server, number: int) -> psutil.Process:
    found = wait_until(lambda: worker_processes(server, number), timeout=60,
                       message=f"inference{number} running")
    return found[0]


# --- the logs ----------------------------------------------------------------------------------

# A line that must not appear in any process's log. ERROR and CRITICAL lines from
# Python's logging (the format is "TIME LEVEL LOGGER MESSAGE"), Celery's "[... ERROR/...]",
# a traceback, a PostgreSQL deadlock, a task that raised.
ERROR_LINE = re.compile(r" (ERROR|CRITICAL) |ERROR/|Traceback \(most recent call last\)|"
                        r"deadlock detected|raised unexpected")


# /health answering 503 while no inference worker is ready (at start-up, or while one
# restarts) is its job; Django logs every 5xx answer at ERROR all the same.
HEALTH_503 = "django.request Service Unavailable: /health"


def error_lines(paths: Iterable[Path], *, expected_exits: Iterable[int] = ()) -> list[str]:
    """Every error line of the given logs, but /health's 503s and the supervisor's
    notice that a process the test itself killed or stopped exited (and is restarted)."""
    exits = tuple(f"(pid {pid}) exited with code" for pid in expected_exits)

    def expected(line: str) -> bool:
        return HEALTH_503 in line or ("batchgen.supervisor" in line
                                      and any(e in line for e in exits))

    found = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if ERROR_LINE.search(line) and not expected(line):
                found.append(f"{path.name}: {line}")
    return found
