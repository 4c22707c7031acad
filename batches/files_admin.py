"""The Files admin: what is stored, who owns it, which batches use it, a download.
It lives with the batches because it shows them (files never imports batches);
batches/admin.py imports it, which registers it.

Files are never added or edited here (uploads stream through the API). Deleting goes
through `files.services.file_delete`, which refuses a file an active batch uses. The
download is the admin's own (staff session): the API's /v1/files/{id}/content wants
an API key once keys exist, which a browser does not send.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Q, Subquery
from django.http import FileResponse, Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.defaultfilters import filesizeformat
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from batches.models import Batch
from batches.selectors import file_in_active_use
from core.errors import Conflict, NotFound
from files.models import File
from files.services import file_delete, file_open

LINKED_BATCHES_SHOWN = 20


def _batches_using(file_id: str):
    return Batch.objects.filter(Q(input_file_id=file_id) | Q(output_file_id=file_id)
                                | Q(error_file_id=file_id)).order_by("-id")


def file_download_url(file_id: str) -> str:
    return reverse("admin:files_file_content", args=[quote(file_id)])


def _batch_link(batch_id: str) -> str:
    return format_html('<a href="{}">{}</a>',
                       reverse("admin:batches_batch_change", args=[quote(batch_id)]), batch_id)


@admin.register(File)
class FileAdmin(admin.ModelAdmin):
    list_display = ["id", "filename", "purpose", "size", "checksum_short", "status", "owner",
                    "created_at", "expires_at", "linked_batch", "download"]
    list_filter = ["purpose", "status", ("created_at", admin.DateFieldListFilter),
                   ("owner", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["owner"]
    search_fields = ["=id", "filename", "=checksum"]
    date_hierarchy = "created_at"
    list_per_page = 50
    show_full_result_count = False
    readonly_fields = ["id", "filename", "purpose", "size", "bytes", "checksum", "status",
                       "owner", "storage_name", "created_at", "expires_at", "linked_batches",
                       "download"]
    fields = readonly_fields

    def get_queryset(self, request):
        # The newest batch that reads or writes each file, in the list's one query.
        def newest(condition: Q) -> Subquery:
            return Subquery(Batch.objects.filter(condition).order_by("-id").values("id")[:1])

        return super().get_queryset(request).annotate(
            input_of=newest(Q(input_file_id=OuterRef("pk"))),
            output_of=newest(Q(output_file_id=OuterRef("pk")) | Q(error_file_id=OuterRef("pk"))),
        )

    def get_urls(self):
        return [
            path("<path:object_id>/content/", self.admin_site.admin_view(self.content_view),
                 name="files_file_content"),
            *super().get_urls(),
        ]

    def content_view(self, request, object_id: str):
        """The file's bytes, streamed in blocks (memory stays flat for any size)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        file = get_object_or_404(File, id=unquote(object_id))
        try:
            handle = file_open(file=file)
        except NotFound:
            raise Http404(f"The bytes of file {file.id} are gone from storage.") from None
        return FileResponse(handle, as_attachment=True, filename=file.filename,
                            content_type="application/jsonl")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and file_in_active_use(file_id=obj.id):
            return False  # the service would refuse it: offer no button
        return super().has_delete_permission(request, obj)

    @admin.display(description="size", ordering="bytes")
    def size(self, obj: File) -> str:
        return filesizeformat(obj.bytes)

    @admin.display(description="checksum", ordering="checksum")
    def checksum_short(self, obj: File) -> str:
        return format_html('<span title="{}">{}…</span>', obj.checksum, obj.checksum[:23])

    @admin.display(description="batch")
    def linked_batch(self, obj: File) -> str:
        batch_id = getattr(obj, "input_of", None) or getattr(obj, "output_of", None)
        return _batch_link(batch_id) if batch_id else "–"

    @admin.display(description="linked batches")
    def linked_batches(self, obj: File) -> str:
        batches = list(_batches_using(obj.id).values_list("id", "status")[:LINKED_BATCHES_SHOWN])
        if not batches:
            return "–"
        return format_html_join(", ", "{} ({})", ((_batch_link(b), s) for b, s in batches))

    @admin.display(description="download")
    def download(self, obj: File) -> str:
        return format_html('<a class="bg-download" href="{}">download</a>',
                           file_download_url(obj.id))

    # --- deletion through the service ------------------------------------------------------

    def delete_model(self, request, obj: File) -> None:
        try:
            file_delete(file=obj)
        except Conflict as exc:  # a batch started on it since the page was shown
            request._batchgen_delete_refused = True
            self.message_user(request, exc.message, messages.ERROR)

    def delete_queryset(self, request, queryset) -> None:
        for file in queryset:
            try:
                file_delete(file=file)
            except Conflict as exc:
                self.message_user(request, exc.message, messages.WARNING)

    def response_delete(self, request, obj_display, obj_id):
        if getattr(request, "_batchgen_delete_refused", False):
            return HttpResponseRedirect(reverse("admin:files_file_change", args=[quote(obj_id)]))
        return super().response_delete(request, obj_display, obj_id)
