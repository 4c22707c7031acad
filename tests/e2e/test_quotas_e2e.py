"""Per-key quotas and accounting against the real processes (web, control worker,
inference worker, embedded broker, SQLite or the CI database). The inference
worker runs the simulated engine: the quota and accounting logic is the same for
any engine, and a slow simulated batch holds the intake pool for as long as the
test needs without a real model's start-up."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx

from tests.e2e.harness import ROOT, chat_lines, wait_until
from tests.e2e.test_metrics_e2e import scrape


def manage(server, *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=server.env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


class KeyClient:
    def __init__(self, base_url: str, key: str) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=60,
                                 headers={"Authorization": f"Bearer {key}"})

    def create(self, lines: int, prefix: str) -> httpx.Response:
        uploaded = self.http.post("/v1/files", files={"file": ("in.jsonl", chat_lines(
            lines, prefix=prefix))}, data={"purpose": "batch"})
        assert uploaded.status_code == 200, uploaded.text
        return self.http.post("/v1/batches", json={
            "input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions",
            "completion_window": "24h"})

    def batch(self, batch_id: str) -> dict:
        return self.http.get(f"/v1/batches/{batch_id}").json()

    def wait(self, batch_id: str, statuses: set[str], timeout: float = 90) -> dict:
        return wait_until(lambda: (b := self.batch(batch_id))["status"] in statuses and b,
                          timeout=timeout, interval=0.2, message=f"{batch_id} in {statuses}")

    def output_usage(self, batch: dict) -> tuple[int, int, int]:
        """(lines, prompt tokens, completion tokens) summed over the output file."""
        content = self.http.get(f"/v1/files/{batch['output_file_id']}/content").content
        lines = [json.loads(raw) for raw in content.splitlines()]
        bodies = [line["response"]["body"] for line in lines]
        return (len(lines), sum(b["usage"]["prompt_tokens"] for b in bodies),
                sum(b["usage"]["completion_tokens"] for b in bodies))


def test_a_key_over_its_intake_quota_is_refused_while_another_gets_in_and_usage_adds_up(
        start_server):
    # Given: a server whose requests take 2 s each, and two keys: team-a may hold 20
    # requests in the intake pool, team-b has no limit.
    server, _ = start_server(BATCHGEN_SIM_LATENCY_MS="2000", BATCHGEN_CHUNK_SIZE="10",
                             BATCHGEN_RETRY_AFTER_SECONDS="7")
    raw_a = manage(server, "createapikey", "team-a", "--max-intake-requests", "20").strip()
    raw_b = manage(server, "createapikey", "team-b").strip()
    a, b = KeyClient(server.base_url, raw_a), KeyClient(server.base_url, raw_b)

    # When: team-a fills its quota with a running batch and asks for more
    first = a.create(20, "a1")
    assert first.status_code == 200, first.text
    a.wait(first.json()["id"], {"in_progress"})
    refused = a.create(1, "a2")

    # Then: 429 quota_exceeded with Retry-After, while team-b still gets in
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "quota_exceeded"
    assert refused.headers["Retry-After"] == "7"
    other = b.create(30, "b1")
    assert other.status_code == 200, other.text

    finished = [a.wait(first.json()["id"], {"completed"}),
                b.wait(other.json()["id"], {"completed"})]
    # With its batch done, team-a has room again; a batch larger than its quota fails
    # whole at admission, nothing of it run.
    again = a.create(5, "a3")
    assert again.status_code == 200, again.text
    too_big = a.create(21, "a4")
    assert too_big.status_code == 200, too_big.text
    failed = a.wait(too_big.json()["id"], {"failed"})
    assert failed["error"]["code"] == "quota_exceeded", failed
    assert failed["request_counts"]["completed"] == 0 and failed["output_file_id"] is None
    finished.append(a.wait(again.json()["id"], {"completed"}))

    # And: the usage report and /metrics show per key the sums over the output lines
    expected = {"team-a": [0, 0, 0], "team-b": [0, 0, 0]}
    for name, client, batch in [("team-a", a, finished[0]), ("team-b", b, finished[1]),
                                ("team-a", a, finished[2])]:
        for i, figure in enumerate(client.output_usage(batch)):
            expected[name][i] += figure
    assert expected["team-a"][0] == 25 and expected["team-b"][0] == 30

    report = json.loads(manage(server, "usage_report", "--since", "2000-01-01",
                               "--format", "json"))
    by_key = {name: [0, 0, 0] for name in expected}
    for row in report:
        for i, column in enumerate(("requests", "input_tokens", "output_tokens")):
            by_key[row["key"]][i] += row[column]
    assert by_key == expected

    samples = scrape(server.base_url)
    for name, (requests, prompt, completion) in expected.items():
        assert samples[f"batchgen_key_requests_total{{key={name},outcome=completed}}"] == requests
        assert samples[f"batchgen_key_input_tokens_total{{key={name}}}"] == prompt
        assert samples[f"batchgen_key_output_tokens_total{{key={name}}}"] == completion
    assert samples["batchgen_key_max_intake_requests{key=team-a}"] == 20
    metrics_text = httpx.get(f"{server.base_url}/metrics").text
    assert raw_a[:10] not in metrics_text and raw_b[:10] not in metrics_text
