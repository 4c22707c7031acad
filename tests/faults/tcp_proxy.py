"""A TCP proxy a fault test controls, put between BatchGen and a shared service
(PostgreSQL, RabbitMQ, Redis) so the test can cut the service off from BatchGen
without stopping it under other engineers' tests.

    with TcpProxy("127.0.0.1", 5672) as proxy:
        url = f"amqp://guest:guest@127.0.0.1:{proxy.port}//"
        ...
        proxy.cut()      # close every connection, refuse new ones (ECONNREFUSED)
        proxy.restore()  # accept again on the same port
        proxy.reset()    # close every connection (RST) but keep accepting
        proxy.delay(0.2) # hold each forwarded piece this long (0 to stop)

Threads, not asyncio: a test drives it from plain synchronous code, and each
connection is two blocking pumps. Every thread is a daemon and the proxy closes
itself after `lifetime` seconds, so a test that dies without closing it leaves
nothing listening for long.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time


def _abort(sock: socket.socket) -> None:
    """Close with RST, as a vanished peer or a dropped network path does, so the
    other side learns at once instead of waiting in FIN_WAIT."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # SHUT_RD wakes a pump blocked in recv() on this socket (close alone does not)
    # and sends nothing, so the close that follows is still a reset.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, port: int = 0,
                 lifetime: float = 900.0) -> None:
        self.target = (target_host, target_port)
        self.port = port
        self.lifetime = lifetime
        self.accepted = 0  # connections accepted since start (tests can await a reconnect)
        self._lock = threading.Lock()
        self._pairs: set[_Pair] = set()
        self._listener: socket.socket | None = None
        self._closed = threading.Event()  # set once the port is closed for good
        self._closing = False  # from the start of close(): restore() no longer listens
        self._delay = 0.0
        self._deadline: threading.Timer | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> TcpProxy:
        self._listen()
        self._deadline = threading.Timer(self.lifetime, self.close)
        self._deadline.daemon = True
        self._deadline.start()
        return self

    def close(self) -> None:
        self._closing = True
        if self._deadline is not None:
            self._deadline.cancel()
        self._stop_listening()
        self._drop_all()
        self._closed.set()  # last: whoever waits on it finds the port closed

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- faults --------------------------------------------------------------------------

    @property
    def is_cut(self) -> bool:
        return self._listener is None

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def cut(self) -> None:
        """The service is gone: every open connection is reset and new ones are
        refused until restore()."""
        self._stop_listening()
        self._drop_all()

    def restore(self) -> None:
        """The service is back, on the same address."""
        if self.is_cut and not self._closing:
            self._listen()

    def reset(self) -> None:
        """Every open connection is reset; new ones are accepted (a blip)."""
        self._drop_all()

    def delay(self, seconds: float) -> None:
        """Hold each piece of data this long before forwarding it (a slow path)."""
        self._delay = max(0.0, seconds)

    # --- internals -----------------------------------------------------------------------

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept_loop, args=(listener,), daemon=True,
                         name=f"tcp-proxy-accept-{self.port}").start()

    def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown wakes the thread blocked in accept(); close frees the port.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()

    def _drop_all(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, set()
        for pair in pairs:
            pair.drop()

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut or closed
            if self._listener is not listener:
                _abort(client)
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _abort(client)  # the service itself is down: the client sees a reset
                continue
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.add(pair)
                self.accepted += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(pair, source, sink), daemon=True,
                                 name=f"tcp-proxy-pump-{self.port}").start()

    def _pump(self, pair: _Pair, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if self._delay:
                    time.sleep(self._delay)
                sink.sendall(data)
        except OSError:
            pass
        else:
            if not pair.dropped:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)  # pass the half-close on
                if source is pair.client:
                    return  # the client said goodbye; the service's answer ends the pair
                # The service closed its side: close both gracefully (a reset could
                # discard its last bytes, e.g. an error message).
                with self._lock:
                    self._pairs.discard(pair)
                pair.close()
                return
        with self._lock:
            self._pairs.discard(pair)
        pair.drop()


class _Pair:
    """A client's connection and the one the proxy opened to the service for it."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.dropped = False
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def drop(self) -> None:
        # Flag first: the pumps this wakes must not pass a clean EOF on before the reset.
        self.dropped = True
        _abort(self.client)
        _abort(self.upstream)

    def close(self) -> None:
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.close()
