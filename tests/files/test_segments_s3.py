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


def test_composition_shows_every_byte_in_order_unless_a_part_was_copied(store):
    """The output's checksum and usage come from the bytes as they are composed
    (batches.services._compose_segments): all of them, in the stream's order, when
    every segment was read; a copied part's bytes never pass (then the output is read
    back)."""
    small = []
    for seq in range(40):
        name = segments.segment_name("batch_o", seq, 1, 0)
        store.put_bytes(name, lines(f"o{seq}", 50 + seq))
        small.append(Segment(name, len(lines(f"o{seq}", 50 + seq))))
    seen: list[bytes] = []

    composed = segments.compose(store, small, "incremental/batch_o.jsonl", observe=seen.append)

    with store.open("incremental/batch_o.jsonl") as stream:
        assert b"".join(seen) == stream.read() == b"".join(segments.read_from(store, small, 0))
    assert composed.copied_parts == 0

    big = lines("big", 6 * 1024 * 1024 // 100 + 1, width=68)
    store.put_bytes("incremental/batch_o/big.jsonl", big)
    seen.clear()
    composed = segments.compose(store, [Segment("incremental/batch_o/big.jsonl", len(big)),
                                        *small], "incremental/batch_o2.jsonl",
                                observe=seen.append)
    assert composed.copied_parts == 1
    assert b"".join(seen) == b"".join(segments.read_from(store, small, 0))


def test_a_line_start_is_found_with_a_one_byte_read(store):
    first, second = lines("p", 3), lines("q", 2)
    counted = [Segment(segments.segment_name("batch_l", 0, 1, 0), len(first)),
               Segment(segments.segment_name("batch_l", 1, 1, 0), len(second))]
    store.put_bytes(counted[0].name, first)
    store.put_bytes(counted[1].name, second)
    line = first.index(b"\n") + 1

    starts = [offset for offset in range(len(first) + len(second) + 1)
              if segments.starts_a_line(store, counted, offset)]

    stream = first + second
    assert starts == [0, *(i + 1 for i, byte in enumerate(stream) if byte == ord("\n"))]
    assert line in starts and line + 1 not in starts


def test_many_objects_go_with_one_request_and_a_missing_one_is_no_error(store):
    names = [put(store, segments.segment_name("batch_v", i, 1, 0), b"x\n").name
             for i in range(5)]
    store.delete_many([*names[:4], "incremental/batch_v/never-written.jsonl"])
    assert list(store.names("incremental/batch_v/")) == names[4:]


def test_a_reader_whose_segments_were_composed_and_deleted_reads_on_from_the_composed_object(
        store):
    """Finalization composes the stream and deletes the segments, possibly while a
    reader streams the list it took before: the reader goes on from the composed
    object at the same offset, and sees the stream it listed, whole and once."""
    parts = [lines("a", 4), lines("b", 3), lines("c", 5)]
    counted = [put(store, segments.segment_name("batch_f", i, 1, 0), data)
               for i, data in enumerate(parts)]
    later = put(store, segments.segment_name("batch_f", 3, 1, 0), lines("d", 2))
    stream = b"".join(parts)
    composed = "incremental/batch_f.jsonl"
    second_line = stream.index(b"\n") + 1
    reader = segments.read_from(store, counted, second_line, composed=composed)
    first_block = next(reader)  # the first segment's GET is under way

    segments.compose(store, [*counted, later], composed)
    store.delete_many(list(store.names("incremental/batch_f/")))

    assert first_block + b"".join(reader) == stream[second_line:]
    inside_second = len(parts[0]) + parts[1].index(b"\n") + 1  # every segment is gone now
    assert b"".join(segments.read_from(store, counted, inside_second,
                                       composed=composed)) == stream[inside_second:]
    starts = {0, *(i + 1 for i, byte in enumerate(stream) if byte == ord("\n"))}
    assert all(segments.starts_a_line(store, counted, offset, composed=composed)
               == (offset in starts) for offset in range(len(stream) + 1))
    with pytest.raises(FileNotFoundError):  # without the composed object's name
        b"".join(segments.read_from(store, counted, 0))
