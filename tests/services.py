"""The real services the suite uses on localhost, and what to do when one is not
there: skip with a message on a developer's machine, fail in CI (CI=true)."""

from __future__ import annotations

import os
import socket
import sys

SERVICES = {
    "postgresql": ("127.0.0.1", 5432),
    "redis": ("127.0.0.1", 6379),
    "rabbitmq": ("127.0.0.1", 5672),
}
POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/7")
RABBITMQ_URL = os.environ.get("TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def reachable(name: str) -> bool:
    host, port = SERVICES[name]
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def require(name: str) -> None:
    """In a test: skip (with the reason) or, in CI, fail when the service is down."""
    import pytest

    if reachable(name):
        return
    host, port = SERVICES[name]
    message = f"{name} is not running on {host}:{port}"
    if in_ci():
        pytest.fail(f"{message}; CI must exercise it")
    pytest.skip(f"{message}; start it to run this test")


if __name__ == "__main__":
    # Exit 0 when reachable, 2 to skip (with a message), 1 in CI.
    service = sys.argv[1]
    if reachable(service):
        sys.exit(0)
    print(f"{service} is not running on {SERVICES[service]}: "
          f"{'failing (CI)' if in_ci() else 'skipping its tests'}", file=sys.stderr)
    sys.exit(1 if in_ci() else 2)
