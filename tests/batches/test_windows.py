"""Completion windows (batches/windows.py): `24h` always, other windows within the
server's bounds, and each batch expiring by its own window."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F

from batches.models import Batch, BatchStatus
from batches.services import batches_expire
from tests.batches.test_api import CONTENT, create
from tests.files.test_api import assert_envelope

pytestmark = pytest.mark.django_db


@pytest.fixture
def input_file(upload) -> dict:
    return upload(CONTENT)


@pytest.mark.parametrize("window, seconds", [("1h", 3600), ("72h", 72 * 3600),
                                             ("7d", 7 * 86400), ("90m", 5400)])
def test_a_window_within_the_bounds_sets_the_batch_s_own_expiry(
        api, input_file, published, window, seconds):
    response = create(api, input_file_id=input_file["id"], completion_window=window)

    assert response.status_code == 200, response.content
    batch = response.json()
    assert batch["completion_window"] == window
    assert batch["expires_at"] - batch["created_at"] in (seconds - 1, seconds)


@pytest.mark.parametrize("window", ["59m", "169h", "8d"])
def test_a_window_shorter_or_longer_than_the_bounds_is_400_naming_completion_window(
        api, input_file, published, window):
    response = create(api, input_file_id=input_file["id"], completion_window=window)

    error = assert_envelope(response, 400, param="completion_window",
                            code="invalid_completion_window")
    assert "3600 and 604800 seconds" in error["message"]
    assert not Batch.objects.exists()


def test_the_bounds_are_settings_read_per_request(api, input_file, published, settings):
    settings.BATCHGEN_MIN_COMPLETION_WINDOW_SECONDS = 60
    settings.BATCHGEN_MAX_COMPLETION_WINDOW_SECONDS = 600

    assert create(api, input_file_id=input_file["id"],
                  completion_window="5m").status_code == 200
    refused = create(api, input_file_id=input_file["id"], completion_window="1h")
    assert_envelope(refused, 400, param="completion_window")


def test_24h_is_taken_whatever_the_bounds(api, input_file, published, settings):
    settings.BATCHGEN_MIN_COMPLETION_WINDOW_SECONDS = 60
    settings.BATCHGEN_MAX_COMPLETION_WINDOW_SECONDS = 600

    response = create(api, input_file_id=input_file["id"], completion_window="24h")

    assert response.status_code == 200, response.content


def test_a_batch_expires_by_its_own_window_not_24h(api, upload, published, settings):
    settings.BATCHGEN_MIN_COMPLETION_WINDOW_SECONDS = 60
    short = create(api, input_file_id=upload(CONTENT)["id"], completion_window="2m").json()
    long = create(api, input_file_id=upload(CONTENT)["id"], completion_window="24h").json()
    Batch.objects.update(status=BatchStatus.IN_PROGRESS)
    # Three minutes on: past the short window, well inside the long one.
    Batch.objects.update(created_at=F("created_at") - timedelta(minutes=3),
                         expires_at=F("expires_at") - timedelta(minutes=3))

    assert batches_expire() == 1

    failed = Batch.objects.get(id=short["id"])
    assert failed.status == BatchStatus.FAILED
    assert "2m completion window" in failed.error["message"]
    assert Batch.objects.get(id=long["id"]).status == BatchStatus.IN_PROGRESS
