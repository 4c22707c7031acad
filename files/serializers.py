from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from batchgen_site.pagination import list_envelope_serializer
from files.models import File, FilePurpose


@extend_schema_field(OpenApiTypes.INT)
class UnixTimestampField(serializers.Field):
    def to_representation(self, value):
        return int(value.timestamp()) if value is not None else None


class FileOutputSerializer(serializers.ModelSerializer):
    object = serializers.SerializerMethodField()
    created_at = UnixTimestampField()
    expires_at = UnixTimestampField(allow_null=True)

    class Meta:
        model = File
        fields = ["id", "object", "bytes", "created_at", "expires_at", "filename",
                  "purpose", "status", "checksum"]

    def get_object(self, obj) -> str:
        return "file"


class FileUploadInputSerializer(serializers.Serializer):
    file = serializers.FileField(allow_empty_file=True)
    purpose = serializers.ChoiceField(choices=[FilePurpose.BATCH.value])


class FileListInputSerializer(serializers.Serializer):
    purpose = serializers.ChoiceField(choices=FilePurpose.values, required=False)
    limit = serializers.IntegerField(min_value=1, max_value=10_000, default=10_000)
    order = serializers.ChoiceField(choices=["asc", "desc"], default="desc")
    after = serializers.CharField(required=False, max_length=64)


class FileDeletedSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField(default="file")
    deleted = serializers.BooleanField()


FileListSerializer = list_envelope_serializer("FileList", FileOutputSerializer)
