from django.contrib import admin
from django.contrib.staticfiles.views import serve as serve_static
from django.urls import path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerView

from batches.views import (
    BatchCancelView,
    BatchDetailView,
    BatchLineErrorsView,
    BatchListCreateView,
    BatchOutputView,
    PoolStatusView,
)
from batchgen_site.admin_dashboard import pool_dashboard
from batchgen_site.health import HealthView
from batchgen_site.metrics import metrics_view
from files.views import FileContentView, FileDetailView, FileListCreateView
from fleet.views import ModelDetailView, ModelListView
from webhooks.views import (
    EndpointDetailView,
    EndpointListCreateView,
    EndpointRotateSecretView,
    EndpointTestView,
    EventTypeListView,
)

urlpatterns = [
    path("health", HealthView.as_view(), name="health"),
    path("v1/models", ModelListView.as_view(), name="model-list"),
    path("v1/models/<path:model_id>", ModelDetailView.as_view(), name="model-detail"),
    path("v1/files", FileListCreateView.as_view(), name="file-list"),
    path("v1/files/<str:file_id>", FileDetailView.as_view(), name="file-detail"),
    path("v1/files/<str:file_id>/content", FileContentView.as_view(), name="file-content"),
    path("v1/batches", BatchListCreateView.as_view(), name="batch-list"),
    path("v1/batches/<str:batch_id>", BatchDetailView.as_view(), name="batch-detail"),
    path("v1/batches/<str:batch_id>/cancel", BatchCancelView.as_view(), name="batch-cancel"),
    path("v1/batches/<str:batch_id>/output", BatchOutputView.as_view(), name="batch-output"),
    path("v1/batches/<str:batch_id>/errors", BatchLineErrorsView.as_view(), name="batch-errors"),
    path("v1/webhook_endpoints", EndpointListCreateView.as_view(), name="webhook-endpoint-list"),
    path("v1/webhook_endpoints/<str:endpoint_id>", EndpointDetailView.as_view(),
         name="webhook-endpoint-detail"),
    path("v1/webhook_endpoints/<str:endpoint_id>/rotate_secret",
         EndpointRotateSecretView.as_view(), name="webhook-endpoint-rotate-secret"),
    path("v1/webhook_endpoints/<str:endpoint_id>/test", EndpointTestView.as_view(),
         name="webhook-endpoint-test"),
    path("v1/webhook_event_types", EventTypeListView.as_view(), name="webhook-event-types"),
    path("v1/pool/status", PoolStatusView.as_view(), name="pool-status"),
    path("v1/openapi.json", SpectacularJSONAPIView.as_view(), name="openapi"),
    path("docs", SpectacularSwaggerView.as_view(url_name="openapi"), name="docs"),
    path("metrics", metrics_view, name="metrics"),
    path("admin/pool/", admin.site.admin_view(pool_dashboard), name="admin-pool-dashboard"),
    # API keys and their usage moved from batchgen_site to core (issue 29): an
    # operator's bookmark of their admin pages still lands, with its filters.
    re_path(r"^admin/batchgen_site/(?P<rest>.*)$",
            RedirectView.as_view(url="/admin/core/%(rest)s", permanent=True,
                                 query_string=True)),
    # The workers' page moved with the fleet's records from inference to fleet (issue 33).
    re_path(r"^admin/inference/(?P<rest>.*)$",
            RedirectView.as_view(url="/admin/fleet/%(rest)s", permanent=True,
                                 query_string=True)),
    path("admin/", admin.site.urls),
    # The admin's CSS and JS, found in the installed apps: a handful of small files for
    # a few operators, so no collectstatic step or separate static server is needed.
    re_path(r"^static/(?P<path>.*)$", serve_static, {"insecure": True}),
]

handler400 = "core.errors.handler400"
handler404 = "core.errors.handler404"
handler500 = "core.errors.handler500"
