"""API keys and their daily usage in the admin.

Keys are created by `manage.py createapikey` (the raw key is shown once, there);
here an operator edits a key's name, quotas and fair-share weight, revokes keys,
and reads what each key used per UTC day (KeyUsage, written by the workers'
flushes: read-only here)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import F, OuterRef, Subquery, Sum
from django.db.models.functions import Coalesce

from batches.admin import ReadOnlyAdmin
from core.auth import apikey_revoke
from core.models import ApiKey, KeyUsage


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "state", "max_intake_requests", "intake_held",
                    "tokens_per_day", "tokens_today", "weight", "last_used_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "=prefix"]
    fields = ["name", "prefix", "max_intake_requests", "tokens_per_day", "weight",
              "intake_held", "tokens_today", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "intake_held", "tokens_today", "created_at", "last_used_at",
                       "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False  # only createapikey can show the raw key once

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # revoke instead: batches and files keep naming their key

    @admin.display(description="state")
    def state(self, key: ApiKey) -> str:
        return f"revoked {key.revoked_at:%Y-%m-%d}" if key.revoked_at else "active"

    def get_queryset(self, request):
        # What each key holds and used today, in the list's one query.
        from batches.models import Batch
        from batches.quotas import utc_today

        held = (Batch.objects.filter(owner=OuterRef("pk"), intake_reserved__gt=0).order_by()
                .values("owner").annotate(n=Sum("intake_reserved")).values("n"))
        today = (KeyUsage.objects.filter(key=OuterRef("pk"), day=utc_today())
                 .annotate(n=F("input_tokens") + F("output_tokens")).values("n"))
        return super().get_queryset(request).annotate(
            held=Coalesce(Subquery(held), 0), used_today=Coalesce(Subquery(today), 0))

    @admin.display(description="intake held")
    def intake_held(self, key: ApiKey) -> int:
        return key.held

    @admin.display(description="tokens today (UTC)")
    def tokens_today(self, key: ApiKey) -> int:
        return key.used_today

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request, queryset) -> None:
        revoked = sum(apikey_revoke(prefix=key.prefix) for key in queryset)
        self.message_user(request, f"Revoked {revoked} key(s).", messages.SUCCESS)


@admin.register(KeyUsage)
class KeyUsageAdmin(ReadOnlyAdmin):
    list_display = ["day", "key_name", "requests_completed", "requests_failed",
                    "input_tokens", "cached_tokens", "output_tokens", "total_tokens"]
    list_filter = [("key", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["key"]
    date_hierarchy = "day"
    list_per_page = 100

    @admin.display(description="key", ordering="key__name")
    def key_name(self, row: KeyUsage) -> str:
        return row.key.name

    @admin.display(description="total tokens")
    def total_tokens(self, row: KeyUsage) -> int:
        return row.total_tokens

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, extra_context)
        try:
            shown = response.context_data["cl"].queryset
        except (AttributeError, KeyError):
            return response  # a redirect or an error page
        totals = shown.aggregate(requests=Sum(F("requests_completed") + F("requests_failed")),
                                 tokens=Sum(F("input_tokens") + F("output_tokens")))
        response.context_data["title"] = (
            f"API key usage per UTC day: {totals['requests'] or 0} requests, "
            f"{totals['tokens'] or 0} tokens in the rows shown")
        return response
