"""The endpoint registry: one spec per URL, and the only place a URL is spelled."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from batches.models import Endpoint
from batchgen.batchgen_client import ENDPOINTS as CLIENT_ENDPOINTS
from serving.endpoints import ENDPOINTS, EndpointSpec, endpoint_spec
from serving.endpoints.base import register

ROOT = Path(__file__).resolve().parents[2]
# Code that must ask the registry rather than know an endpoint.
APPS = ("serving", "batches", "inference", "files")
URL = re.compile(r"/v1/(chat/completions|completions|embeddings|responses|score|rerank)\b")


def test_the_batch_model_offers_exactly_the_registered_endpoints():
    assert sorted(Endpoint.values) == sorted(ENDPOINTS)
    for url, spec in ENDPOINTS.items():
        assert Endpoint[spec.member] == url


def test_every_spec_decodes_its_own_lines_and_refuses_another_endpoints_url():
    for url, spec in ENDPOINTS.items():
        other = next(u for u in ENDPOINTS if u != url)
        line = b'{"custom_id": "a", "method": "POST", "url": "%s", "body": {}}' % other.encode()
        with pytest.raises(Exception, match="url"):
            spec.decoder.decode(line)


def test_the_client_lists_exactly_the_registered_endpoints():
    # The client installs without the server, so it keeps its own list (the CLI's
    # --endpoint help): this keeps it from drifting.
    assert sorted(CLIENT_ENDPOINTS) == sorted(ENDPOINTS)


def test_an_unknown_endpoint_is_named_in_the_error():
    with pytest.raises(ValueError, match="/v1/unknown"):
        endpoint_spec("/v1/unknown")


def test_a_url_cannot_be_registered_twice():
    class Again(EndpointSpec):
        url = "/v1/chat/completions"
        line_type = type(ENDPOINTS["/v1/chat/completions"]).line_type

    with pytest.raises(ValueError, match="registered twice"):
        register(Again)


def test_no_module_outside_the_endpoint_specs_spells_an_endpoint_url():
    spelled = [
        f"{path.relative_to(ROOT)}:{number}"
        for app in APPS
        for path in (ROOT / app).rglob("*.py")
        if "endpoints" not in path.relative_to(ROOT / app).parts
        and "migrations" not in path.parts
        for number, text in enumerate(path.read_text().splitlines(), 1)
        if URL.search(text)
    ]
    assert spelled == []
