"""BatchGenHttpClient against a scripted HTTP server."""

import io
import json
import pathlib
import socket
import threading

import pytest

from batchgen.batchgen_client import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    BatchFailedError,
    BatchGenError,
    BatchGenHttpClient,
    NoOutputError,
    NotFoundError,
    ServerError,
    WaitTimeoutError,
)

from .stub import Reply, error, make_batch, make_file, result_line, script_batch_run

# -- connection and headers --------------------------------------------------------------


def test_sends_user_agent_and_no_authorization_by_default(stub, client):
    stub.on("GET", "/v1/pool/status", Reply(json={}))

    client.pool_status()

    headers = stub.requests[0].headers
    assert headers["user-agent"].startswith("batchgen-client/")
    assert "authorization" not in headers


def test_api_key_argument_is_sent_as_bearer_token(stub):
    stub.on("GET", "/v1/pool/status", Reply(json={}))

    with BatchGenHttpClient(stub.url, api_key="sk-test") as client:
        client.pool_status()

    assert stub.requests[0].headers["authorization"] == "Bearer sk-test"


def test_api_key_and_base_url_from_the_environment(stub, monkeypatch):
    monkeypatch.setenv("BATCHGEN_API_KEY", "sk-env")
    monkeypatch.setenv("BATCHGEN_BASE_URL", stub.url)
    stub.on("GET", "/v1/pool/status", Reply(json={}))

    with BatchGenHttpClient() as client:
        client.pool_status()

    assert stub.requests[0].headers["authorization"] == "Bearer sk-env"


def test_base_url_may_end_with_v1(stub):
    stub.on("GET", "/v1/batches/batch_1", Reply(json=make_batch()))

    with BatchGenHttpClient(stub.url + "/v1/") as client:
        assert client.get_batch("batch_1")["id"] == "batch_1"


def test_context_manager_closes_the_connection_pool(stub):
    with BatchGenHttpClient(stub.url) as client:
        pass

    assert client._http.is_closed


# -- files ---------------------------------------------------------------------------------


def test_upload_sends_file_and_purpose_as_multipart(stub, client, tmp_path):
    path = tmp_path / "input.jsonl"
    path.write_bytes(b'{"custom_id": "1"}\n')
    stub.on("POST", "/v1/files", Reply(json=make_file()))

    file_obj = client.upload_file(path, purpose="batch")

    assert file_obj["id"] == "file-in"
    fields = stub.requests[0].multipart()
    assert fields["file"] == ("input.jsonl", b'{"custom_id": "1"}\n')
    assert fields["purpose"] == (None, b"batch")


def test_upload_sends_expires_after_as_the_openai_sdk_does(stub, client, tmp_path):
    path = tmp_path / "input.jsonl"
    path.write_bytes(b'{"custom_id": "1"}\n')
    stub.on("POST", "/v1/files", Reply(json=make_file()))

    client.upload_file(path, expires_after_seconds=7200)

    fields = stub.requests[0].multipart()
    assert fields["expires_after[anchor]"] == (None, b"created_at")
    assert fields["expires_after[seconds]"] == (None, b"7200")


def test_create_batch_sends_output_expires_after(stub, client):
    stub.on("POST", "/v1/batches", Reply(json=make_batch(status="validating")))

    client.create_batch("file-in", output_expires_after_seconds=86400)

    assert stub.requests[0].json()["output_expires_after"] == {"anchor": "created_at",
                                                               "seconds": 86400}


def test_upload_streams_the_file_in_chunks(stub, client, tmp_path, monkeypatch):
    path = tmp_path / "big.jsonl"
    data = b"x" * (1024 * 1024)
    path.write_bytes(data)
    read_sizes = []

    class RecordingReader(io.BufferedReader):
        def read(self, size=-1):
            read_sizes.append(size)
            return super().read(size)

    monkeypatch.setattr(pathlib.Path, "open", lambda self, mode="r": RecordingReader(
        io.FileIO(self, mode.replace("b", ""))))
    stub.on("POST", "/v1/files", Reply(json=make_file()))

    client.upload_file(path)

    assert stub.requests[0].multipart()["file"][1] == data
    assert len(read_sizes) > 1
    assert all(0 < size <= 64 * 1024 for size in read_sizes)


