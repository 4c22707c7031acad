"""The Batches admin: browse, follow and cancel batches, look at their chunks.

Read-only by design: status, counts, offsets and leases move only through the
services (a hand-saved row would overwrite what workers account meanwhile). The one
action, cancel, calls `batches.services.batch_cancel`, the API's own service.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpRequest, HttpResponseNotAllowed, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from batches.files_admin import file_download_url  # and registers the Files admin
from batches.models import ACTIVE_STATUSES, Batch, BatchStatus, Chunk
from batches.selectors import output_stream
from batches.services import batch_cancel
from core.errors import BatchGenError
from files import backends, storage
from files.backends import StorageUnavailable
from files.segments import read_from, stream_end

TAIL_LINES = 20
TAIL_BYTES = 64 * 1024  # never read more of an incremental file than this
TAIL_LINE_CHARS = 2_000
ERRORS_SHOWN = 200
PROGRESS_IDS_MAX = 200  # batches one progress poll may ask about
CANCELLABLE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)


# --- progress figures (shared with the pool dashboard) ---------------------------------


@dataclass(frozen=True)
class Progress:
    batch_id: str
    status: str
    total: int
    completed: int
    failed: int
    throughput: float | None  # requests per second since the batch started
    eta_seconds: float | None

    @property
    def done(self) -> int:
        return self.completed + self.failed

    def percent(self, part: int) -> float:
        return round(100 * part / self.total, 2) if self.total else 0.0

    def as_json(self) -> dict:
        return {
            "id": self.batch_id, "status": self.status, "total": self.total,
            "completed": self.completed, "failed": self.failed, "done": self.done,
            "completed_pct": self.percent(self.completed),
            "failed_pct": self.percent(self.failed),
            "display": {"status": self.status, "counts": counts_label(self),
                        "throughput": throughput_label(self.throughput),
                        "eta": duration_label(self.eta_seconds)},
        }


def batch_progress(batch: Batch, *, now: datetime | None = None) -> Progress:
    """Throughput is measured from `in_progress_at` to now (or to the batch's end);
    the ETA is the batch's estimated_completion_at (the scheduler's model), from now."""
    now = now or timezone.now()
    end = batch.completed_at or batch.cancelled_at or batch.failed_at or now
    done = batch.completed + batch.failed
    throughput = None
    if batch.in_progress_at and done:
        elapsed = (end - batch.in_progress_at).total_seconds()
        throughput = done / elapsed if elapsed > 0 else None
    # The ETA model's answer (batches/estimates.py), not remaining / own rate: a
    # batch's own rate says nothing of the work ahead of it or of its share to come.
    eta = None
    if batch.status in ACTIVE_STATUSES and batch.estimated_completion_at is not None:
        eta = max((batch.estimated_completion_at - now).total_seconds(), 0.0)
    return Progress(batch_id=batch.id, status=batch.status, total=batch.total,
                    completed=batch.completed, failed=batch.failed, throughput=throughput,
                    eta_seconds=eta)


def counts_label(progress: Progress) -> str:
    return f"{progress.completed} ✓ {progress.failed} ✗ / {progress.total}"


def throughput_label(throughput: float | None) -> str:
    return "–" if throughput is None else f"{throughput:.1f} req/s"


def duration_label(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {seconds:02d}s" if minutes else f"{seconds}s"


def progress_bar(progress: Progress) -> str:
    """A two-segment bar (completed, failed) the admin's script keeps current."""
    return format_html(
        '<div class="bg-progress" role="progressbar" aria-valuemin="0" aria-valuemax="{}" '
        'aria-valuenow="{}" data-batch="{}" data-field="progress" title="{}">'
        '<span class="bg-progress-completed" style="width: {}%"></span>'
        '<span class="bg-progress-failed" style="width: {}%"></span></div>'
        '<span class="bg-progress-label" data-batch="{}" data-field="counts">{}</span>',
        progress.total, progress.done, progress.batch_id, counts_label(progress),
        progress.percent(progress.completed), progress.percent(progress.failed),
        progress.batch_id, counts_label(progress),
    )


def status_badge(batch_id: str, status: str) -> str:
    return format_html('<span class="bg-status bg-status-{}" data-batch="{}" data-field="status" '
                       'data-status="{}">{}</span>', status, batch_id, status, status)


def live_value(batch_id: str, field: str, text: str) -> str:
    return format_html('<span data-batch="{}" data-field="{}">{}</span>', batch_id, field, text)


def file_links(file_id: str | None) -> str:
    if not file_id:
        return "–"
    return format_html(
        '<a href="{}">{}</a> · <a href="{}" class="bg-download">download</a>',
        reverse("admin:files_file_change", args=[quote(file_id)]), file_id,
        file_download_url(file_id))


