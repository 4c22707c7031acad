"""The Files API over real HTTP: the official openai SDK, and a client that hangs
up mid-upload."""

from __future__ import annotations

import contextlib
import os
import socket

import openai
import pytest

from tests.e2e.harness import chat_lines, wait_until


@pytest.fixture
def server(start_server):
    return start_server()


def test_openai_sdk_files_round_trip(server, tmp_path):
    srv, api = server
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused")
    path = tmp_path / "input.jsonl"
    path.write_bytes(chat_lines(3))

    created = client.files.create(file=path.open("rb"), purpose="batch")
    assert created.id.startswith("file-") and created.bytes == path.stat().st_size
    assert created.purpose == "batch" and created.filename == "input.jsonl"

    listed = client.files.list(purpose="batch")
    assert [f.id for f in listed.data] == [created.id]
    assert client.files.retrieve(created.id).bytes == created.bytes
    assert client.files.content(created.id).read() == path.read_bytes()

    deleted = client.files.delete(created.id)
    assert deleted.deleted is True and deleted.id == created.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)


def open_under(srv, directory) -> list[str]:
    """The files under `directory` that the server's processes hold open. The web
    worker spools a request body it is still receiving to an unnamed file there
    (batchgen_site/request_spool.py), so it shows only in /proc."""
    prefix = str(directory) + os.sep
    held = []
    for process in srv.processes():
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{process.pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{process.pid}/fd/{fd}")
                    if target.startswith(prefix):
                        held.append(target)
    return held


def test_client_disconnect_mid_upload_leaves_nothing(server):
    srv, api = server
    boundary = "batchgenboundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"big.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n").encode()
    declared = len(head) + 50 * 1024 * 1024
    uploads = srv.storage / "uploads"
    with socket.create_connection(("127.0.0.1", srv.port)) as sock:
        sock.sendall((f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                      f"Content-Length: {declared}\r\n\r\n").encode() + head)
        for _ in range(64):  # 4 MiB of the promised 50 MiB, then hang up
            sock.sendall(b"x" * 65536)
        wait_until(lambda: open_under(srv, uploads), timeout=30,
                   message="the upload's body to be spooled to the uploads volume")
    # The server notices the hang-up, drops the spooled bytes and records nothing.
    wait_until(lambda: not open_under(srv, uploads), timeout=60,
               message="the spooled upload to be dropped")
    assert api.http.get("/v1/files").json()["data"] == []
    assert [path.name for path in uploads.iterdir()] == []


def test_api_keys_with_the_openai_sdk(start_server, tmp_path):
    import subprocess
    import sys

    from tests.e2e.harness import ROOT

    srv, api = start_server()
    created = subprocess.run([sys.executable, "manage.py", "createapikey", "sdk-user"],
                             cwd=ROOT, env=srv.env, capture_output=True, text=True, check=True)
    key = created.stdout.strip()
    path = tmp_path / "input.jsonl"
    path.write_bytes(chat_lines(2))

    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="bg-wrong").files.list()
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=key)
    uploaded = client.files.create(file=path.open("rb"), purpose="batch")
    assert [f.id for f in client.files.list().data] == [uploaded.id]
    assert api.http.get("/v1/files").status_code == 401
