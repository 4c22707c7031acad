"""The 429 policy: Retry-After honoured (capped at 60 s), else 1, 2, 4, 8, 16 s, then
RateLimitError (a RuntimeError) after 5 retries. Sleeps are recorded, never taken."""

import time
from email.utils import formatdate

import pytest
import tenacity

from batchgen._retry import MAX_WAIT_S, parse_retry_after, wait_retry_after
from batchgen.errors import RateLimitError, ServerError

from .stub import Reply, error, make_batch, make_file


def busy(retry_after: str | None = None) -> Reply:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return error(429, "Intake pool is full", type="rate_limit_error", code="intake_pool_full",
                 headers=headers)


def test_retry_after_seconds_is_waited_then_the_call_succeeds(stub, client, clock):
    stub.on("POST", "/v1/batches", busy("7"), Reply(json=make_batch()))

    batch = client.create_batch("file-in")

    assert batch["id"] == "batch_1"
    assert clock.sleeps == [7]
    assert len(stub.requests_to("POST", "/v1/batches")) == 2


def test_without_retry_after_backoff_is_1_2_4_8_16(stub, client, clock):
    stub.on("GET", "/v1/batches/batch_1", *[busy()] * 5, Reply(json=make_batch()))

    assert client.get_batch("batch_1")["status"] == "in_progress"
    assert clock.sleeps == [1, 2, 4, 8, 16]


def test_gives_up_after_five_retries_with_a_runtime_error(stub, client, clock):
    stub.on("POST", "/v1/batches", busy())

    with pytest.raises(RuntimeError) as caught:
        client.create_batch("file-in")

    assert isinstance(caught.value, RateLimitError)
    assert caught.value.status_code == 429
    assert caught.value.code == "intake_pool_full"
    assert caught.value.type == "rate_limit_error"
    assert clock.sleeps == [1, 2, 4, 8, 16]
    assert len(stub.requests_to("POST", "/v1/batches")) == 6


def test_retry_after_above_the_cap_waits_60_seconds(stub, client, clock):
    stub.on("POST", "/v1/batches", busy("120"), busy("61"), Reply(json=make_batch()))

    client.create_batch("file-in")

    assert clock.sleeps == [MAX_WAIT_S, MAX_WAIT_S]


def test_retry_after_as_http_date(stub, client, clock):
    in_30_s = formatdate(time.time() + 30, usegmt=True)
    stub.on("GET", "/v1/pool/status", busy(in_30_s), Reply(json={"pool_mode": True}))

    client.pool_status()

    [waited] = clock.sleeps
    assert 28 <= waited <= 30  # HTTP dates have whole seconds


def test_unreadable_retry_after_falls_back_to_backoff(stub, client, clock):
    stub.on("GET", "/v1/pool/status", busy("soon"), busy("soon"), Reply(json={}))

    client.pool_status()

    assert clock.sleeps == [1, 2]


def test_final_error_keeps_the_last_retry_after_hint(stub, client, clock):
    stub.on("POST", "/v1/batches", busy("3"))

    with pytest.raises(RateLimitError) as caught:
        client.create_batch("file-in")

    assert caught.value.retry_after == 3
    assert clock.sleeps == [3] * 5


def test_upload_is_retried_with_the_whole_file(stub, client, clock, tmp_path):
    data = b'{"custom_id": "a"}\n' * 1000
    path = tmp_path / "input.jsonl"
    path.write_bytes(data)
    stub.on("POST", "/v1/files", busy("2"), Reply(json=make_file()))

    client.upload_file(path)

    uploads = stub.requests_to("POST", "/v1/files")
    assert [u.multipart()["file"] for u in uploads] == [("input.jsonl", data)] * 2
    assert clock.sleeps == [2]


def test_streamed_download_is_retried(stub, client, clock, tmp_path):
    stub.on("GET", "/v1/files/file-out/content", busy("1"), Reply(body=b"line\n"))

    path = client.download_to("file-out", tmp_path / "out.jsonl")

    assert path.read_bytes() == b"line\n"
    assert clock.sleeps == [1]


