"""The shared output serializers render exactly what a fresh serializer renders."""

from __future__ import annotations

import pytest
from django.utils import timezone

from batches.models import Batch, BatchStatus
from batches.serializers import BatchOutputSerializer
from core.representation import represent, represent_many
from files.models import File
from files.serializers import FileOutputSerializer

pytestmark = pytest.mark.django_db


@pytest.fixture
def objects():
    file = File.objects.create(id="file-1", purpose="batch", filename="in.jsonl", bytes=10,
                               checksum="sha256:00", status="processed",
                               storage_name="uploads/file-1.jsonl")
    output = File.objects.create(id="file-2", purpose="batch_output", filename="out.jsonl",
                                 bytes=20, checksum="sha256:11", status="processed",
                                 storage_name="incremental/b.jsonl",
                                 expires_at=timezone.now())
    now = timezone.now()
    batches = [
        Batch.objects.create(id="batch_a", input_file=file, endpoint="/v1/chat/completions",
                             model="m", expires_at=now, status=BatchStatus.IN_PROGRESS,
                             in_progress_at=now,
                             metadata={"team": "a"}, temperature=0.5, total=3, completed=1),
        Batch.objects.create(id="batch_b", input_file=file, endpoint="/v1/completions",
                             model="m", expires_at=now, status=BatchStatus.FAILED, failed_at=now,
                             error={"code": "invalid_input", "message": "1 bad line"},
                             errors=[{"code": "invalid_json", "message": "x", "line": 1,
                                      "param": None}]),
        Batch.objects.create(id="batch_c", input_file=file, endpoint="/v1/chat/completions",
                             model="m", expires_at=now, status=BatchStatus.COMPLETED,
                             completed_at=now,
                             output_file=output, max_decoding_length=64, top_k=5),
    ]
    return batches, [file, output]


def test_represent_is_the_serializers_data(objects):
    batches, files = objects
    for batch in batches:
        assert represent(BatchOutputSerializer, batch) == BatchOutputSerializer(batch).data
    for file in files:
        assert represent(FileOutputSerializer, file) == FileOutputSerializer(file).data
    assert represent_many(BatchOutputSerializer, batches) == \
        BatchOutputSerializer(batches, many=True).data
