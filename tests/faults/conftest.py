from __future__ import annotations

import pytest

from tests.e2e.harness import Api, Server, server_env
from tests.faults.faults import kill_leftovers


@pytest.fixture
def start_server(tmp_path):
    """Start `manage.py serve` (real processes, simulated engine by default) with the
    given environment; `prepare(storage)` runs first (e.g. to mount a small disk
    under the storage path). Stopped after the test, with anything it left behind."""
    servers: list[Server] = []

    def _start(*, args: list[str] | None = None, ready_timeout: float = 120,
               prepare=None, **env_options) -> tuple[Server, Api]:
        storage = tmp_path / f"storage{len(servers)}"
        storage.mkdir(parents=True, exist_ok=True)
        if prepare is not None:
            prepare(storage)
        server = Server(storage=storage, env=server_env(storage=storage, **env_options),
                        args=args or [])
        servers.append(server)
        server.start(ready_timeout=ready_timeout)
        return server, Api(server.base_url)

    yield _start
    for server in servers:
        server.stop()
        kill_leftovers(server)


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/faults/" in str(item.fspath) and "start_server" in item.fixturenames:
            # Real processes, like the end-to-end tests: `-m "not e2e"` skips them too.
            item.add_marker(pytest.mark.e2e)