def test_other_errors_are_not_retried(stub, client, clock):
    stub.on("GET", "/v1/batches/batch_1", error(500, "boom", type="server_error"))

    with pytest.raises(ServerError):
        client.get_batch("batch_1")

    assert clock.sleeps == []
    assert len(stub.requests_to("GET", "/v1/batches/batch_1")) == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [("30", 30.0), (" 5 ", 5.0), ("1.5", 1.5), ("0", 0.0), ("-4", 0.0),
     (None, None), ("", None), ("soon", None), ("nan", None),
     ("Wed, 21 Oct 2015 07:28:30 GMT", 30.0), ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0)],
)
def test_parse_retry_after(value, expected):
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert parse_retry_after(value, now=now) == expected


@pytest.mark.parametrize(("attempt", "expected"), [(1, 1), (5, 16), (6, 32), (7, 60), (20, 60)])
def test_backoff_without_hint_is_exponential_and_capped(attempt, expected):
    wait = wait_retry_after(tenacity.wait_exponential(multiplier=1, max=MAX_WAIT_S))
    state = tenacity.RetryCallState(retry_object=tenacity.Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    state.set_exception((RateLimitError, RateLimitError("busy", status_code=429), None))

    assert wait(state) == expected


# --- quota_exceeded and 503 ------------------------------------------------------------


def over_quota(retry_after: str | None) -> Reply:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return error(429, "API key 'team-a' used 1000 of its 1000 tokens for today",
                 type="rate_limit_error", code="quota_exceeded", headers=headers)


def test_a_quota_that_frees_tomorrow_is_raised_at_once_not_retried(stub, client, clock):
    from batchgen import QuotaExceededError

    stub.on("POST", "/v1/batches", over_quota("43200"))

    with pytest.raises(QuotaExceededError) as caught:
        client.create_batch("file-in")

    assert isinstance(caught.value, RateLimitError) and isinstance(caught.value, RuntimeError)
    assert caught.value.code == "quota_exceeded"
    assert caught.value.retry_after == 43200
    assert "1000 tokens" in str(caught.value)
    assert clock.sleeps == []
    assert len(stub.requests_to("POST", "/v1/batches")) == 1


def test_an_intake_quota_that_frees_soon_is_waited_out(stub, client, clock):
    stub.on("POST", "/v1/batches", over_quota("30"), Reply(json=make_batch()))

    assert client.create_batch("file-in")["id"] == "batch_1"
    assert clock.sleeps == [30]


def test_a_quota_that_stays_is_raised_after_the_retries(stub, client, clock):
    from batchgen import QuotaExceededError

    stub.on("POST", "/v1/batches", over_quota("5"))

    with pytest.raises(QuotaExceededError):
        client.create_batch("file-in")
    assert clock.sleeps == [5] * 5


@pytest.mark.parametrize("code", ["server_busy", "database_busy"])
def test_a_503_with_retry_after_is_retried_like_a_429(stub, client, clock, code):
    busy_503 = error(503, "busy", type="server_error", code=code, headers={"Retry-After": "1"})
    stub.on("POST", "/v1/batches", busy_503, busy_503, Reply(json=make_batch()))

    assert client.create_batch("file-in")["id"] == "batch_1"
    assert clock.sleeps == [1, 1]
    assert len(stub.requests_to("POST", "/v1/batches")) == 3


def test_a_503_that_stays_raises_service_unavailable_after_the_retries(stub, client, clock):
    from batchgen import ServiceUnavailableError

    stub.on("GET", "/v1/batches/batch_1",
            error(503, "busy", type="server_error", code="database_busy",
                  headers={"Retry-After": "2"}))

    with pytest.raises(ServiceUnavailableError) as caught:
        client.get_batch("batch_1")
    assert isinstance(caught.value, ServerError)
    assert caught.value.retry_after == 2
    assert clock.sleeps == [2] * 5


def test_a_503_without_retry_after_is_not_retried(stub, client, clock):
    stub.on("GET", "/v1/batches/batch_1", error(503, "down", type="server_error"))

    with pytest.raises(ServerError):
        client.get_batch("batch_1")
    assert clock.sleeps == []