def test_file_calls_use_the_contract_paths(stub, client):
    stub.on("GET", "/v1/files/file-in", Reply(json=make_file()))
    stub.on("GET", "/v1/files", Reply(json={"object": "list", "data": [make_file()]}))
    stub.on("DELETE", "/v1/files/file-in",
            Reply(json={"id": "file-in", "object": "file", "deleted": True}))

    assert client.get_file("file-in")["id"] == "file-in"
    assert client.list_files(purpose="batch", limit=5)["data"][0]["id"] == "file-in"
    assert client.delete_file("file-in")["deleted"] is True
    assert stub.requests[1].query == {"purpose": ["batch"], "limit": ["5"]}


def test_download_file_content_returns_bytes(stub, client):
    stub.on("GET", "/v1/files/file-out/content", Reply(body=result_line("a")))

    assert client.download_file_content("file-out") == result_line("a")


def test_download_to_writes_the_file_and_leaves_no_temporary(stub, client, download_dir):
    content = b"".join(result_line(str(i)) for i in range(100))
    stub.on("GET", "/v1/files/file-out/content", Reply(body=content))

    path = client.download_to("file-out", download_dir / "out.jsonl")

    assert path == download_dir / "out.jsonl"
    assert path.read_bytes() == content
    assert [p.name for p in download_dir.iterdir()] == ["out.jsonl"]


def test_download_to_keeps_the_old_file_when_the_stream_breaks(stub, client, download_dir):
    target = download_dir / "out.jsonl"
    target.write_bytes(b"previous\n")
    # Announces 1000 bytes, sends 10 and hangs up.
    stub.on("GET", "/v1/files/file-out/content",
            Reply(chunks=[b"0123456789"], headers={"Content-Length": "1000"}))

    with pytest.raises(APIConnectionError):
        client.download_to("file-out", target)

    assert target.read_bytes() == b"previous\n"
    assert [p.name for p in download_dir.iterdir()] == ["out.jsonl"]


def test_download_to_of_a_missing_file_creates_nothing(stub, client, download_dir):
    with pytest.raises(NotFoundError):
        client.download_to("file-nope", download_dir / "out.jsonl")

    assert list(download_dir.iterdir()) == []


@pytest.fixture
def download_dir(tmp_path):
    """A directory only the download holds (other fixtures may write to tmp_path)."""
    path = tmp_path / "downloads"
    path.mkdir()
    return path


# -- batches -------------------------------------------------------------------------------


def test_create_batch_omits_unset_options(stub, client):
    stub.on("POST", "/v1/batches", Reply(json=make_batch(status="validating")))

    client.create_batch("file-in")

    assert stub.requests[0].json() == {
        "input_file_id": "file-in", "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }


def test_create_batch_sends_every_given_option(stub, client):
    stub.on("POST", "/v1/batches", Reply(json=make_batch(status="validating")))

    client.create_batch(
        input_file_id="file-in", endpoint="/v1/completions", metadata={"run": "7"},
        max_decoding_length=4096, max_context_length=8192, temperature=0.0, top_p=0.9, top_k=40,
    )

    assert stub.requests[0].json() == {
        "input_file_id": "file-in", "endpoint": "/v1/completions", "completion_window": "24h",
        "metadata": {"run": "7"}, "max_decoding_length": 4096, "max_context_length": 8192,
        "temperature": 0.0, "top_p": 0.9, "top_k": 40,
    }


def test_iter_batch_errors_pages_through_every_bad_line(stub, client):
    def errors(*lines):
        return [{"code": "invalid_json", "message": "bad", "line": n, "param": None}
                for n in lines]

    stub.on("GET", "/v1/batches/batch_1/errors",
            Reply(json={"object": "list", "data": errors(1, 2), "has_more": True, "total": 3}),
            Reply(json={"object": "list", "data": errors(5), "has_more": False, "total": 3}))

    assert [e["line"] for e in client.iter_batch_errors("batch_1")] == [1, 2, 5]
    queries = [r.query for r in stub.requests_to("GET", "/v1/batches/batch_1/errors")]
    assert queries == [{}, {"after": ["2"]}]


def test_batch_calls_use_the_contract_paths(stub, client):
    stub.on("GET", "/v1/batches/batch_1", Reply(json=make_batch()))
    stub.on("GET", "/v1/batches", Reply(json={"object": "list", "data": [], "has_more": False}))
    stub.on("POST", "/v1/batches/batch_1/cancel", Reply(json=make_batch(status="cancelling")))
    stub.on("GET", "/v1/pool/status", Reply(json={"pool_mode": True}))
    stub.on("GET", "/v1/models", Reply(json={"object": "list", "data": []}))

    assert client.get_batch("batch_1")["id"] == "batch_1"
    assert client.list_batches()["has_more"] is False
    client.list_batches(limit=5, after="batch_0")
    assert client.cancel_batch("batch_1")["status"] == "cancelling"
    assert client.pool_status() == {"pool_mode": True}
    assert client.list_models()["object"] == "list"
    assert stub.requests[1].query == {"limit": ["20"]}
    assert stub.requests[2].query == {"limit": ["5"], "after": ["batch_0"]}


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_class"),
    [(400, BadRequestError), (401, AuthenticationError), (404, NotFoundError),
     (500, ServerError), (503, ServerError), (418, APIError)],
)
def test_http_errors_are_typed_and_carry_the_envelope(stub, client, status, error_class):
    stub.on("GET", "/v1/batches/batch_x",
            error(status, "No batch batch_x", param="batch_id", code="not_found"))

    with pytest.raises(error_class) as caught:
        client.get_batch("batch_x")

    err = caught.value
    assert isinstance(err, APIError)
    assert not isinstance(err, RuntimeError)
    assert (err.status_code, err.message, err.type, err.param, err.code) == (
        status, "No batch batch_x", "invalid_request_error", "batch_id", "not_found")
    assert err.body["error"]["message"] == "No batch batch_x"
    assert str(err) == f"HTTP {status} [not_found]: No batch batch_x"


