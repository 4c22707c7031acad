"""Start BatchGen as real processes (`manage.py serve`) and drive it over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, *, timeout: float, interval: float = 0.2, message: str = ""):
    """Poll `predicate` until it returns a truthy value; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {message or predicate}")
        time.sleep(interval)


@dataclass
class Server:
    storage: Path
    env: dict[str, str]
    args: list[str] = field(default_factory=list)
    # Tests run one web worker (lighter); None: the server's own default.
    web_workers: int | None = 1
    # The checkout whose manage.py runs (a benchmark may run an older one beside this).
    root: Path = ROOT
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, ready_timeout: float = 120) -> Server:
        self.log_path = self.storage.parent / f"serve-{self.port}.log"
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--listen-ip", "127.0.0.1",
             "--listen-port", str(self.port), "--storage-path", str(self.storage),
             "--flower-port", "0",
             *(["--web-workers", str(self.web_workers)] if self.web_workers else []),
             *self.args],
            cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_healthy(ready_timeout)
        return self

    def wait_healthy(self, timeout: float) -> None:
        def healthy():
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited with {self.process.returncode}:\n{self.log()}")
            try:
                return httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(healthy, timeout=timeout, interval=0.5, message="/health to answer 200")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n--- serve log ---\n{self.log()}") from None

    def log(self, tail: int = 80) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-tail:])

    def children(self, marker: str) -> list[psutil.Process]:
        """Live descendant processes whose command line contains `marker`."""
        parent = psutil.Process(self.process.pid)
        found = []
        for child in parent.children(recursive=True):
            try:
                if marker in " ".join(child.cmdline()):
                    found.append(child)
            except psutil.NoSuchProcess:
                continue
        return found

    def processes(self) -> list[psutil.Process]:
        """Every process started for this server, wherever it was reparented: each
        holds the server's log (its inherited stdout) or a file under its storage path
        open. (Command lines cannot tell: Celery and gunicorn rewrite them.)"""
        storage, log = str(self.storage) + os.sep, str(self.log_path)
        found = []
        for process in psutil.process_iter():
            if process.pid == os.getpid():
                continue
            try:
                fds = os.listdir(f"/proc/{process.pid}/fd")
                targets = [os.readlink(f"/proc/{process.pid}/fd/{fd}") for fd in fds]
            except OSError:
                continue
            if any(t == log or t.startswith(storage) for t in targets):
                found.append(process)
        return found

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        # Nothing the supervisor started may outlive it.
        leftovers = self.processes()
        for process in leftovers:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(leftovers, timeout=10)


def server_env(*, storage: Path, broker_url: str | None = None, database_url: str | None = None,
               engine: str = "simulated", **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BATCHGEN_", "DATABASE_URL", "DJANGO_SETTINGS_MODULE"))}
    env.update({
        "DJANGO_SETTINGS_MODULE": "batchgen_site.settings",
        "BATCHGEN_STORAGE_PATH": str(storage),
        "BATCHGEN_ENGINE": engine,
        "PYTHONUNBUFFERED": "1",
    })
    if broker_url:
        env["BATCHGEN_BROKER_URL"] = broker_url
    if database_url:
        env["DATABASE_URL"] = database_url
    if engine == "simulated" and not {"BATCHGEN_MODEL", "BATCHGEN_MODELS"} & set(extra):
        # The tests' lines name the model "m": one simulated model of that name.
        env["BATCHGEN_MODELS"] = f"m={storage / 'models' / 'SmolLM2-135M-Instruct'}"
    env.update(extra)
    return env


def purge_broker(env: dict[str, str]) -> None:
    """Empty the shared broker's BatchGen queues before a run uses it."""
    subprocess.run([sys.executable, "-m", "celery", "-A", "batchgen_site", "purge", "-f",
                    "-Q", "inference,inference.m,control"], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=60)


def fresh_postgres_database(admin_url: str) -> tuple[str, callable]:
    """A new, empty PostgreSQL database; returns its URL and a function to drop it."""
    import psycopg

    name = f"batchgen_e2e_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin_url.rsplit("/", 1)[0] + f"/{name}"

    def drop() -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return url, drop


# --- API helpers ---------------------------------------------------------------------


def chat_lines(count: int, *, prefix: str = "req", **body) -> bytes:
    return b"".join(
        json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "m", "messages": [{"role": "user", "content": f"n {i}"}],
                             **body}}).encode() + b"\n"
        for i in range(count)
    )


class Api:
    def __init__(self, base_url: str) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=60)

    def upload(self, content: bytes, filename: str = "input.jsonl") -> dict:
        response = self.http.post("/v1/files", files={"file": (filename, content)},
                                  data={"purpose": "batch"})
        assert response.status_code == 200, response.text
        return response.json()

    def create_batch(self, file_id: str, **fields) -> httpx.Response:
        return self.http.post("/v1/batches", json={"input_file_id": file_id, **fields})

    def batch(self, batch_id: str) -> dict:
        response = self.http.get(f"/v1/batches/{batch_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def pool(self) -> dict:
        return self.http.get("/v1/pool/status").json()

    def wait_status(self, batch_id: str, statuses: set[str], *, timeout: float) -> dict:
        return wait_until(lambda: (b := self.batch(batch_id))["status"] in statuses and b,
                          timeout=timeout, interval=0.25,
                          message=f"batch {batch_id} to reach {statuses}")

    def content(self, file_id: str) -> bytes:
        response = self.http.get(f"/v1/files/{file_id}/content")
        assert response.status_code == 200, response.text
        return response.content


def output_ids(content: bytes) -> list[str]:
    return [json.loads(line)["custom_id"] for line in content.splitlines() if line.strip()]
