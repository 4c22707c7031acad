"""Operators' view of webhooks: endpoints (server-wide or a key's; the secret is
shown once, when the endpoint is added) and the delivery log, with a resend action."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.utils.html import format_html

from core.errors import BatchGenError
from webhooks import services
from webhooks.models import EVENT_TYPES, WebhookDelivery, WebhookEndpoint


class EndpointForm(forms.ModelForm):
    url = forms.URLField(max_length=2000, assume_scheme="https")
    event_types = forms.MultipleChoiceField(choices=[(t, t) for t in EVENT_TYPES],
                                            widget=forms.CheckboxSelectMultiple,
                                            initial=list(EVENT_TYPES))

    class Meta:
        model = WebhookEndpoint
        fields = ["name", "url", "owner", "event_types", "enabled"]

    def clean_url(self) -> str:
        # The services' check, said on the form rather than as an error page.
        url = self.cleaned_data["url"]
        if self.instance.pk is None or url != self.instance.url:
            try:
                services.checked_url(url)
            except BatchGenError as exc:
                raise forms.ValidationError(exc.message, code=exc.code) from None
        return url


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = EndpointForm
    list_display = ["id", "name", "url", "owner_display", "event_types", "enabled", "created_at"]
    list_filter = ["enabled", ("owner", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["owner"]
    search_fields = ["id", "name", "url"]
    readonly_fields = ["id", "secret_hint", "disabled_reason", "created_at", "updated_at"]

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["name", "url", "owner", "event_types", "enabled"]
        return ["id", "name", "url", "owner", "event_types", "enabled", "disabled_reason",
                "secret_hint", "created_at", "updated_at"]

    def get_readonly_fields(self, request, obj=None):
        # An endpoint keeps its owner: a key's receiver must not start hearing others'.
        return [*self.readonly_fields, "owner"] if obj is not None else self.readonly_fields

    @admin.display(description="owner", ordering="owner")
    def owner_display(self, obj: WebhookEndpoint) -> str:
        return str(obj.owner) if obj.owner_id else "server-wide"

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if change:
            updated = services.endpoint_update(
                endpoint_id=obj.id, url=data["url"], name=data["name"],
                event_types=data["event_types"], enabled=data["enabled"])
            obj.__dict__.update(updated.__dict__)
            return
        created = services.endpoint_create(url=data["url"], name=data["name"],
                                           event_types=data["event_types"],
                                           owner=data.get("owner"))
        if not data["enabled"]:
            services.endpoint_update(endpoint_id=created.id, enabled=False)
        obj.__dict__.update(created.__dict__)
        obj._state.adding = False
        messages.warning(request, format_html(
            "The signing secret of {} is <code>{}</code>. Copy it now: it is not shown "
            "again (rotate it with <code>manage.py webhooks rotate {}</code>).",
            created.id, created.secret, created.id))

    def delete_model(self, request, obj):
        services.endpoint_delete(endpoint_id=obj.id)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ["id", "event_type", "batch_id", "endpoint", "status", "attempts",
                    "last_status_code", "next_attempt_at", "delivered_at", "created_at"]
    list_filter = ["status", "event_type", ("endpoint", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["endpoint"]
    search_fields = ["id", "event_id", "batch_id"]
    date_hierarchy = "created_at"
    show_full_result_count = False
    actions = ["resend"]
    fields = ["id", "event_id", "event_type", "batch_id", "endpoint", "status", "attempts",
              "created_at", "last_attempt_at", "next_attempt_at", "give_up_at",
              "delivered_at", "last_status_code", "last_error", "body"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.action(description="Resend the selected deliveries", permissions=["change"])
    def resend(self, request, queryset):
        count = services.deliveries_resend(
            delivery_ids=queryset.values_list("id", flat=True))
        self.message_user(request, f"{count} deliveries will be sent again now.",
                          messages.SUCCESS)

    def has_change_permission(self, request, obj=None) -> bool:
        # The log is read-only; "change" is the right to resend.
        return super().has_change_permission(request, obj) if obj is None else False

