"""The fault tests' TCP proxy: what a client sees when a test cuts, restores and
resets the path to a service."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest

from tests.faults.tcp_proxy import TcpProxy


@pytest.fixture
def echo_port():
    server = socket.create_server(("127.0.0.1", 0))

    def serve_one(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(1024):
                conn.sendall(data)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def roundtrip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(payload)
        return conn.recv(1024)


def test_cut_resets_open_connections_and_refuses_new_ones_until_restore(echo_port):
    with TcpProxy("127.0.0.1", echo_port, lifetime=60) as proxy:
        open_conn = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        open_conn.sendall(b"before")
        assert open_conn.recv(1024) == b"before"

        proxy.cut()

        with pytest.raises(ConnectionResetError):
            open_conn.recv(1024)
        with pytest.raises(ConnectionRefusedError):
            roundtrip(proxy.port, b"during")

        proxy.restore()

        assert roundtrip(proxy.port, b"after") == b"after"


def test_reset_drops_connections_but_keeps_accepting(echo_port):
    with TcpProxy("127.0.0.1", echo_port, lifetime=60) as proxy:
        open_conn = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        open_conn.sendall(b"x")
        assert open_conn.recv(1024) == b"x"

        proxy.reset()

        with pytest.raises(ConnectionResetError):
            open_conn.recv(1024)
        assert roundtrip(proxy.port, b"again") == b"again"
        assert proxy.accepted == 2


def test_proxy_closes_itself_after_its_lifetime(echo_port):
    proxy = TcpProxy("127.0.0.1", echo_port, lifetime=2).start()
    assert not proxy.is_cut  # listening
    assert proxy._closed.wait(timeout=30)
    with pytest.raises(ConnectionRefusedError):
        roundtrip(proxy.port, b"late")
