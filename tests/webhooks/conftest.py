from __future__ import annotations

import pytest

from tests.batches.conftest import create_batch  # noqa: F401 - batches to end
from tests.webhooks.receiver import FakeDns, Receiver

# The local receivers listen on 127.0.0.1, which the destination policy refuses by
# default: these tests allow exactly that address, as an operator would with
# BATCHGEN_WEBHOOK_ALLOWED_HOSTS (tests/webhooks/test_destinations.py tests the policy).
LOOPBACK_RECEIVERS = ["127.0.0.1"]


@pytest.fixture(autouse=True)
def loopback_receivers_allowed(settings):
    settings.BATCHGEN_WEBHOOK_ALLOWED_HOSTS = LOOPBACK_RECEIVERS


@pytest.fixture(autouse=True)
def dns(monkeypatch) -> FakeDns:
    """Names the tests use resolve without a DNS server: *.example.com to a public
    address unless `dns.names` says otherwise; anything else as the system does."""
    fake = FakeDns()
    fake.install(monkeypatch)
    return fake


@pytest.fixture
def receiver():
    """A real HTTP receiver on a free port; `receiver.answers` scripts its answers."""
    started = Receiver().start()
    yield started
    started.stop()


@pytest.fixture
def quick_retries(settings):
    """Retries due at once (backoff of 0 s), so a test runs them without waiting."""
    settings.BATCHGEN_WEBHOOK_RETRY_FIRST_SECONDS = 0.0
    settings.BATCHGEN_WEBHOOK_TIMEOUT_SECONDS = 5.0
