"""Batch-level `usage`: summed by the workers' progress flushes while a batch runs,
exactly the sum over the output lines' usage once it is finalized (also after a
crash left results written but never flushed), in the shape openai.types.Batch reads."""

from __future__ import annotations

import openai
import orjson
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from batches import chunks, services
from batches.models import Batch, Chunk, ChunkStatus
from batches.serializers import BatchOutputSerializer
from batches.usage import Usage, output_digest_and_usage
from files import storage
from files.incremental import append_lines
from inference.output import format_line
from serving.engines.base import EngineResult
from tests.conftest import chat_line, jsonl

pytestmark = pytest.mark.django_db(transaction=True)


def usage_of_lines(batch: Batch) -> dict:
    """The batch usage, as the user would add it up from the output file."""
    total = {"input": 0, "cached": 0, "output": 0, "reasoning": 0}
    path = storage.absolute(storage.incremental_name(batch.id))
    for raw in path.read_bytes().splitlines():
        response = orjson.loads(raw)["response"]
        if response is None:
            continue
        usage = response["body"]["usage"]
        total["input"] += usage["prompt_tokens"]
        total["output"] += usage.get("completion_tokens", 0)
        total["cached"] += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        total["reasoning"] += ((usage.get("completion_tokens_details") or {})
                               .get("reasoning_tokens", 0))
    return {"input_tokens": total["input"],
            "input_tokens_details": {"cached_tokens": total["cached"]},
            "output_tokens": total["output"],
            "output_tokens_details": {"reasoning_tokens": total["reasoning"]},
            "total_tokens": total["input"] + total["output"]}


def shown(batch: Batch) -> dict:
    return BatchOutputSerializer(Batch.objects.get(id=batch.id)).data


def test_usage_grows_with_the_flushes_and_equals_the_output_lines_when_finalized(
        runtime_factory, batch_in_progress):
    runtime = runtime_factory()
    batch = batch_in_progress(7, chunk_size=3)
    assert shown(batch)["usage"]["total_tokens"] == 0
    first, *rest = Chunk.objects.filter(batch=batch).order_by("index")

    runtime.run_chunk(first.id)
    running = shown(batch)["usage"]
    assert running == usage_of_lines(batch)
    assert running["input_tokens"] > 0 and running["output_tokens"] > 0

    for chunk in rest:
        runtime.run_chunk(chunk.id)
    services.batch_finalize(batch_id=batch.id)

    final = shown(batch)
    assert final["status"] == "completed"
    assert final["usage"] == usage_of_lines(batch)
    assert final["usage"]["input_tokens"] > running["input_tokens"]
    parsed = openai.types.Batch.model_validate(final)
    assert parsed.usage.total_tokens == final["usage"]["total_tokens"]
    assert parsed.usage.input_tokens_details.cached_tokens == 0


def test_results_a_dead_worker_wrote_but_never_flushed_are_counted_at_finalization(
        runtime_factory, batch_in_progress):
    # Given: an attempt that wrote a result with its usage and died before flushing it
    runtime = runtime_factory()
    batch = batch_in_progress(3, chunk_size=3)
    chunk = Chunk.objects.get(batch=batch)
    Chunk.objects.filter(id=chunk.id).update(status=ChunkStatus.RUNNING, attempts=1,
                                             worker="dead-worker",
                                             lease_expires_at="2000-01-01T00:00:00Z")
    earlier = {"usage": {"prompt_tokens": 1000, "completion_tokens": 200,
                         "total_tokens": 1200,
                         "prompt_tokens_details": {"cached_tokens": 640},
                         "completion_tokens_details": {"reasoning_tokens": 150}}}
    append_lines(storage.absolute(storage.incremental_name(batch.id)),
                 [format_line("req-0", EngineResult(body=earlier))])

    # When: the chunk is delivered again and the batch finalized
    runtime.run_chunk(chunk.id)
    running = shown(batch)["usage"]
    services.batch_finalize(batch_id=batch.id)

    # Then: the final usage holds the earlier attempt's tokens, once
    final = shown(batch)["usage"]
    assert final == usage_of_lines(batch)
    assert final["input_tokens"] == running["input_tokens"] + 1000
    assert final["input_tokens_details"]["cached_tokens"] == 640
    assert final["output_tokens_details"]["reasoning_tokens"] == 150


