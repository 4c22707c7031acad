"""The incremental output's object-store side (files/segments.py) against a real
SeaweedFS: counted segments read as one ordered byte stream from any offset, an
uncounted segment is never part of it, and the composition equals the stream, with
large segments copied server-side."""

from __future__ import annotations

import pytest

from files import backends, segments
from files.segments import Segment

pytestmark = pytest.mark.django_db


def lines(tag: str, count: int, width: int = 60) -> bytes:
    return b"".join(b'{"custom_id":"%s-%06d","pad":"%s"}\n' % (tag.encode(), i, b"x" * width)
                    for i in range(count))


@pytest.fixture
def store(s3_storage) -> backends.S3Storage:
    store = backends.current()
    assert isinstance(store, backends.S3Storage)
    return store


def put(store, name: str, data: bytes) -> Segment:
    store._call(name, store.client.put_object, Bucket=store.bucket, Key=store.key(name),
                Body=data)
    return Segment(name, len(data))


def test_counted_segments_read_as_one_stream_from_any_line_and_orphans_are_not_in_it(store):
    first = lines("a", 5)
    second = lines("b", 3)
    counted = [put(store, segments.segment_name("batch_x", 0, 1, 0), first),
               put(store, segments.segment_name("batch_x", 1, 1, 0), second)]
    # a re-run of chunk 0 after a lost lease wrote the same lines again, never recorded
    orphan = put(store, segments.segment_name("batch_x", 0, 2, 0), first)

    stream = first + second
    assert segments.stream_end(counted) == len(stream)
    assert b"".join(segments.read_from(store, counted, 0)) == stream
    second_line = first.index(b"\n") + 1
    assert b"".join(segments.read_from(store, counted, second_line)) == stream[second_line:]
    assert b"".join(segments.read_from(store, counted, len(first))) == second
    assert b"".join(segments.read_from(store, counted, len(stream))) == b""
    assert segments.orphans(store, "batch_x", counted) == [orphan.name]


def test_composition_copies_large_segments_server_side_and_equals_the_stream(store):
    big = lines("big", 6 * 1024 * 1024 // 100 + 1, width=68)  # > 5 MiB: a copied part
    assert len(big) >= segments.MIN_PART_BYTES
    parts = [put(store, "incremental/batch_y/000000-0001-000000.jsonl", big),
             put(store, "incremental/batch_y/000001-0001-000000.jsonl", lines("s", 10)),
             put(store, "incremental/batch_y/000002-0001-000000.jsonl", lines("t", 7))]

    composed = segments.compose(store, parts, "incremental/batch_y.jsonl")

    expected = b"".join(segments.read_from(store, parts, 0))
    with store.open("incremental/batch_y.jsonl") as stream:
        assert stream.read() == expected
    assert composed.size == len(expected)
    assert (composed.copied_parts, composed.uploaded_parts) == (1, 1)


def test_composition_of_nothing_is_an_empty_object(store):
    composed = segments.compose(store, [], "incremental/batch_z.jsonl")
    assert composed.size == 0
    with store.open("incremental/batch_z.jsonl") as stream:
        assert stream.read() == b""


def test_composition_of_many_small_segments_read_ahead_keeps_their_order(store):
    """Small segments are read a few at once (files.segments._small_bodies): the
    output still holds them in the ledger's order, with runs of them sent as parts
    of 8 MiB after a large one copied."""
    sizes = [3, 1, 0, 7, 2] * 30 + [42_000] * 3 + [1] * 20  # 3 x 4 MiB-ish, then more
    parts = []
    for seq, count in enumerate(sizes):
        data = lines(f"c{seq}", count, width=40 if count < 1000 else 60)
        parts.append(put(store, segments.segment_name("batch_w", seq, 1, 0), data))
    big = lines("big", 6 * 1024 * 1024 // 100 + 1, width=68)
    parts.insert(0, put(store, "incremental/batch_w/big.jsonl", big))

    composed = segments.compose(store, parts, "incremental/batch_w.jsonl")

    expected = b"".join(segments.read_from(store, parts, 0))
    with store.open("incremental/batch_w.jsonl") as stream:
        assert stream.read() == expected
    assert composed.size == len(expected) > 2 * segments.S3_PART_BYTES
    assert composed.copied_parts == 1  # the big one, nothing buffered before it
    assert composed.uploaded_parts >= 2


def test_many_objects_go_with_one_request_and_a_missing_one_is_no_error(store):
    names = [put(store, segments.segment_name("batch_v", i, 1, 0), b"x\n").name
             for i in range(5)]
    store.delete_many([*names[:4], "incremental/batch_v/never-written.jsonl"])
    assert list(store.names("incremental/batch_v/")) == names[4:]