def test_non_json_error_body_becomes_the_message(stub, client):
    stub.on("GET", "/v1/batches/batch_1",
            Reply(502, body=b"<html>Bad Gateway</html>", headers={"Content-Type": "text/html"}))

    with pytest.raises(ServerError) as caught:
        client.get_batch("batch_1")

    assert caught.value.status_code == 502
    assert caught.value.body is None
    assert caught.value.message == "<html>Bad Gateway</html>"


def test_empty_error_body_uses_the_reason_phrase(stub, client):
    stub.on("DELETE", "/v1/files/file-in", Reply(400, body=b""))

    with pytest.raises(BadRequestError, match="Bad Request"):
        client.delete_file("file-in")


def test_json_error_without_envelope_is_kept_as_body(stub, client):
    stub.on("GET", "/v1/batches/batch_1", Reply(400, json={"detail": "nope"}))

    with pytest.raises(BadRequestError) as caught:
        client.get_batch("batch_1")

    assert caught.value.body == {"detail": "nope"}
    assert "nope" in caught.value.message


def test_success_without_json_is_a_clear_error(stub, client):
    stub.on("GET", "/v1/batches/batch_1", Reply(body=b"<html>proxy</html>"))

    with pytest.raises(BatchGenError, match="expected JSON"):
        client.get_batch("batch_1")


def test_connection_refused_raises_api_connection_error(free_port):
    with BatchGenHttpClient(f"http://127.0.0.1:{free_port}") as client:
        with pytest.raises(APIConnectionError, match="cannot reach GET"):
            client.get_batch("batch_1")


def test_a_silent_server_raises_api_timeout_error():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # accepts connections, never answers
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with BatchGenHttpClient(url, timeout_s=0.05) as client:
            with pytest.raises(APITimeoutError):
                client.get_batch("batch_1")


def test_health_check_is_true_on_200(stub, client):
    stub.on("GET", "/health", Reply(json={"status": "healthy"}))

    assert client.health_check() is True


@pytest.mark.parametrize("status", [503, 500])
def test_health_check_is_false_on_errors(stub, client, status):
    stub.on("GET", "/health", Reply(status, json={"status": "unhealthy", "reason": "engine"}))

    assert client.health_check() is False


def test_health_check_is_false_when_unreachable(free_port):
    with BatchGenHttpClient(f"http://127.0.0.1:{free_port}") as client:
        assert client.health_check() is False


# -- waiting -------------------------------------------------------------------------------


