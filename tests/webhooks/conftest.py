from __future__ import annotations

import pytest

from tests.batches.conftest import create_batch  # noqa: F401 - batches to end
from tests.webhooks.receiver import Receiver


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
