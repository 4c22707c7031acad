"""Usage per API key per UTC day (KeyUsage): added by the progress flushes in one
statement however many chunks and keys, corrected at finalization to the sum over
the output lines, and read by the usage report, the metrics and the admin."""

from __future__ import annotations

import csv
import io
import json
from datetime import date

import orjson
import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from batches import chunks, quotas, services
from batches.models import Batch, BatchStatus, Chunk, ChunkStatus
from batches.usage import Usage
from core.auth import apikey_create
from core.models import ApiKey, KeyUsage
from files import storage
from files.incremental import append_lines
from inference.output import format_line
from serving.engines.base import EngineResult
from tests.conftest import chat_line, jsonl

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def keyed_batch(api, upload, settings, published):
    """A validated batch of `requests` chat lines owned by a new key `name`."""

    def _make(name: str, requests: int, *, chunk_size: int = 2, key: ApiKey | None = None):
        if key is None:  # a new key; a given one is already the client's
            key, raw = apikey_create(name=name)
            api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        settings.BATCHGEN_CHUNK_SIZE = chunk_size
        file = upload(jsonl([chat_line(f"{name}-{i}", f"question {i}") for i in range(requests)]))
        batch = services.batch_create(input_file_id=file["id"], endpoint="/v1/chat/completions",
                                      model="sim", owner=key)
        batch = services.batch_validate(batch_id=batch.id)
        assert batch.status == BatchStatus.IN_PROGRESS, batch.error
        return key, batch

    return _make


def claim_all(batch: Batch, worker: str) -> list[int]:
    Chunk.objects.filter(batch=batch).update(status=ChunkStatus.QUEUED)
    ids = list(Chunk.objects.filter(batch=batch).order_by("id").values_list("id", flat=True))
    for chunk_id in ids:
        assert chunks.chunk_claim(chunk_id=chunk_id, worker=worker)
    return ids


def output_usage(batch: Batch) -> tuple[int, int, int]:
    """(requests, input tokens, output tokens) as the user adds them up from the output."""
    requests = prompt = completion = 0
    for raw in storage.absolute(storage.incremental_name(batch.id)).read_bytes().splitlines():
        requests += 1
        response = orjson.loads(raw)["response"]
        if response is not None:
            prompt += response["body"]["usage"]["prompt_tokens"]
            completion += response["body"]["usage"].get("completion_tokens", 0)
    return requests, prompt, completion


def today_row(key: ApiKey) -> KeyUsage:
    return KeyUsage.objects.get(key=key, day=quotas.utc_today())


def test_a_flush_adds_requests_and_tokens_to_each_keys_row_for_today(keyed_batch):
    key_a, a = keyed_batch("team-a", 4)
    key_b, b = keyed_batch("team-b", 2)
    ids = claim_all(a, "w1") + claim_all(b, "w1")

    chunks.chunks_flush(
        worker="w1", progress={ids[0]: (2, 0), ids[1]: (1, 1), ids[2]: (2, 0)}, holding=ids,
        usage={ids[0]: Usage(input_tokens=10, cached_tokens=3, output_tokens=5),
               ids[1]: Usage(input_tokens=7, output_tokens=1),
               ids[2]: Usage(input_tokens=100, output_tokens=50)})
    chunks.chunks_flush(worker="w1", progress={ids[2]: (0, 0)}, holding=ids,
                        usage={ids[2]: Usage(output_tokens=1)})

    row_a, row_b = today_row(key_a), today_row(key_b)
    assert (row_a.requests_completed, row_a.requests_failed) == (3, 1)
    assert (row_a.input_tokens, row_a.cached_tokens, row_a.output_tokens) == (17, 3, 6)
    assert (row_b.requests, row_b.input_tokens, row_b.output_tokens) == (2, 100, 51)
    assert KeyUsage.objects.count() == 2


def test_a_flush_costs_the_same_statements_for_one_keyed_chunk_or_twenty(keyed_batch):
    def statements(batch: Batch, worker: str) -> int:
        ids = claim_all(batch, worker)
        with CaptureQueriesContext(connection) as queries:
            chunks.chunks_flush(worker=worker, progress={i: (1, 0) for i in ids}, holding=ids,
                                usage={i: Usage(input_tokens=5, output_tokens=2) for i in ids})
        return len(queries)

    key, one = keyed_batch("team-a", 2)
    _, many = keyed_batch("team-a", 40, key=key)
    assert statements(one, "w-one") == statements(many, "w-many")
    assert today_row(key).requests_completed == 21
    assert today_row(key).input_tokens == 21 * 5


def test_a_flush_of_two_keys_batches_costs_one_more_statement_than_none(keyed_batch,
                                                                       running_batch):
    # The per-key rows are one upsert for all key-days, not one per key.
    def statements(batches: list[Batch], worker: str) -> int:
        ids = [i for batch in batches for i in claim_all(batch, worker)]
        with CaptureQueriesContext(connection) as queries:
            chunks.chunks_flush(worker=worker, progress={i: (1, 0) for i in ids}, holding=ids)
        return len(queries)

    keyed = [keyed_batch("team-a", 2)[1], keyed_batch("team-b", 2)[1]]
    unkeyed = running_batch(2, chunk_size=2)
    assert statements(keyed, "w-keys") == statements([unkeyed], "w-open") + 1