def test_wait_for_batch_polls_until_completed(stub, client, clock):
    stub.on("GET", "/v1/batches/batch_1",
            Reply(json=make_batch(status="validating")),
            Reply(json=make_batch(status="in_progress", completed=1)),
            Reply(json=make_batch(status="completed", completed=3, output_file_id="file-out")))

    batch = client.wait_for_batch("batch_1", poll_interval=10.0)

    assert batch["status"] == "completed"
    assert clock.sleeps == [10.0, 10.0]


@pytest.mark.parametrize("status", ["failed", "cancelled", "expired"])
def test_wait_for_batch_raises_runtime_error_when_not_completed(stub, client, status):
    ended = make_batch(status=status, error={"code": "batch_failed", "message": "worker died"})
    stub.on("GET", "/v1/batches/batch_1", Reply(json=make_batch()), Reply(json=ended))

    with pytest.raises(RuntimeError) as caught:
        client.wait_for_batch("batch_1")

    assert isinstance(caught.value, BatchFailedError)
    assert caught.value.status == status
    assert caught.value.batch == ended
    assert str(caught.value) == f"batch batch_1 ended {status}: batch_failed: worker died"


def test_validation_failure_message_names_the_first_bad_line(stub, client):
    errors = {"object": "list", "data": [
        {"code": "invalid_json", "message": "not JSON", "line": 3, "param": None},
        {"code": "invalid_url", "message": "bad url", "line": 9, "param": "url"},
    ]}
    stub.on("GET", "/v1/batches/batch_1", Reply(json=make_batch(status="failed", errors=errors)))

    with pytest.raises(BatchFailedError, match="line 3 invalid_json: not JSON \\(and 1 more\\)"):
        client.wait_for_batch("batch_1")


def test_wait_for_batch_times_out_with_timeout_error(stub, client, clock):
    stub.on("GET", "/v1/batches/batch_1", Reply(json=make_batch()))

    with pytest.raises(TimeoutError) as caught:
        client.wait_for_batch("batch_1", poll_interval=4.0, timeout=10.0)

    assert isinstance(caught.value, WaitTimeoutError)
    assert caught.value.batch["status"] == "in_progress"
    # Polls at 0, 4, 8 and (cut short) 10 s, then gives up.
    assert clock.sleeps == [4.0, 4.0, 2.0]
    assert len(stub.requests) == 4


def test_wait_for_batch_rides_out_a_short_outage(stub, client, clock):
    stub.on("GET", "/v1/batches/batch_1",
            Reply(json=make_batch()),
            error(503, "restarting", type="server_error"),
            Reply(502, body=b"Bad Gateway"),
            Reply(json=make_batch(status="completed", output_file_id="file-out")))

    batch = client.wait_for_batch("batch_1", poll_interval=5.0)

    assert batch["status"] == "completed"
    assert clock.sleeps == [5.0, 5.0, 5.0]


def test_wait_for_batch_gives_up_after_two_minutes_of_outage(stub, client, clock):
    stub.on("GET", "/v1/batches/batch_1",
            Reply(json=make_batch()), error(503, "down", type="server_error"))

    with pytest.raises(ServerError, match="down"):
        client.wait_for_batch("batch_1", poll_interval=30.0)

    # One good poll, then failures at 30, 60, 90, 120 and 150 s: 120 s after the first.
    assert clock.sleeps == [30.0] * 5


def test_wait_for_batch_does_not_poll_through_other_errors(stub, client, clock):
    stub.on("GET", "/v1/batches/batch_1", error(500, "bug", type="server_error"))

    with pytest.raises(ServerError, match="bug"):
        client.wait_for_batch("batch_1")

    assert clock.sleeps == []


def test_wait_for_batch_polls_through_an_unreachable_server(free_port, clock):
    with BatchGenHttpClient(f"http://127.0.0.1:{free_port}") as client:
        with pytest.raises(APIConnectionError):
            client.wait_for_batch("batch_1", poll_interval=60.0)

    assert clock.sleeps == [60.0, 60.0]


def test_wait_for_batch_progress_bar_shows_finished_requests(stub, client, capsys):
    stub.on("GET", "/v1/batches/batch_1",
            Reply(json=make_batch(status="in_progress", total=3, completed=1)),
            Reply(json=make_batch(status="completed", total=3, completed=2, failed=1)))

    client.wait_for_batch("batch_1", progress=True)

    err = capsys.readouterr().err
    assert "3/3" in err
    assert "failed=1" in err


