from __future__ import annotations

import pytest

from tests import services
from tests.e2e.harness import Server, fresh_postgres_database, server_env
from tests.fleet.fleet import ExtraWorker, RabbitVhost, RecordingApi


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/fleet/" in str(item.fspath):
            # Real processes: `-m "not e2e"` skips them with the other end-to-end tests.
            item.add_marker(pytest.mark.fleet)
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def fleet_backends(tmp_path):
    """A fresh PostgreSQL database and a fresh RabbitMQ virtual host, dropped after
    the test: (database_url, broker_url)."""
    services.require("postgresql")
    services.require("rabbitmq")
    database_url, drop = fresh_postgres_database(services.POSTGRES_URL)
    vhost = RabbitVhost(services.RABBITMQ_URL)
    try:
        vhost.create(server_env(storage=tmp_path / "purge", broker_url=services.RABBITMQ_URL))
        yield database_url, vhost.url
    finally:
        vhost.delete()
        drop()


@pytest.fixture
def start_fleet(tmp_path):
    """Start `manage.py serve` (the web server, the control worker and
    `--inference-workers N`) with the given settings; `add_worker(name)` starts one
    more inference worker beside it. Everything is stopped after the test."""
    started: list[tuple[Server, list[ExtraWorker]]] = []

    class Fleet:
        def __init__(self, server: Server) -> None:
            self.server = server
            self.api = RecordingApi(server.base_url)
            self.extra: list[ExtraWorker] = []

        def add_worker(self, name: str) -> ExtraWorker:
            worker = ExtraWorker(name, self.server.env,
                                 self.server.storage.parent / f"{name}.log").start()
            self.extra.append(worker)
            return worker

        @property
        def logs(self):
            return [self.server.log_path, *(w.log_path for w in self.extra)]

    def _start(*, workers: int, database_url: str | None = None, broker_url: str | None = None,
               args: tuple[str, ...] = (), **settings: str) -> Fleet:
        storage = tmp_path / f"storage{len(started)}"
        server = Server(storage=storage,
                        env=server_env(storage=storage, database_url=database_url,
                                       broker_url=broker_url, **settings),
                        args=["--inference-workers", str(workers), *args])
        fleet = Fleet(server)
        started.append((server, fleet.extra))
        server.start(ready_timeout=180)
        return fleet

    yield _start
    for server, extra in started:
        for worker in extra:
            worker.stop()
        server.stop()
