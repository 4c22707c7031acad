"""The `batchgen` command against a scripted HTTP server."""

import io
import json
import socket
from datetime import datetime

import pytest

from batchgen import _clock
from batchgen._progress import BatchProgress
from batchgen.cli import main

from .stub import Reply, error, make_batch, make_file, result_line, script_batch_run


@pytest.fixture
def input_file(tmp_path):
    path = tmp_path / "input.jsonl"
    path.write_bytes(b'{"custom_id": "a"}\n')
    return path


def run(stub, *args):
    return main(["--base-url", stub.url, *args])


def assert_one_error_line(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("batchgen: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


# -- submit --------------------------------------------------------------------------------


def test_submit_runs_the_batch_and_writes_results(stub, input_file, tmp_path, capsys):
    output = result_line("a")
    script_batch_run(stub, statuses=["in_progress", "completed"], output=output)

    code = run(stub, "submit", str(input_file), "-o", str(tmp_path / "out.jsonl"),
               "--max-decoding-length", "512", "--temperature", "0.7",
               "--metadata", "team=nlp", "run=3", "--poll-interval", "1")

    out, err = capsys.readouterr()
    assert code == 0
    assert (tmp_path / "out.jsonl").read_bytes() == output
    assert "batch batch_1 completed: 3 ok, 0 failed" in out
    assert "created batch batch_1" in err
    assert "3/3" in err  # the progress bar
    assert stub.requests_to("POST", "/v1/batches")[0].json() == {
        "input_file_id": "file-in", "endpoint": "/v1/chat/completions",
        "completion_window": "24h", "metadata": {"team": "nlp", "run": "3"},
        "max_decoding_length": 512, "temperature": 0.7,
    }


def test_submit_of_a_failed_batch_exits_1_with_the_reason(stub, input_file, tmp_path, capsys):
    failed = make_batch(status="failed", error={"code": "capacity_exceeded",
                                                "message": "intake pool full"})
    script_batch_run(stub, statuses=["failed"], output=b"", final=failed)

    code = run(stub, "submit", str(input_file), "-o", str(tmp_path / "out.jsonl"),
               "--no-progress")

    err = capsys.readouterr().err
    assert code == 1
    assert "batch batch_1 ended failed" in err
    assert "capacity_exceeded: intake pool full" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out.jsonl").exists()


def test_submit_of_a_cancelled_batch_keeps_partial_results(stub, input_file, tmp_path, capsys):
    cancelled = make_batch(status="cancelled", completed=1, output_file_id="file-out")
    script_batch_run(stub, statuses=["cancelled"], output=result_line("a"), final=cancelled)

    code = run(stub, "submit", str(input_file), "-o", str(tmp_path / "out.jsonl"))

    err = capsys.readouterr().err
    assert code == 1
    assert "ended cancelled" in err
    assert "partial results written to" in err
    assert (tmp_path / "out.jsonl").read_bytes() == result_line("a")


def test_ctrl_c_during_submit_says_how_to_resume(stub, input_file, monkeypatch, capsys):
    script_batch_run(stub, statuses=["in_progress"], output=b"")

    def interrupt(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(_clock, "sleep", interrupt)

    code = run(stub, "submit", str(input_file), "-o", "out.jsonl")

    err = capsys.readouterr().err
    assert code == 130
    assert "batch batch_1 keeps running" in err
    assert "batchgen status batch_1" in err
    assert "batchgen download batch_1 -o out.jsonl --wait" in err
    assert stub.requests_to("POST", "/v1/batches/batch_1/cancel") == []


def test_submit_detach_prints_only_the_batch_id(stub, input_file, capsys):
    script_batch_run(stub, statuses=["in_progress"], output=b"")

    code = run(stub, "submit", str(input_file), "--detach")

    assert code == 0
    assert capsys.readouterr().out == "batch_1\n"
    assert stub.requests_to("GET", "/v1/batches/batch_1") == []


def test_submit_timeout_exits_1_and_says_how_to_resume(stub, input_file, capsys):
    script_batch_run(stub, statuses=["in_progress"], output=b"")

    code = run(stub, "submit", str(input_file), "--timeout", "30", "--no-progress")

    err = capsys.readouterr().err
    assert code == 1
    assert "still in_progress after 30.0 s" in err
    assert "batchgen status batch_1" in err


def test_submit_rejects_malformed_metadata(stub, input_file, capsys):
    with pytest.raises(SystemExit) as caught:
        run(stub, "submit", str(input_file), "--metadata", "novalue")

    assert caught.value.code == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_submit_of_a_missing_file_is_one_error_line(stub, tmp_path, capsys):
    code = run(stub, "submit", str(tmp_path / "nope.jsonl"))

    assert code == 1
    assert_one_error_line(capsys.readouterr().err, "nope.jsonl")


# -- status, list, cancel, pool, health ----------------------------------------------------


def test_status_prints_a_summary(stub, capsys):
    errors = {"object": "list", "data": [
        {"code": "invalid_json", "message": "Line is not JSON", "line": 2, "param": None}]}
    batch = make_batch(status="failed", total=0, errors=errors, metadata={"team": "nlp"})
    stub.on("GET", "/v1/batches/batch_1", Reply(json=batch))

    code = run(stub, "status", "batch_1")

    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[0] == "batch_1  failed"
    assert "line 2: invalid_json: Line is not JSON" in out
    assert "team=nlp" in out
    assert "file-in" in out


def test_status_shows_the_server_s_eta_and_a_window_at_risk(stub, capsys):
    batch = make_batch(estimated_completion_at=1_700_003_600, at_risk=True)
    stub.on("GET", "/v1/batches/batch_1", Reply(json=batch))

    assert run(stub, "status", "batch_1") == 0

    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if "estimated completion" in line]
    assert datetime.fromtimestamp(1_700_003_600).astimezone().strftime("%H:%M:%S") in line
    assert "at risk" in line


def test_the_watch_bar_shows_the_server_s_eta():
    stream = io.StringIO()
    with BatchProgress(file=stream) as bar:
        bar.update(make_batch(completed=1, estimated_completion_at=1_700_003_600))
    shown = datetime.fromtimestamp(1_700_003_600).astimezone().strftime("%H:%M:%S")
    assert f"done ~{shown}" in stream.getvalue()


def test_status_shows_the_batch_token_usage(stub, capsys):
    usage = {"input_tokens": 1200, "input_tokens_details": {"cached_tokens": 512},
             "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 40},
             "total_tokens": 1500}
    stub.on("GET", "/v1/batches/batch_1", Reply(json=make_batch(status="completed",
                                                                 usage=usage)))

    run(stub, "status", "batch_1")

    assert "tokens       1200 in (512 cached), 300 out (40 reasoning)" in capsys.readouterr().out


def test_status_of_a_batch_with_more_bad_lines_than_shown_points_to_the_errors_endpoint(
        stub, capsys):
    errors = {"object": "list", "total": 10_001, "has_more": True, "data": [
        {"code": "invalid_json", "message": "bad", "line": n, "param": None}
        for n in range(1, 101)]}
    stub.on("GET", "/v1/batches/batch_1", Reply(json=make_batch(status="failed", errors=errors)))

    run(stub, "status", "batch_1")

    out = capsys.readouterr().out
    shown = out.count("invalid_json: bad")
    assert f"... and {10_001 - shown} more (GET /v1/batches/batch_1/errors)" in out


def test_status_json_prints_the_raw_object(stub, capsys):
    batch = make_batch(status="completed", completed=3, output_file_id="file-out")
    stub.on("GET", "/v1/batches/batch_1", Reply(json=batch))

    code = run(stub, "status", "batch_1", "--json")

    assert code == 0
    assert json.loads(capsys.readouterr().out) == batch


def test_list_prints_a_table(stub, capsys):
    page = {"object": "list", "has_more": True, "first_id": "batch_2", "last_id": "batch_1",
            "data": [make_batch("batch_2", "in_progress", total=10, completed=4, failed=1),
                     make_batch("batch_1", "completed", total=3, completed=3)]}
    stub.on("GET", "/v1/batches", Reply(json=page))

    code = run(stub, "list", "--limit", "2")

    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == ["ID", "STATUS", "DONE/TOTAL", "FAILED", "CREATED", "ENDPOINT"]
    assert lines[1].split()[:4] == ["batch_2", "in_progress", "5/10", "1"]
    assert lines[2].split()[:4] == ["batch_1", "completed", "3/3", "0"]
    assert "batchgen list --after batch_1" in err
    assert stub.requests[0].query == {"limit": ["2"]}


def test_list_with_no_batches(stub, capsys):
    stub.on("GET", "/v1/batches", Reply(json={"object": "list", "data": [], "has_more": False}))

    assert run(stub, "list") == 0
    assert capsys.readouterr().out == "no batches\n"


def test_cancel_prints_the_new_status(stub, capsys):
    stub.on("POST", "/v1/batches/batch_1/cancel", Reply(json=make_batch(status="cancelling")))

    assert run(stub, "cancel", "batch_1") == 0
    assert capsys.readouterr().out == "batch_1: cancelling\n"


def test_pool_prints_the_capacity_figures(stub, capsys):
    stub.on("GET", "/v1/pool/status", Reply(json={
        "intake_pool_size": 1500, "intake_pool_capacity": 1_000_000,
        "scheduling_pool_active": 128, "scheduling_pool_free": 10112,
        "scheduling_pool_capacity": 10240, "active_batches": 3, "pool_mode": True}))

    assert run(stub, "pool") == 0
    out = capsys.readouterr().out
    assert "1,500 / 1,000,000 requests queued (0.1%)" in out
    assert "128 active, 10,112 free of 10,240 slots (1.2% busy)" in out
    assert "active batches   3" in out


@pytest.mark.parametrize(("status", "code"), [(200, 0), (503, 1)])
def test_health_exit_code(stub, capsys, status, code):
    stub.on("GET", "/health", Reply(status, json={"status": "x"}))

    assert run(stub, "health") == code
    assert stub.url in capsys.readouterr().out


# -- download ------------------------------------------------------------------------------


def test_download_of_a_file_id(stub, tmp_path, capsys):
    stub.on("GET", "/v1/files/file-out/content", Reply(body=result_line("a")))

    code = run(stub, "download", "file-out", "-o", str(tmp_path / "out.jsonl"))

    assert code == 0
    assert (tmp_path / "out.jsonl").read_bytes() == result_line("a")
    assert "wrote file-out" in capsys.readouterr().out


def test_download_of_a_batch_waits_with_wait(stub, tmp_path):
    stub.on("GET", "/v1/batches/batch_1",
            Reply(json=make_batch(status="in_progress")),
            Reply(json=make_batch(status="completed", output_file_id="file-out")))
    stub.on("GET", "/v1/files/file-out/content", Reply(body=result_line("a")))

    code = run(stub, "download", "batch_1", "-o", str(tmp_path / "out.jsonl"), "--wait",
               "--no-progress")

    assert code == 0
    assert (tmp_path / "out.jsonl").read_bytes() == result_line("a")


def test_download_of_a_running_batch_without_wait_refuses(stub, tmp_path, capsys):
    stub.on("GET", "/v1/batches/batch_1", Reply(json=make_batch(status="in_progress")))

    code = run(stub, "download", "batch_1", "-o", str(tmp_path / "out.jsonl"))

    assert code == 1
    assert_one_error_line(capsys.readouterr().err, "still in_progress", "--wait")
    assert not (tmp_path / "out.jsonl").exists()


# -- tail ----------------------------------------------------------------------------------


def test_tail_prints_result_lines_as_they_arrive(stub, capsys):
    stub.on("GET", "/v1/batches/batch_1",
            Reply(json=make_batch(status="in_progress", completed=1)),
            Reply(json=make_batch(status="completed", completed=2, output_file_id="file-out")))
    stub.on("GET", "/v1/batches/batch_1/output",
            Reply(body=result_line("a")), Reply(body=result_line("b")))

    code = run(stub, "tail", "batch_1", "--no-progress")

    out = capsys.readouterr().out
    assert code == 0
    assert [json.loads(line)["custom_id"] for line in out.splitlines()] == ["a", "b"]


def test_tail_falls_back_to_the_output_file(stub, capsys):
    stub.on("GET", "/v1/batches/batch_1",
            Reply(json=make_batch(status="in_progress")),
            Reply(json=make_batch(status="completed", output_file_id="file-out")))
    stub.on("GET", "/v1/files/file-out/content", Reply(body=result_line("a")))

    code = run(stub, "tail", "batch_1")

    out = capsys.readouterr().out
    assert code == 0
    assert [json.loads(line)["custom_id"] for line in out.splitlines()] == ["a"]


def test_tail_of_a_failed_batch_exits_1(stub, capsys):
    failed = make_batch(status="failed", error={"code": "batch_failed", "message": "oom"})
    stub.on("GET", "/v1/batches/batch_1", Reply(json=failed))
    stub.on("GET", "/v1/batches/batch_1/output", Reply(body=b""))

    code = run(stub, "tail", "batch_1", "--no-progress")

    assert code == 1
    assert_one_error_line(capsys.readouterr().err, "ended failed: batch_failed: oom")


# -- errors and configuration --------------------------------------------------------------


def test_api_error_is_one_line_on_stderr(stub, capsys):
    stub.on("GET", "/v1/batches/batch_x", error(404, "No batch batch_x", code="not_found"))

    code = run(stub, "status", "batch_x")

    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert_one_error_line(err, "HTTP 404 [not_found]: No batch batch_x")


def test_unreachable_server_is_one_line_on_stderr(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    code = main(["--base-url", f"http://127.0.0.1:{port}", "pool"])

    assert code == 1
    assert_one_error_line(capsys.readouterr().err, "cannot reach", f"127.0.0.1:{port}")


def test_base_url_from_the_environment_and_after_the_command(stub, monkeypatch, capsys):
    stub.on("POST", "/v1/batches/batch_1/cancel", Reply(json=make_batch(status="cancelled")))
    monkeypatch.setenv("BATCHGEN_BASE_URL", stub.url)

    assert main(["cancel", "batch_1"]) == 0
    monkeypatch.setenv("BATCHGEN_BASE_URL", "http://127.0.0.1:9")
    assert main(["cancel", "batch_1", "--base-url", stub.url, "--api-key", "sk-x"]) == 0
    assert len(stub.requests) == 2
    assert stub.requests[1].headers["authorization"] == "Bearer sk-x"


def test_file_upload_goes_through_the_cli_submit(stub, input_file, capsys):
    stub.on("POST", "/v1/files", Reply(json=make_file()))
    stub.on("POST", "/v1/batches", Reply(json=make_batch(status="validating")))

    assert run(stub, "submit", str(input_file), "--detach") == 0
    fields = stub.requests_to("POST", "/v1/files")[0].multipart()
    assert fields["file"] == ("input.jsonl", input_file.read_bytes())
    assert fields["purpose"] == (None, b"batch")


@pytest.mark.parametrize("endpoint", ["/v1/embeddings", "/v1/responses", "/v1/rerank",
                                      "/v1/score"])
def test_submit_endpoint_is_the_batch_endpoint(stub, input_file, tmp_path, endpoint):
    script_batch_run(stub, statuses=["completed"], output=result_line("a"))

    code = run(stub, "submit", str(input_file), "-o", str(tmp_path / "out.jsonl"),
               "--endpoint", endpoint, "--poll-interval", "1")

    assert code == 0
    assert stub.requests_to("POST", "/v1/batches")[0].json()["endpoint"] == endpoint