def test_submit_batch_uploads_creates_waits_and_downloads(stub, client, tmp_path):
    output = result_line("a") + result_line("b")
    script_batch_run(stub, statuses=["in_progress", "completed"], output=output)
    source = tmp_path / "input.jsonl"
    source.write_bytes(b'{"custom_id": "a"}\n{"custom_id": "b"}\n')

    batch = client.submit_batch(
        input_file_path=str(source), output_file_path=str(tmp_path / "output.jsonl"),
        max_decoding_length=4096,
    )

    assert batch["status"] == "completed"
    assert (tmp_path / "output.jsonl").read_bytes() == output
    upload = stub.requests_to("POST", "/v1/files")[0].multipart()
    assert upload["file"][1] == source.read_bytes()
    assert upload["purpose"] == (None, b"batch")
    assert stub.requests_to("POST", "/v1/batches")[0].json()["max_decoding_length"] == 4096


def test_submit_batch_without_output_path_downloads_nothing(stub, client, tmp_path):
    script_batch_run(stub, statuses=["completed"], output=b"")
    (tmp_path / "input.jsonl").write_bytes(b"{}\n")

    batch = client.submit_batch(tmp_path / "input.jsonl")

    assert batch["output_file_id"] == "file-out"
    assert stub.requests_to("GET", "/v1/files/file-out/content") == []


def test_submit_batch_that_fails_raises_and_writes_nothing(stub, client, tmp_path):
    script_batch_run(stub, statuses=["failed"], output=b"")
    (tmp_path / "input.jsonl").write_bytes(b"{}\n")

    with pytest.raises(RuntimeError, match="ended failed"):
        client.submit_batch(tmp_path / "input.jsonl", tmp_path / "output.jsonl")

    assert not (tmp_path / "output.jsonl").exists()


# -- results -------------------------------------------------------------------------------


def test_iter_results_reads_output_then_error_file(stub, client):
    done = make_batch(status="completed", output_file_id="file-out", error_file_id="file-err")
    stub.on("GET", "/v1/batches/batch_1", Reply(json=done))
    stub.on("GET", "/v1/files/file-out/content", Reply(body=result_line("a") + b"\n"))
    failed = {"custom_id": "b", "response": None, "error": {"code": "context_length_exceeded"}}
    stub.on("GET", "/v1/files/file-err/content", Reply(body=json.dumps(failed).encode()))

    results = list(client.iter_results("batch_1"))

    assert [r["custom_id"] for r in results] == ["a", "b"]
    assert results[1]["error"]["code"] == "context_length_exceeded"
    assert [r["custom_id"] for r in client.iter_results(done, include_errors=False)] == ["a"]
    assert [r["custom_id"] for r in client.iter_results("file-err")] == ["b"]


def test_iter_results_keeps_unicode_line_separators_inside_strings(stub, client):
    tricky = "one\u2028two\u0085three"
    stub.on("GET", "/v1/files/file-out/content", Reply(body=result_line("a", tricky)))

    [result] = client.iter_results("file-out")

    assert result["response"]["body"]["choices"][0]["message"]["content"] == tricky


def test_iter_results_of_an_unfinished_batch_raises_no_output(stub, client):
    stub.on("GET", "/v1/batches/batch_1", Reply(json=make_batch(status="in_progress")))

    with pytest.raises(NoOutputError, match="in_progress"):
        list(client.iter_results("batch_1"))


def test_iter_results_reports_a_corrupt_line(stub, client):
    stub.on("GET", "/v1/files/file-out/content", Reply(body=result_line("a") + b"{oops\n"))

    with pytest.raises(BatchGenError, match="file-out: line 2 is not valid JSON"):
        list(client.iter_results("file-out"))


def test_iter_results_yields_lines_before_the_download_ends(stub, client):
    release = threading.Event()
    sent = []

    def body():
        yield result_line("first")
        release.wait(timeout=5)
        sent.append("second")
        yield result_line("second")

    stub.on("GET", "/v1/files/file-out/content", Reply(chunks=body()))
    results = client.iter_results("file-out")

    first = next(results)
    second_was_sent_already = bool(sent)
    release.set()

    assert first["custom_id"] == "first"
    assert not second_was_sent_already
    assert [r["custom_id"] for r in results] == ["second"]


# -- following a running batch -------------------------------------------------------------


