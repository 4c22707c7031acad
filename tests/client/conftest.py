"""Fixtures for the client tests; they need no Django and never really sleep.

`clock` is autouse: `batchgen._clock.sleep` records and advances fake time instead of
sleeping, and `batchgen._clock.monotonic` reads that fake time.
"""

import pytest

from batchgen import _clock
from batchgen.batchgen_client import BatchGenHttpClient

from .stub import FakeClock, StubServer


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(_clock, "sleep", fake.sleep)
    monkeypatch.setattr(_clock, "monotonic", fake.monotonic)
    return fake


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BATCHGEN_API_KEY", raising=False)
    monkeypatch.delenv("BATCHGEN_BASE_URL", raising=False)


@pytest.fixture
def stub():
    server = StubServer()
    yield server
    server.close()


@pytest.fixture
def client(stub: StubServer):
    with BatchGenHttpClient(stub.url, timeout_s=10) as c:
        yield c