def incremental_tail(batch_id: str, *, lines: int = TAIL_LINES,
                     max_bytes: int = TAIL_BYTES) -> list[str]:
    """The last whole lines of a batch's incremental output, reading at most
    `max_bytes` from its end however large it is: the file on a path; on a bucket the
    counted segments while the batch runs, the composed object once it is final."""
    try:
        data, start = _incremental_end(batch_id, max_bytes)
    except (Batch.DoesNotExist, FileNotFoundError, StorageUnavailable):
        return []
    if not data.endswith(b"\n"):
        data = data[:data.rfind(b"\n") + 1]  # a line still being written (or torn)
    parts = data.split(b"\n")[:-1]
    if start > 0:
        parts = parts[1:]  # the first one is cut by the window
    return [p.decode("utf-8", errors="replace")[:TAIL_LINE_CHARS] for p in parts[-lines:]]


def _incremental_end(batch_id: str, max_bytes: int) -> tuple[bytes, int]:
    """The last `max_bytes` of the incremental output, and where they start in it."""
    store = backends.current()
    if isinstance(store, backends.S3Storage):
        counted = output_stream(batch=Batch.objects.get(id=batch_id))
        start = max(0, stream_end(counted) - max_bytes)
        return b"".join(read_from(store, counted, start)), start
    with storage.absolute(storage.incremental_name(batch_id)).open("rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        start = max(0, size - max_bytes)
        fh.seek(start)
        return fh.read(size - start), start


# --- the admin ----------------------------------------------------------------------

admin.site.site_header = "BatchGen"
admin.site.site_title = "BatchGen admin"
admin.site.index_title = "Batches, files and workers"
admin.site.site_url = None  # the server has no public home page to "view"
admin.site.enable_nav_sidebar = False  # the header's navigation bar leaves room for tables


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows that only services may write: viewable, never added or hand-edited."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Batch)
class BatchAdmin(ReadOnlyAdmin):
    list_display = ["id", "status_display", "endpoint_display", "created_at", "progress_display",
                    "throughput_display", "eta_display", "owner"]
    list_filter = ["status", ("created_at", admin.DateFieldListFilter), "endpoint",
                   ("owner", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["owner"]
    search_fields = ["id", "input_file__id", "metadata"]
    date_hierarchy = "created_at"
    actions = ["cancel_selected"]
    list_per_page = 50
    show_full_result_count = False  # a COUNT(*) over every batch on each page is waste
    fieldsets = [
        (None, {"fields": ["id", "status_display", "endpoint_display", "model", "progress_display",
                           "throughput_display", "eta_display", "completion_window",
                           "metadata_display", "owner", "priority"]}),
        ("Files", {"fields": ["input_file_display", "output_file_display",
                              "error_file_display", "output_expires_after_seconds"]}),
        ("Parameters", {"fields": ["max_decoding_length", "max_context_length", "temperature",
                                   "top_p", "top_k"]}),
        ("Timestamps", {"fields": ["created_at", "validation_started_at", "in_progress_at",
                                   "finalizing_at", "completed_at", "failed_at",
                                   "cancelling_at", "cancelled_at", "expires_at"]}),
        ("Usage", {"fields": ["usage_input_tokens", "usage_cached_tokens",
                              "usage_output_tokens", "usage_reasoning_tokens"]}),
        ("Errors", {"fields": ["error_display", "errors_display"]}),
        ("Chunks and capacity", {"fields": ["chunks_display", "intake_reserved"]}),
        ("Incremental output", {"fields": ["incremental_tail_display"]}),
    ]

    def get_readonly_fields(self, request, obj=None):
        return [field for _, options in self.fieldsets for field in options["fields"]]

    def get_urls(self):
        # Before the defaults: their "<path:object_id>/" would swallow these.
        return [
            path("progress/", self.admin_site.admin_view(self.progress_view),
                 name="batches_batch_progress"),
            path("<path:object_id>/cancel/", self.admin_site.admin_view(self.cancel_view),
                 name="batches_batch_cancel"),
            *super().get_urls(),
        ]

    # --- permissions: cancelling is what "change" means for a batch ---------------------

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("batches.change_batch")

    # --- columns and fields ---------------------------------------------------------------

    @admin.display(description="status", ordering="status")
    def status_display(self, obj: Batch) -> str:
        return status_badge(obj.id, obj.status)

    @admin.display(description="endpoint", ordering="endpoint")
    def endpoint_display(self, obj: Batch) -> str:
        return obj.endpoint  # the path, not the choice's label

    @admin.display(description="progress")
    def progress_display(self, obj: Batch) -> str:
        return progress_bar(batch_progress(obj))

    @admin.display(description="throughput")
    def throughput_display(self, obj: Batch) -> str:
        return live_value(obj.id, "throughput", throughput_label(batch_progress(obj).throughput))

    @admin.display(description="ETA")
    def eta_display(self, obj: Batch) -> str:
        label = duration_label(batch_progress(obj).eta_seconds)
        if obj.at_risk and obj.status == "in_progress":
            label += " ⚠ window at risk"
        return live_value(obj.id, "eta", label)

    @admin.display(description="metadata")
    def metadata_display(self, obj: Batch) -> str:
        if not obj.metadata:
            return "–"
        return format_html("<dl class='bg-metadata'>{}</dl>", format_html_join(
            "", "<dt>{}</dt><dd>{}</dd>", sorted(obj.metadata.items())))

    @admin.display(description="input file")
    def input_file_display(self, obj: Batch) -> str:
        return file_links(obj.input_file_id)

    @admin.display(description="output file")
    def output_file_display(self, obj: Batch) -> str:
        return file_links(obj.output_file_id)

    @admin.display(description="error file")
    def error_file_display(self, obj: Batch) -> str:
        return file_links(obj.error_file_id)

    @admin.display(description="error")
    def error_display(self, obj: Batch) -> str:
        if not obj.error:
            return "–"
        return format_html("<code>{}</code>: {}", obj.error.get("code"), obj.error.get("message"))

    @admin.display(description="line errors")
    def errors_display(self, obj: Batch) -> str:
        if not obj.errors:
            return "–"
        rows = format_html_join(
            "", "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            ((e.get("line", ""), e.get("code", ""), e.get("param") or "", e.get("message", ""))
             for e in obj.errors[:ERRORS_SHOWN]))
        more = max(obj.line_errors_total, len(obj.errors)) - min(len(obj.errors), ERRORS_SHOWN)
        return format_html(
            "<table class='bg-errors'><thead><tr><th>line</th><th>code</th><th>param</th>"
            "<th>message</th></tr></thead><tbody>{}</tbody></table>{}", rows,
            format_html("<p>… and {} more</p>", more) if more > 0 else "")

    @admin.display(description="chunks")
    def chunks_display(self, obj: Batch) -> str:
        by_status = dict(Chunk.objects.filter(batch_id=obj.id).values_list("status")
                         .annotate(n=Count("id")).values_list("status", "n"))
        if not by_status:
            return "–"
        url = reverse("admin:batches_chunk_changelist") + "?" + urlencode(
            {"batch__id__exact": obj.id})
        return format_html("{} · <a href='{}'>view chunks</a>", ", ".join(
            f"{n} {status}" for status, n in sorted(by_status.items())), url)

    @admin.display(description="last lines of the incremental file")
    def incremental_tail_display(self, obj: Batch) -> str:
        lines = incremental_tail(obj.id)
        if not lines:
            return "–"
        return format_html("<pre class='bg-tail'>{}</pre>", "\n".join(lines))

    # --- cancel: the action, the button, and the progress feed ----------------------------

    @admin.action(description="Cancel selected batches", permissions=["cancel"])
    def cancel_selected(self, request, queryset) -> None:
        cancelled, refused = [], []
        for batch_id in queryset.values_list("id", flat=True):
            try:
                cancelled.append(batch_cancel(batch_id=batch_id))
            except BatchGenError as exc:
                refused.append(exc.message)
        if cancelled:
            self.message_user(request, f"Cancelled {len(cancelled)} batch(es): " + ", ".join(
                f"{b.id} ({b.status})" for b in cancelled[:10]), messages.SUCCESS)
        for message in refused[:10]:
            self.message_user(request, message, messages.WARNING)
        if len(refused) > 10:
            self.message_user(request, f"… and {len(refused) - 10} more not cancelled",
                              messages.WARNING)

    def cancel_view(self, request, object_id: str):
        """The detail page's cancel button: POST only, then back to the page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        batch = get_object_or_404(Batch, id=unquote(object_id))
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        try:
            batch = batch_cancel(batch_id=batch.id)
        except BatchGenError as exc:
            self.message_user(request, exc.message, messages.ERROR)
        else:
            self.message_user(request, f"Batch {batch.id} is {batch.status}.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:batches_batch_change",
                                            args=[quote(batch.id)]))

    def progress_view(self, request):
        """Figures for the batches a page shows, polled by its script every few
        seconds while any of them is active."""
        ids = request.GET.getlist("id")[:PROGRESS_IDS_MAX]
        now = timezone.now()
        batches = Batch.objects.filter(id__in=ids)
        return JsonResponse({"batches": [batch_progress(b, now=now).as_json() for b in batches]})

    def render_change_form(self, request, context, *args, obj=None, **kwargs):
        context["can_cancel"] = bool(obj and obj.status in CANCELLABLE
                                     and self.has_cancel_permission(request))
        return super().render_change_form(request, context, *args, obj=obj, **kwargs)


@admin.register(Chunk)
class ChunkAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "batch_link", "index", "status", "count", "completed", "failed",
                    "attempts", "worker", "lease_expires_at", "published_at", "finished_at"]
    list_filter = ["status"]
    search_fields = ["=batch__id", "worker"]
    list_per_page = 100
    show_full_result_count = False
    readonly_fields = ["batch_link", "index", "status", "start_offset", "end_offset",
                       "first_line", "count", "completed", "failed", "attempts", "worker",
                       "lease_expires_at", "published_at", "claimed_at", "finished_at"]
    fields = readonly_fields

    @admin.display(description="batch", ordering="batch_id")
    def batch_link(self, obj: Chunk) -> str:
        return format_html('<a href="{}">{}</a>',
                           reverse("admin:batches_batch_change", args=[quote(obj.batch_id)]),
                           obj.batch_id)

