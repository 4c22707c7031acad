"""GET /health: healthy only when the database, the broker and the object store
(BATCHGEN_STORAGE_URL, when set) answer, every served
model has an inference worker alive with its engine ready, and no worker is held up
by a full storage volume."""

from __future__ import annotations

import logging

from django.db import connection
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

logger = logging.getLogger(__name__)


def _first_line(error: Exception) -> str:
    # libpq's messages run on with hints on further lines; the first says what failed.
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def health_problem() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        return f"database unreachable: {_first_line(exc)}"
    try:
        from core.celery import app

        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        return f"broker unreachable: {_first_line(exc)}"
    from files.backends import current as file_store

    try:
        file_store().probe()
    except Exception as exc:
        return f"object store unreachable: {_first_line(exc)}"
    from fleet.selectors import (
        live_workers,
        models_that_cannot_start,
        models_without_ready_worker,
    )

    workers = list(live_workers().values_list("ready", "storage_error"))
    # Each served model, not just one, and named: a model whose engine cannot start
    # leaves its batches waiting while another model's workers look fine.
    unserved = ", ".join(models_without_ready_worker())
    if not workers:
        return f"no inference worker is alive: nothing runs the requests of model {unserved}"
    if not any(ready for ready, _ in workers):
        return (f"{len(workers)} inference worker(s) alive, none with its engine ready yet "
                f"(model {unserved})")
    cannot = models_that_cannot_start()
    if cannot:
        model, why = next(iter(cannot.items()))
        return (f"model {', '.join(cannot)} cannot start on any multiplexing inference "
                f"worker with these settings: its requests wait ({model}: {why})")
    if unserved:
        return (f"no inference worker of model {unserved} is alive with its engine ready: "
                "its requests wait")
    full = [error for _, error in workers if error]
    if full:
        return f"storage full: {len(full)} inference worker(s) cannot write results ({full[0]})"
    return None


class HealthView(APIView):
    authentication_classes: list = []  # load balancers probe without a key
    permission_classes: list = []

    @extend_schema(responses={
        200: inline_serializer("Health", {"status": serializers.CharField()}),
        503: inline_serializer("Unhealthy", {"status": serializers.CharField(),
                                             "reason": serializers.CharField()})},
        operation_id="health")
    def get(self, request):
        problem = health_problem()
        if problem:
            return Response({"status": "unhealthy", "reason": problem}, status=503)
        return Response({"status": "healthy"})
