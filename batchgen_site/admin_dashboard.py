"""The pool dashboard at /admin/pool/: the IntakePool and SchedulingPool figures of
/v1/pool/status, the live inference workers and the active batches. The page
reloads itself every few seconds; staff only."""

from __future__ import annotations

from django.contrib import admin
from django.template.response import TemplateResponse
from django.utils import timezone

from batches.admin import batch_progress, progress_bar, status_badge, throughput_label
from batches.admin import duration_label as eta_label
from batches.models import ACTIVE_STATUSES, Batch
from batches.selectors import pool_status
from fleet.selectors import live_workers

REFRESH_SECONDS = 5
ACTIVE_BATCHES_SHOWN = 50


def _percent(part: int, whole: int) -> float:
    return round(100 * part / whole, 1) if whole else 0.0


def pool_dashboard(request):
    pool = pool_status()
    now = timezone.now()
    active = list(Batch.objects.filter(status__in=ACTIVE_STATUSES).order_by("created_at")
                  [:ACTIVE_BATCHES_SHOWN])
    batches = []
    for batch in active:
        progress = batch_progress(batch, now=now)
        batches.append({"batch": batch, "status": status_badge(batch.id, batch.status),
                        "bar": progress_bar(progress),
                        "throughput": throughput_label(progress.throughput),
                        "eta": eta_label(progress.eta_seconds)})
    workers = list(live_workers().order_by("hostname", "name"))
    context = {
        **admin.site.each_context(request),
        "title": "Pool dashboard",
        "pool": pool,
        "intake_pct": _percent(pool["intake_pool_size"], pool["intake_pool_capacity"]),
        "scheduling_pct": _percent(pool["scheduling_pool_active"],
                                   pool["scheduling_pool_capacity"]),
        "tokens_pct": _percent(pool.get("scheduling_pool_tokens_active") or 0,
                               pool.get("scheduling_pool_token_budget") or 0),
        "workers": workers,
        "batches": batches,
        "more_batches": max(pool["active_batches"] - len(batches), 0),
        "refresh_seconds": REFRESH_SECONDS,
        "updated_at": now,
    }
    return TemplateResponse(request, "admin/pool_dashboard.html", context)
