"""Prefix-aware chunking: requests sharing a prompt prefix land in the same chunks."""

from __future__ import annotations

import json
import random

import pytest

from batches.input_file import read_chunk
from batches.validation import validate_file
from serving.endpoints import endpoint_spec
from tests.conftest import jsonl

SYSTEMS = [f"You are assistant number {n}. " + "Follow these rules. " * 40 for n in range(4)]


def grouped_input(path, per_group: int = 6, seed: int = 7) -> list[dict]:
    lines = [{"custom_id": f"g{g}-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m", "messages": [
                  {"role": "system", "content": SYSTEMS[g]},
                  {"role": "user", "content": f"question {i}"}]}}
             for g in range(len(SYSTEMS)) for i in range(per_group)]
    random.Random(seed).shuffle(lines)
    path.write_bytes(jsonl(lines))
    return lines


def validate(path, order_path=None, chunk_size=6):
    return validate_file(path, endpoint="/v1/chat/completions", chunk_size=chunk_size,
                         max_line_bytes=1 << 20, max_requests=10_000, order_path=order_path)


def test_shared_system_prompts_share_a_key_and_different_ones_do_not():
    a1 = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "1"}]}
    a2 = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "2"}]}
    b = {"messages": [{"role": "system", "content": "T"}, {"role": "user", "content": "1"}]}
    chat = endpoint_spec("/v1/chat/completions")
    assert chat.prefix_key(a1) == chat.prefix_key(a2) != chat.prefix_key(b)
    lone = {"messages": [{"role": "user", "content": "S" * 600 + "end"}]}
    shorter = {"messages": [{"role": "user", "content": "S" * 600}]}
    assert chat.prefix_key(lone) == chat.prefix_key(shorter)
    same_start = {"prompt": "x" * 600 + "tail one"}
    other_tail = {"prompt": "x" * 600 + "tail two"}
    completions = endpoint_spec("/v1/completions")
    assert completions.prefix_key(same_start) == completions.prefix_key(other_tail)


def test_grouped_chunks_each_hold_one_prefix(tmp_path):
    path = tmp_path / "in.jsonl"
    lines = grouped_input(path)
    order = tmp_path / "b.order"

    report = validate(path, order_path=order)

    assert report.grouped and report.total == len(lines)
    seen = []
    for chunk in report.chunks:
        requests = read_chunk(path, start=chunk.start_offset, end=chunk.end_offset,
                              max_line_bytes=1 << 20, order_path=order)
        assert len(requests) == chunk.count
        assert len({r["body"]["messages"][0]["content"] for r in requests}) == 1
        seen += [r["custom_id"] for r in requests]
    assert sorted(seen) == sorted(line["custom_id"] for line in lines)


def test_grouping_keeps_input_order_within_a_group(tmp_path):
    path = tmp_path / "in.jsonl"
    lines = grouped_input(path)
    order = tmp_path / "b.order"
    report = validate(path, order_path=order, chunk_size=100)

    requests = read_chunk(path, start=report.chunks[0].start_offset,
                          end=report.chunks[0].end_offset, max_line_bytes=1 << 20,
                          order_path=order)
    for group in {r["custom_id"].split("-")[0] for r in requests}:
        got = [r["custom_id"] for r in requests if r["custom_id"].startswith(group + "-")]
        expected = [line["custom_id"] for line in lines
                    if line["custom_id"].startswith(group + "-")]
        assert got == expected


def test_contiguous_chunks_mix_prefixes_in_input_order(tmp_path):
    path = tmp_path / "in.jsonl"
    lines = grouped_input(path)
    report = validate(path)
    assert not report.grouped
    first = read_chunk(path, start=report.chunks[0].start_offset,
                       end=report.chunks[0].end_offset, max_line_bytes=1 << 20)
    assert [r["custom_id"] for r in first] == [line["custom_id"] for line in lines[:6]]


def test_an_invalid_file_leaves_no_order_file(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(jsonl([{"custom_id": "a"}]) + b"not json\n")
    order = tmp_path / "b.order"
    report = validate(path, order_path=order)
    assert report.invalid and not order.exists() and report.chunks == []


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
def test_grouped_reading_survives_a_bom_and_crlf(tmp_path, bom):
    path = tmp_path / "in.jsonl"
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}
    path.write_bytes(bom + json.dumps(line).encode() + b"\r\n")
    order = tmp_path / "b.order"
    report = validate(path, order_path=order)
    chunk = report.chunks[0]
    assert read_chunk(path, start=chunk.start_offset, end=chunk.end_offset,
                      max_line_bytes=1 << 20, order_path=order) == [line]
