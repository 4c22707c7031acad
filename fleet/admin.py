"""Inference workers as their heartbeats describe them. Read-only: each worker
writes its own row every few seconds."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Exists, OuterRef

from fleet.models import Worker
from fleet.selectors import live_workers


class AliveFilter(admin.SimpleListFilter):
    title = "alive"
    parameter_name = "alive"

    def lookups(self, request, model_admin):
        return [("yes", "alive"), ("no", "stopped or silent")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(pk__in=live_workers().values("pk"))
        if self.value() == "no":
            return queryset.exclude(pk__in=live_workers().values("pk"))
        return queryset


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ["name", "hostname", "engine", "model", "alive", "ready", "slots",
                    "tokens", "requests_completed", "requests_failed", "tokens_generated",
                    "storage_error", "batch_limit", "started_at", "heartbeat_at",
                    "stopped_at"]
    list_filter = [AliveFilter, "ready", "engine", "hostname"]
    search_fields = ["name", "hostname"]
    ordering = ["-heartbeat_at"]
    list_per_page = 100

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Worker._meta.fields] + ["alive", "slots", "tokens",
                                                         "batch_limit"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_queryset(self, request):
        # Liveness is the selector's rule (what /health and the pool figures use).
        return super().get_queryset(request).annotate(
            is_alive=Exists(live_workers().filter(pk=OuterRef("pk"))))

    @admin.display(boolean=True, description="alive", ordering="is_alive")
    def alive(self, obj: Worker) -> bool:
        return obj.is_alive

    @admin.display(description="slots (active / capacity)")
    def slots(self, obj: Worker) -> str:
        return f"{obj.slots_active} / {obj.slots_capacity}"

    @admin.display(description="tokens in engine (active / budget)")
    def tokens(self, obj: Worker) -> str:
        budget = "no budget" if obj.token_budget is None else obj.token_budget
        return f"{obj.tokens_active} / {budget}"

    @admin.display(description="batch at server (in flight / limit, mode)")
    def batch_limit(self, obj: Worker) -> str:
        """Adaptive concurrency (inference/adaptive.py), with what it read last."""
        admission = obj.admission
        if not admission:
            return "-"
        signals = admission.get("signals") or {}
        latency = signals.get("inter_token_latency")
        read = (f"; server runs {signals.get('server_running')}, "
                f"{signals.get('server_waiting')} waiting, {signals.get('others')} others"
                if signals.get("server_running") is not None else "")
        return (f"{admission.get('in_flight')} / {admission.get('limit')} "
                f"({admission.get('mode')}{read}"
                f"{f', ITL {latency * 1000:.0f} ms' if latency else ''})")