def test_follow_results_reads_appended_output_by_offset(stub, client, clock):
    a, b, c = result_line("a"), result_line("b"), result_line("c")
    stub.on("GET", "/v1/batches/batch_1",
            Reply(json=make_batch(status="in_progress", completed=1)),
            Reply(json=make_batch(status="in_progress", completed=2)),
            Reply(json=make_batch(status="completed", completed=3, output_file_id="file-out")))
    # The second answer ends in half a line: it must be read again, whole, next time.
    stub.on("GET", "/v1/batches/batch_1/output",
            Reply(body=a), Reply(body=b + c[:10]), Reply(body=c))
    polled = []

    results = list(client.follow_results("batch_1", poll_interval=2.0, on_poll=polled.append))

    assert [r["custom_id"] for r in results] == ["a", "b", "c"]
    offsets = [r.query["offset"] for r in stub.requests_to("GET", "/v1/batches/batch_1/output")]
    assert offsets == [["0"], [str(len(a))], [str(len(a) + len(b))]]
    assert [batch["status"] for batch in polled] == ["in_progress", "in_progress", "completed"]
    assert clock.sleeps == [2.0, 2.0]


def test_follow_results_falls_back_to_the_final_output(stub, client):
    stub.on("GET", "/v1/batches/batch_1",
            Reply(json=make_batch(status="in_progress")),
            Reply(json=make_batch(status="completed", output_file_id="file-out")))
    stub.on("GET", "/v1/files/file-out/content", Reply(body=result_line("a") + result_line("b")))
    # No route for /v1/batches/batch_1/output: the stub answers 404 like an older server.

    results = list(client.follow_results("batch_1"))

    assert [r["custom_id"] for r in results] == ["a", "b"]
    assert len(stub.requests_to("GET", "/v1/batches/batch_1/output")) == 1


def test_follow_results_yields_partial_output_then_raises_if_cancelled(stub, client):
    stub.on("GET", "/v1/batches/batch_1",
            Reply(json=make_batch(status="cancelled", output_file_id="file-out")))
    stub.on("GET", "/v1/batches/batch_1/output", Reply(body=result_line("a")))
    seen = []

    with pytest.raises(BatchFailedError, match="ended cancelled"):
        for result in client.follow_results("batch_1"):
            seen.append(result["custom_id"])

    assert seen == ["a"]


def test_follow_results_does_not_fall_back_once_incremental_output_worked(stub, client):
    stub.on("GET", "/v1/batches/batch_1", Reply(json=make_batch(status="in_progress")))
    stub.on("GET", "/v1/batches/batch_1/output",
            Reply(body=result_line("a")), error(500, "disk gone", type="server_error"))

    with pytest.raises(ServerError, match="disk gone"):
        list(client.follow_results("batch_1"))


@pytest.fixture
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the user's guide, as written ----------------------------------------------------------


def test_guide_quick_start_runs_as_written(stub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "input.jsonl").write_bytes(b'{"custom_id": "request-1"}\n')
    script_batch_run(stub, statuses=["in_progress", "completed"], output=result_line("request-1"))

    client = BatchGenHttpClient(stub.url)
    batch = client.submit_batch(
        input_file_path="input.jsonl",
        output_file_path="output.jsonl",
        max_decoding_length=4096,
    )

    assert batch["status"] == "completed"
    assert (tmp_path / "output.jsonl").read_bytes() == result_line("request-1")


def test_guide_step_by_step_runs_as_written(stub, tmp_path, monkeypatch, clock):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "input.jsonl").write_bytes(b'{"custom_id": "request-1"}\n')
    script_batch_run(stub, statuses=["in_progress", "completed"], output=result_line("request-1"))
    client = BatchGenHttpClient(stub.url)

    file_obj = client.upload_file("input.jsonl", purpose="batch")
    batch = client.create_batch(
        input_file_id=file_obj["id"],
        endpoint="/v1/chat/completions",
        max_decoding_length=4096,
        temperature=0.7,
    )
    batch = client.wait_for_batch(batch["id"], poll_interval=10.0)
    content = client.download_file_content(batch["output_file_id"])
    with open("output.jsonl", "wb") as f:
        f.write(content)

    assert (tmp_path / "output.jsonl").read_bytes() == result_line("request-1")
    assert clock.sleeps == [10.0]
    assert stub.requests_to("POST", "/v1/batches")[0].json()["temperature"] == 0.7