def test_a_flush_adds_usage_to_the_batch_but_not_for_a_chunk_it_lost(
        running_batch):
    batch = running_batch(4, chunk_size=2)
    Chunk.objects.filter(batch=batch).update(status=ChunkStatus.QUEUED)
    mine, taken = Chunk.objects.filter(batch=batch).order_by("id").values_list("id", flat=True)
    assert chunks.chunk_claim(chunk_id=mine, worker="w1")
    assert chunks.chunk_claim(chunk_id=taken, worker="w2")

    result = chunks.chunks_flush(
        worker="w1", progress={mine: (1, 0), taken: (1, 0)}, holding=[mine, taken],
        usage={mine: Usage(input_tokens=10, cached_tokens=4, output_tokens=3,
                           reasoning_tokens=2),
               taken: Usage(input_tokens=1000, output_tokens=1000)})

    assert result.lost == {taken}
    assert shown(batch)["usage"] == {
        "input_tokens": 10, "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": 13}


def test_a_flush_with_usage_costs_the_same_statements_for_one_chunk_or_twenty(running_batch):
    def statements(batch: Batch, worker: str) -> int:
        Chunk.objects.filter(batch=batch).update(status=ChunkStatus.QUEUED)
        ids = list(Chunk.objects.filter(batch=batch).values_list("id", flat=True))
        for chunk_id in ids:
            assert chunks.chunk_claim(chunk_id=chunk_id, worker=worker)
        with CaptureQueriesContext(connection) as queries:
            chunks.chunks_flush(worker=worker, progress={i: (1, 0) for i in ids}, holding=ids,
                                usage={i: Usage(input_tokens=5, output_tokens=2) for i in ids})
        return len(queries)

    one, many = running_batch(2, chunk_size=2), running_batch(40, chunk_size=2)
    assert statements(one, "w-one") == statements(many, "w-many")
    assert shown(many)["usage"]["total_tokens"] == 20 * 7


def test_the_output_pass_adds_embeddings_prompt_tokens_and_skips_error_lines(tmp_path):
    path = tmp_path / "out.jsonl"
    embedding = {"object": "list", "data": [], "usage": {"prompt_tokens": 9,
                                                         "total_tokens": 9}}
    chat = {"usage": {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}}
    path.write_bytes(b"".join([format_line("a", EngineResult(body=embedding)),
                               format_line("b", EngineResult.failure("x", "usage gone")),
                               format_line("c", EngineResult(body=chat))]))

    size, digest, usage = output_digest_and_usage(path)

    assert usage == Usage(input_tokens=13, output_tokens=6)
    assert size == path.stat().st_size
    assert digest == storage.sha256_of(path)[1]


def test_an_embeddings_batch_counts_prompt_tokens_only(runtime_factory, upload, settings):
    settings.BATCHGEN_CHUNK_SIZE = 2
    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "m", "input": f"text {i}"}} for i in range(3)]
    file = upload(jsonl(lines))
    batch = services.batch_create(input_file_id=file["id"], endpoint="/v1/embeddings",
                                  model="m")
    batch = services.batch_validate(batch_id=batch.id)
    runtime = runtime_factory()
    for chunk in Chunk.objects.filter(batch=batch):
        runtime.run_chunk(chunk.id)
    services.batch_finalize(batch_id=batch.id)

    usage = shown(batch)["usage"]
    assert usage == usage_of_lines(batch)
    assert usage["input_tokens"] > 0 and usage["output_tokens"] == 0


def test_the_flushes_sum_the_done_requests_output_limits_which_the_api_does_not_show(
        runtime_factory, upload, settings):
    # Given: lines with their own max_tokens, one with none (the batch's
    # max_decoding_length stands for it), in chunks of 2
    settings.BATCHGEN_CHUNK_SIZE = 2
    limits = {"r0": 8, "r1": 30, "r2": None, "r3": 12, "r4": 20}
    lines = [chat_line(custom_id, f"question {custom_id}",
                       **({"max_tokens": limit} if limit else {}))
             for custom_id, limit in limits.items()]
    file = upload(jsonl(lines))
    batch = services.batch_create(input_file_id=file["id"], endpoint="/v1/chat/completions",
                                  model="m", max_decoding_length=40)
    batch = services.batch_validate(batch_id=batch.id)
    assert batch.output_limit_mean == (8 + 30 + 40 + 12 + 20) / 5
    first, *rest = Chunk.objects.filter(batch=batch).order_by("index")
    runtime = runtime_factory()

    # When: the first chunk runs, then the rest
    runtime.run_chunk(first.id)
    after_first = Batch.objects.get(id=batch.id).output_limit_done
    answered = [orjson.loads(raw)["custom_id"] for raw in storage.absolute(
        storage.incremental_name(batch.id)).read_bytes().splitlines()]
    for chunk in rest:
        runtime.run_chunk(chunk.id)

    # Then: each flush added its requests' limits; the API's usage has no such figure
    assert len(answered) == 2
    assert after_first == sum(limits[custom_id] or 40 for custom_id in answered)
    assert Batch.objects.get(id=batch.id).output_limit_done == 8 + 30 + 40 + 12 + 20
    assert "output_limit" not in str(shown(batch)["usage"])
