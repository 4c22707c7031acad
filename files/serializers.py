from __future__ import annotations

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.pagination import list_envelope_serializer
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


class ExpiresAfterSerializer(serializers.Serializer):
    """OpenAI's expiration policy: `anchor` ("created_at", the only one) and
    `seconds`, within the server's bounds (BATCHGEN_MIN/MAX_FILE_EXPIRY_SECONDS, read
    per request). Validates to the number of seconds."""

    anchor = serializers.ChoiceField(choices=["created_at"])
    seconds = serializers.IntegerField()

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - {"anchor", "seconds"})
            if unknown:
                raise serializers.ValidationError(
                    f"unknown field {unknown[0]!r}; an expiration policy has `anchor` "
                    "and `seconds`.", code="invalid_expires_after")
        return super().to_internal_value(data)

    def validate_seconds(self, value: int) -> int:
        low = settings.BATCHGEN_MIN_FILE_EXPIRY_SECONDS
        high = settings.BATCHGEN_MAX_FILE_EXPIRY_SECONDS
        if not low <= value <= high:
            raise serializers.ValidationError(
                f"must be between {low} and {high} seconds (this server's bounds); "
                f"got {value}.", code="invalid_expires_after")
        return value

    def validate(self, attrs):
        return attrs["seconds"]


def multipart_nested(data, name: str) -> dict | None:
    """`name[key]` fields of a multipart form, as the openai SDK sends a nested object
    (`expires_after[anchor]=created_at`), gathered into one dict; None if none."""
    prefix = f"{name}["
    nested = {key[len(prefix):-1]: data.get(key) for key in data
              if key.startswith(prefix) and key.endswith("]")}
    return nested or None


class FileUploadInputSerializer(serializers.Serializer):
    file = serializers.FileField(allow_empty_file=True)
    purpose = serializers.ChoiceField(choices=[FilePurpose.BATCH.value])
    expires_after = ExpiresAfterSerializer(
        required=False, allow_null=True,
        help_text="Sent as multipart fields `expires_after[anchor]` (created_at) and "
                  "`expires_after[seconds]`; the file expires that long after its upload.")

    def to_internal_value(self, data):
        nested = multipart_nested(data, "expires_after")
        if nested is not None or "expires_after" in data:
            # A plain dict: DRF reads nested objects of a form only as `a.b` fields,
            # and would skip a lone `expires_after=3600` instead of refusing it.
            data = {**{key: data.get(key) for key in ("file", "purpose") if key in data},
                    "expires_after": nested if nested is not None else data.get("expires_after")}
        return super().to_internal_value(data)


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
