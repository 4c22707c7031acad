"""Parameter priority (serving.params.resolve_body, through each endpoint's spec):
body > batch > server default."""

from __future__ import annotations

import copy

import pytest

from serving.endpoints import endpoint_spec
from serving.params import BatchParams, output_token_limit

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]
ABSENT = object()


def chat_body(**fields) -> dict:
    return {"model": "m", "messages": MESSAGES, **fields}


# (body value, batch value, resolved value) per sampling key; ABSENT = no key.
SAMPLING_CASES = [
    # temperature: greedy (0.0) when nobody sets it
    ("temperature", 0.3, 0.7, 0.3),
    ("temperature", None, 0.7, 0.7),
    ("temperature", ABSENT, 0.7, 0.7),
    ("temperature", ABSENT, None, 0.0),
    ("temperature", None, None, 0.0),
    ("temperature", 0.0, 0.9, 0.0),  # an explicit 0 in the body is a value, not "unset"
    # top_p: off (no key) when nobody sets it
    ("top_p", 0.5, 0.9, 0.5),
    ("top_p", ABSENT, 0.9, 0.9),
    ("top_p", None, 0.9, 0.9),
    ("top_p", ABSENT, None, ABSENT),
    ("top_p", None, None, ABSENT),
    # top_k: off (no key) when nobody sets it
    ("top_k", 5, 40, 5),
    ("top_k", ABSENT, 40, 40),
    ("top_k", None, 40, 40),
    ("top_k", ABSENT, None, ABSENT),
    ("top_k", 0, 40, 0),
]


@pytest.mark.parametrize("key, in_body, in_batch, expected", SAMPLING_CASES)
def test_sampling_priority_is_body_then_batch_then_greedy(key, in_body, in_batch, expected):
    body = chat_body() if in_body is ABSENT else chat_body(**{key: in_body})
    batch = BatchParams(**{key: in_batch})

    resolved = endpoint_spec(CHAT).resolve_body(body, batch)

    if expected is ABSENT:
        assert key not in resolved
    else:
        assert resolved[key] == expected


def test_with_nothing_set_decoding_is_greedy_with_top_p_and_top_k_off():
    resolved = endpoint_spec(CHAT).resolve_body(chat_body(), BatchParams())

    assert resolved == {"model": "m", "messages": MESSAGES, "temperature": 0.0}


# (body fields, batch max_decoding_length, endpoint, resolved key, resolved value)
LIMIT_CASES = [
    ({"max_completion_tokens": 10}, 100, CHAT, "max_completion_tokens", 10),
    ({"max_tokens": 20}, 100, CHAT, "max_completion_tokens", 20),
    ({"max_completion_tokens": 10, "max_tokens": 20}, 100, CHAT, "max_completion_tokens", 10),
    ({}, 100, CHAT, "max_completion_tokens", 100),
    ({"max_tokens": None}, 100, CHAT, "max_completion_tokens", 100),
    ({"max_tokens": 20}, 100, COMPLETIONS, "max_tokens", 20),
    ({"max_completion_tokens": 10}, 100, COMPLETIONS, "max_tokens", 10),
    ({}, 100, COMPLETIONS, "max_tokens", 100),
    ({"max_tokens": 20}, None, COMPLETIONS, "max_tokens", 20),
    ({"max_completion_tokens": 10}, None, CHAT, "max_completion_tokens", 10),
]


@pytest.mark.parametrize("fields, batch_limit, endpoint, key, value", LIMIT_CASES)
def test_output_limit_is_body_then_batch_under_the_endpoints_key(
        fields, batch_limit, endpoint, key, value):
    body = {"model": "m", "prompt": "p", **fields} if endpoint == COMPLETIONS \
        else chat_body(**fields)

    resolved = endpoint_spec(endpoint).resolve_body(
        body, BatchParams(max_decoding_length=batch_limit))

    other = "max_tokens" if key == "max_completion_tokens" else "max_completion_tokens"
    assert resolved[key] == value
    assert other not in resolved  # exactly one limit key reaches the engine


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
def test_no_limit_anywhere_leaves_the_rest_of_the_context_to_the_engine(endpoint):
    resolved = endpoint_spec(endpoint).resolve_body(
        chat_body(), BatchParams(max_decoding_length=None))

    assert "max_tokens" not in resolved
    assert "max_completion_tokens" not in resolved
    assert output_token_limit(chat_body(), BatchParams()) is None


def test_resolving_does_not_mutate_the_input_body():
    body = chat_body(max_tokens=20, top_p=None, temperature=None,
                     metadata={"nested": ["kept"]})
    original = copy.deepcopy(body)

    endpoint_spec(CHAT).resolve_body(
        body, BatchParams(temperature=0.5, top_k=3, max_decoding_length=9))

    assert body == original


def test_fields_the_priority_rules_do_not_cover_pass_through_unchanged():
    body = chat_body(stop=["\n"], seed=7, presence_penalty=0.5, tools=[{"type": "function"}])

    resolved = endpoint_spec(CHAT).resolve_body(body, BatchParams(temperature=1.0))

    for key in ("model", "messages", "stop", "seed", "presence_penalty", "tools"):
        assert resolved[key] == body[key]
