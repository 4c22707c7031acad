"""The webhook endpoints API's shapes: OpenAI's (`client.webhooks.*` of the openai
SDK), with BatchGen's `enabled` and `disabled_reason` beside them."""

from __future__ import annotations

from rest_framework import serializers

from core.pagination import list_envelope_serializer
from files.serializers import UnixTimestampField
from webhooks.models import EVENT_TYPES, WebhookEndpoint


class EndpointCreateInputSerializer(serializers.Serializer):
    url = serializers.URLField(max_length=2000)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    event_types = serializers.ListField(child=serializers.ChoiceField(choices=EVENT_TYPES),
                                        allow_empty=False, required=False,
                                        help_text="Default: every batch event.")


class EndpointUpdateInputSerializer(serializers.Serializer):
    url = serializers.URLField(max_length=2000, required=False)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    event_types = serializers.ListField(child=serializers.ChoiceField(choices=EVENT_TYPES),
                                        allow_empty=False, required=False)
    enabled = serializers.BooleanField(required=False)


class EndpointListInputSerializer(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=100, default=20)
    after = serializers.CharField(required=False, max_length=64)


class RotateSecretInputSerializer(serializers.Serializer):
    keep_old_secret_active_for_24_hours = serializers.BooleanField(default=False)


class EndpointTestInputSerializer(serializers.Serializer):
    event_type = serializers.ChoiceField(choices=EVENT_TYPES)


class EndpointOutputSerializer(serializers.ModelSerializer):
    object = serializers.SerializerMethodField()
    created_at = UnixTimestampField()
    updated_at = UnixTimestampField()
    signing_secret_hint = serializers.CharField(source="secret_hint")

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "object", "name", "url", "event_types", "created_at", "updated_at",
                  "signing_secret_hint", "enabled", "disabled_reason"]

    def get_object(self, obj) -> str:
        return "webhook_endpoint"


class EndpointWithSecretOutputSerializer(EndpointOutputSerializer):
    """Answered at create and rotate only: the one time the secret is shown."""

    signing_secret = serializers.CharField(source="secret")

    class Meta(EndpointOutputSerializer.Meta):
        fields = [*EndpointOutputSerializer.Meta.fields, "signing_secret"]


EndpointListSerializer = list_envelope_serializer("WebhookEndpointList",
                                                  EndpointOutputSerializer)


class EndpointDeletedSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField(default="webhook_endpoint.deleted")
    deleted = serializers.BooleanField()


class EndpointTestResultSerializer(serializers.Serializer):
    object = serializers.CharField(default="webhook_endpoint.test")
    webhook_endpoint_id = serializers.CharField()
    event_type = serializers.CharField()
    status_code = serializers.IntegerField()
    success = serializers.BooleanField()


class EventTypeListSerializer(serializers.Serializer):
    object = serializers.CharField(default="list")
    data = serializers.ListField(child=serializers.CharField())
