from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.harness import Api, Server, server_env

pytestmark = pytest.mark.e2e


@pytest.fixture
def start_server(tmp_path):
    """Start `manage.py serve` with the given environment; `prepare(storage)` runs
    first (e.g. to mount a small disk under the storage path). Stopped after the
    test, with anything it left behind."""
    servers: list[Server] = []

    def _start(*, args: list[str] | None = None, ready_timeout: float = 120,
               prepare=None, **env_options) -> tuple[Server, Api]:
        storage = tmp_path / f"storage{len(servers)}"
        if prepare is not None:
            storage.mkdir(parents=True, exist_ok=True)
            prepare(storage)
        server = Server(storage=storage, env=server_env(storage=storage, **env_options),
                        args=args or [])
        servers.append(server)
        server.start(ready_timeout=ready_timeout)
        return server, Api(server.base_url)

    yield _start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def model_dir() -> Path:
    """The prepared default model, for the tests that run real vLLM."""
    path = os.environ.get("BATCHGEN_TEST_MODEL_DIR")
    if not path or not (Path(path) / "config.json").exists():
        pytest.fail("BATCHGEN_TEST_MODEL_DIR must name the prepared default model "
                    "(`make test` prepares it)")
    return Path(path)


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
