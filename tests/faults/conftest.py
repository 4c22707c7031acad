from __future__ import annotations

import pytest

from tests.e2e.conftest import start_server  # noqa: F401 - the same real-process fixture


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/faults/" in str(item.fspath) and "start_server" in item.fixturenames:
            # Real processes, like the end-to-end tests: `-m "not e2e"` skips them too.
            item.add_marker(pytest.mark.e2e)
