"""Running calls at the same moment on real threads, each with its own database
connection and transactions, for the tests of races between two calls."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest


def require_concurrent_database() -> None:
    from django.db import connection

    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        # Shared-cache in-memory SQLite answers "table is locked" at once instead of
        # waiting out the busy timeout as the file database of a real server does.
        pytest.skip("needs PostgreSQL or a file-backed SQLite test database")


def run_together(count: int, work: Callable[[int], object]) -> list:
    """Run `work(i)` on `count` threads released at once; their results or errors."""
    from django.db import connection

    barrier = threading.Barrier(count)
    outcomes: list = [None] * count

    def run(i: int) -> None:
        try:
            barrier.wait()
            outcomes[i] = work(i)
        except Exception as exc:  # compared by the test
            outcomes[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def at_once(*calls: Callable[[], object]) -> list:
    """The results (or errors) of `calls`, each started on its own thread at once."""
    return run_together(len(calls), lambda i: calls[i]())
