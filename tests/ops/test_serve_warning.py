"""`manage.py serve` warns at start-up when it listens beyond loopback with no API key."""

from __future__ import annotations

import logging

import pytest

from batchgen_site.management.commands.serve import Command
from core.auth import apikey_create

pytestmark = pytest.mark.django_db(transaction=True)

WARNING = "without API keys: anyone who reaches this address can use the API"


@pytest.fixture
def start_up(monkeypatch, settings, caplog):
    settings.BATCHGEN_ENGINE = "simulated"

    def run(listen_ip: str) -> list[str]:
        monkeypatch.setenv("BATCHGEN_LISTEN_IP", listen_ip)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="batchgen.serve"):
            Command()._prepare()
        return [r.getMessage() for r in caplog.records if r.name == "batchgen.serve"]

    return run


@pytest.mark.parametrize("listen_ip", ["0.0.0.0", "10.1.2.3", "::"])
def test_open_server_beyond_loopback_warns(start_up, listen_ip):
    warnings = [m for m in start_up(listen_ip) if WARNING in m]
    assert warnings == [f"listening on {listen_ip} {WARNING} (create a key with "
                        "`manage.py createapikey NAME`)"]


@pytest.mark.parametrize("listen_ip", ["127.0.0.1", "::1", "localhost"])
def test_loopback_only_does_not_warn(start_up, listen_ip):
    assert not [m for m in start_up(listen_ip) if WARNING in m]


def test_gpu_host_serving_no_api_does_not_warn(monkeypatch, caplog, settings):
    # `serve --inference-only`: no web server here, so nothing listens
    settings.BATCHGEN_ENGINE = "simulated"
    monkeypatch.setenv("BATCHGEN_LISTEN_IP", "0.0.0.0")
    with caplog.at_level(logging.WARNING, logger="batchgen.serve"):
        Command()._prepare(web=False)
    assert WARNING not in caplog.text


def test_server_with_a_key_does_not_warn(start_up):
    apikey_create(name="ops")
    messages = start_up("0.0.0.0")
    assert not [m for m in messages if WARNING in m]
    assert any("SIMULATED engine" in m for m in messages)  # the start-up did log