def test_key_usage_equals_the_output_lines_after_a_dead_worker_wrote_unflushed_results(
        keyed_batch, runtime_factory):
    runtime = runtime_factory()
    key, batch = keyed_batch("team-a", 3, chunk_size=3)
    chunk = Chunk.objects.get(batch=batch)
    Chunk.objects.filter(id=chunk.id).update(status=ChunkStatus.RUNNING, attempts=1,
                                             worker="dead-worker",
                                             lease_expires_at="2000-01-01T00:00:00Z")
    earlier = {"usage": {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}}
    append_lines(storage.absolute(storage.incremental_name(batch.id)),
                 [format_line(f"{key.name}-0", EngineResult(body=earlier))])

    runtime.run_chunk(chunk.id)
    before = today_row(key).input_tokens
    services.batch_finalize(batch_id=batch.id)

    requests, prompt, completion = output_usage(batch)
    row = today_row(key)
    assert (row.requests, row.input_tokens, row.output_tokens) == (requests, prompt, completion)
    assert row.input_tokens == before + 1000
    services.batch_finalize(batch_id=batch.id)  # again: corrected once only
    assert today_row(key).input_tokens == prompt


def test_usage_of_a_full_run_is_the_sum_of_the_output_lines(keyed_batch, runtime_factory):
    runtime = runtime_factory()
    key, batch = keyed_batch("team-a", 7, chunk_size=3)
    for chunk_id in Chunk.objects.filter(batch=batch).values_list("id", flat=True):
        runtime.run_chunk(chunk_id)
    services.batch_finalize(batch_id=batch.id)

    requests, prompt, completion = output_usage(batch)
    row = today_row(key)
    assert (row.requests, row.input_tokens, row.output_tokens) == (7, prompt, completion)
    assert prompt > 0 and completion > 0


def test_an_unkeyed_batch_writes_no_key_usage(running_batch):
    batch = running_batch(2, chunk_size=2)
    ids = claim_all(batch, "w1")
    chunks.chunks_flush(worker="w1", progress={ids[0]: (2, 0)}, holding=ids,
                        usage={ids[0]: Usage(input_tokens=4)})
    assert not KeyUsage.objects.exists()


# --- reading it back -----------------------------------------------------------------------


@pytest.fixture
def two_keys_usage():
    a, _ = apikey_create(name="team-a")
    b, _ = apikey_create(name="team-b")
    quotas.key_usage_add({
        (a.pk, date(2026, 11, 30)): quotas.KeyDayUsage(
            requests_completed=3, requests_failed=1,
            tokens=Usage(input_tokens=30, cached_tokens=8, output_tokens=12)),
        (a.pk, date(2026, 12, 1)): quotas.KeyDayUsage(
            requests_completed=2, tokens=Usage(input_tokens=20, output_tokens=10)),
        (b.pk, date(2026, 12, 1)): quotas.KeyDayUsage(
            requests_completed=5, tokens=Usage(input_tokens=50, output_tokens=25)),
    })
    return a, b


def report(*args: str) -> str:
    out = io.StringIO()
    call_command("usage_report", *args, stdout=out)
    return out.getvalue()


def test_usage_report_json_per_day_and_key_within_the_dates(two_keys_usage):
    rows = json.loads(report("--since", "2026-12-01", "--format", "json"))

    assert rows == [
        {"day": "2026-12-01", "key": "team-a", "requests": 2, "requests_completed": 2,
         "requests_failed": 0, "input_tokens": 20, "cached_tokens": 0, "output_tokens": 10,
         "total_tokens": 30},
        {"day": "2026-12-01", "key": "team-b", "requests": 5, "requests_completed": 5,
         "requests_failed": 0, "input_tokens": 50, "cached_tokens": 0, "output_tokens": 25,
         "total_tokens": 75},
    ]


def test_usage_report_csv_for_one_key_and_a_date_range(two_keys_usage):
    rows = list(csv.DictReader(io.StringIO(report(
        "--since", "2026-11-01", "--until", "2026-11-30", "--key", "team-a",
        "--format", "csv"))))

    assert [(r["day"], r["key"], r["requests"], r["cached_tokens"], r["total_tokens"])
            for r in rows] == [("2026-11-30", "team-a", "4", "8", "42")]


def test_usage_report_table_ends_with_the_totals(two_keys_usage):
    lines = report("--since", "2026-11-01").splitlines()

    assert lines[0].split()[:3] == ["day", "key", "requests"]
    assert len(lines) == 1 + 3 + 2  # header, three rows, rule, total
    assert lines[-1].split()[:3] == ["total", "11", "10"]
    assert lines[-1].split()[-1] == str(42 + 30 + 75)


def test_usage_report_refuses_bad_dates(two_keys_usage):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError):
        report("--since", "2026-12-02", "--until", "2026-12-01")
    with pytest.raises(CommandError):
        report("--since", "yesterday")


def test_metrics_show_each_keys_usage_by_name_never_its_secret(two_keys_usage, client):
    a, b = two_keys_usage
    ApiKey.objects.filter(pk=a.pk).update(max_intake_requests=100, tokens_per_day=5000)

    body = client.get("/metrics").content.decode()

    assert 'batchgen_key_requests_total{key="team-a",outcome="completed"} 5.0' in body
    assert 'batchgen_key_requests_total{key="team-a",outcome="failed"} 1.0' in body
    assert 'batchgen_key_input_tokens_total{key="team-a"} 50.0' in body
    assert 'batchgen_key_output_tokens_total{key="team-b"} 25.0' in body
    assert 'batchgen_key_cached_tokens_total{key="team-a"} 8.0' in body
    assert 'batchgen_key_max_intake_requests{key="team-a"} 100.0' in body
    assert 'batchgen_key_tokens_per_day{key="team-a"} 5000.0' in body
    assert 'batchgen_key_tokens_per_day{key="team-b"}' not in body  # no limit: absent
    assert 'batchgen_key_intake_held{key="team-b"} 0.0' in body
    for key in (a, b):
        assert key.prefix not in body and key.hashed_key not in body
